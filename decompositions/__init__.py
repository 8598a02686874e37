"""Which operators decompose, and how one node is decomposed.

dynexport does not re-trace the whole program to decompose it. The translator sends each node
whose operator has a rule straight to the table; only a node without a rule (or whose rule
declines it) is decomposed, here, by tracing its decomposition under the program's own fake mode.
Operators inside that decomposition that have rules stay whole; the others decompose further.

The decompositions used are dynexport's of torch.fft's functions (``spectral``: torch's read
sizes as ints), torch's core-ATen table, then torch's wider table (then dynexport's fused ops'
and ``torch.onnx.ops``' ATen references), then the operator's own CompositeImplicitAutograd
kernel. An operator that has a rule is never
decomposed, even where torch has a decomposition for it (``tests/preserved_ops.py`` lists the
ones that matter most and checks each has a rule).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch._decomp import decomposition_table as torch_decompositions
from torch.func import functionalize
from torch.fx.experimental import _config as fx_config
from torch.fx.experimental.proxy_tensor import make_fx

from dynexport.decompositions.fused import FUSED_DECOMPOSITIONS
from dynexport.decompositions.recurrent import recurrent_ops_kept_whole
from dynexport.decompositions.spectral import SPECTRAL_DECOMPOSITIONS, fft_shapes_from_sizes
from dynexport.passes.fx.functionalize import inplace_ops_are_local

__all__ = [
    "Decomposition",
    "decomposition_for",
    "decomposition_table",
    "recurrent_ops_kept_whole",
    "sizes_fixed_since",
    "trace_decomposition",
]

@functools.cache
def _core_table() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    return dict(core_aten_decompositions().items())


def _onnx_ops_table() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """torch.onnx.ops' ONNX operators (RotaryEmbedding-23, Attention-23) as their ATen
    reference, for opsets before theirs; empty until a model has imported torch.onnx.ops."""
    ops = sys.modules.get("torch.onnx.ops")
    return ops.aten_decompositions() if ops is not None else {}


def decomposition_for(target: Any) -> Callable[..., Any] | None:
    """The function that decomposes ``target``, or None when it has none."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    fn = (
        SPECTRAL_DECOMPOSITIONS.get(target) or _core_table().get(target) or torch_decompositions.get(target)
        or FUSED_DECOMPOSITIONS.get(target) or _onnx_ops_table().get(target)
    )
    if fn is not None:
        return fn
    if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"):
        return target.decompose
    return None


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """A node's decomposition: an FX graph whose placeholders stand for ``leaves``."""

    graph: torch.fx.Graph
    leaves: list[torch.fx.Node]


def decomposition_table(has_rule: Callable[[Any], bool]) -> dict[Any, Callable[..., Any]]:
    """torch's decompositions of every operator for which ``has_rule(op)`` is False."""
    table = dict(torch_decompositions)
    table.update(_core_table())
    table.update(SPECTRAL_DECOMPOSITIONS)
    return {op: fn for op, fn in table.items() if not has_rule(op)}


def trace_decomposition(
    node: torch.fx.Node,
    target: Any,
    table: dict[Any, Callable[..., Any]],
    fake_mode: torch._subclasses.FakeTensorMode | None,
) -> Decomposition | None:
    """Trace the decomposition of ``target`` applied to ``node``'s arguments into a small FX
    graph, or return None when ``target`` has none. (``target`` is the node's operator, or the
    functional form of an in-place one.)

    ``table`` (from :func:`decomposition_table`) decomposes the operators inside the
    decomposition that the translation table does not express directly.
    """
    fn = decomposition_for(target)
    if fn is None:
        return None
    # FX's immutable lists and dicts become plain ones: decompositions may change their arguments.
    flat, spec = pytree.tree_flatten(_plain((node.args, node.kwargs)))
    leaves = [leaf for leaf in flat if isinstance(leaf, torch.fx.Node)]

    def run(*traced: Any) -> Any:
        values = iter(traced)
        args, kwargs = pytree.tree_unflatten(
            [next(values) if isinstance(leaf, torch.fx.Node) else leaf for leaf in flat], spec
        )
        result = fn(*args, **kwargs)
        if result is NotImplemented:
            raise _Declined
        # torch.return_types named tuples would be traced as a call; plain tuples are outputs.
        return tuple(result) if isinstance(result, tuple) else result

    examples = [leaf.meta["val"] for leaf in leaves]
    # Size-oblivious, as capture is for an example size of 0 or 1: otherwise a decomposition's
    # broadcast against a dim whose example is 1 gives its result a static 1 (quantile's lerp).
    fake = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with fake, fx_config.patch(backed_size_oblivious=True), fft_shapes_from_sizes():
        try:
            graph = make_fx(run, decomposition_table=table)(*examples).graph
            if not inplace_ops_are_local(graph):
                # A decomposition that writes through views (e.g. diagonal(out).copy_(src)):
                # only a functionalized trace translates exactly.
                graph = make_fx(functionalize(run), decomposition_table=table)(*examples).graph
        except _Declined:
            return None
        except RuntimeError as error:
            if "functionaliz" not in str(error):
                raise
            return None
    if not inplace_ops_are_local(graph):
        return None
    if any(inner.target is target for inner in graph.nodes):
        return None  # the operator's kernel calls the operator itself (sym_storage_offset)
    return Decomposition(graph, leaves)


def sizes_fixed_since(shape_env: Any, replaced_before: dict[Any, Any]) -> dict[Any, int]:
    """The sizes of the program ``shape_env`` has fixed to a number since it had the replacements
    ``replaced_before``: tracing code that reads them as ints (a C++ kernel's ``sizes()``, a
    Python ``int(size)``) makes the shared shape environment replace their symbols by the
    example's values, and every shape of the program with them."""
    if shape_env is None or len(shape_env.replacements) == len(replaced_before):
        return {}
    return {
        symbol: int(value)
        for symbol, value in shape_env.replacements.items()
        if symbol not in replaced_before and value.is_number
    }


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Declined(Exception):
    """A decomposition returned NotImplemented for these arguments (e.g. uneven pooling bins)."""
