"""``dynamo=False``: does torch.jit.trace record the same graph at other sizes of the dims
declared dynamic?

torch.jit.trace records the operations one call ran. A Python loop over a size unrolls to the
example's count (ultralytics' ``NMSModel`` loops over the batch), a branch on a size keeps the
example's side, a size read as a Python number becomes a constant: no error, and the graph,
exported with that dim dynamic, is wrong at every other size (torch.onnx's TorchScript exporter
writes such graphs). Here the model is traced again with each group of dynamic dims doubled —
dims of equal example size grow together (a batch several inputs share, a sequence of ids and
mask), each input repeated along them so that its values stay valid — and the two graphs are
compared node by node after dead-code elimination: kinds, wiring and constants. A difference
refuses the export, naming the dims and the model line where the traces part. A group whose
retrace fails (a dim the model ties to another of a different size) is not checked. It is a test
at one other size, not a proof.
"""

from __future__ import annotations

import linecache
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from dynexport.dim_names import declared_dims, is_dynamic
from dynexport.errors import TracedSizesError
from dynexport.torchscript.convert import trace

__all__ = ["check_trace_holds_at_other_sizes"]

_FRAME = re.compile(r"^(.*)\((\d+)\): (\S+)$")
_LIBRARY_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}dynexport{os.sep}")


def check_trace_holds_at_other_sizes(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: Any,
    bound: dict[str, Any],
    dim_labels: dict[tuple[str, int], str],
) -> None:
    """Trace ``model`` at the call ``(args, kwargs)`` and again with each group of the dynamic dims
    of ``dynamic_shapes`` (over the traced arguments ``bound``, which hold the call's tensors)
    doubled; ``dim_labels`` names dims by (path, axis).

    Raises:
        TracedSizesError: a retrace differs from the example's trace.
    """
    groups: dict[int, list[tuple[torch.Tensor, int, str]]] = {}
    for path, axis, dim, tensor in declared_dims(dynamic_shapes, bound):
        if is_dynamic(dim) and tensor.shape[axis] > 0:
            label = dim_labels.get((path, axis)) or getattr(dim, "__name__", None) or f"{path}.shape[{axis}]"
            groups.setdefault(tensor.shape[axis], []).append((tensor, axis % tensor.dim(), label))
    if not groups:
        return
    example_graph, example = _structure(_quiet_trace(model, args, kwargs))  # the graph keeps its nodes alive
    for size, members in groups.items():
        grown = _grown(members)
        grown_args, grown_kwargs = pytree.tree_map_only(torch.Tensor, lambda t: grown.get(id(t), t), (args, kwargs))
        try:
            other_graph, other = _structure(_quiet_trace(model, grown_args, grown_kwargs))
        except Exception:  # sizes the model does not take alone: this group stays unchecked
            continue
        difference = _first_difference(example, other)
        if difference is not None:
            labels = list(dict.fromkeys(label for _, _, label in members))
            raise TracedSizesError(labels, f"{2 * size} instead of {size}", *difference)


def _grown(members: list[tuple[torch.Tensor, int, str]]) -> dict[int, torch.Tensor]:
    """Each member tensor repeated twice along its axes of the group, by ``id`` of the original."""
    grown: dict[int, torch.Tensor] = {}
    for tensor, axis, _ in members:
        current = grown.get(id(tensor), tensor)
        grown[id(tensor)] = torch.cat([current, current], dim=axis)
    return grown


def _quiet_trace(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings: the first trace already gave them
        traced, _, _ = trace(model, args, kwargs)
    return traced


def _structure(traced: torch.jit.ScriptModule) -> tuple[torch._C.Graph, list[tuple[Any, ...]]]:
    """The traced graph, inlined and without dead code, and one entry per node: its kind, where
    its inputs come from, its constant value, and the node (for its source line; valid while the
    graph lives)."""
    graph = traced.inlined_graph
    torch._C._jit_pass_dce(graph)
    origin = {value.unique(): f"input {i}" for i, value in enumerate(graph.inputs())}
    entries = []
    for index, node in enumerate(_nodes(graph.block())):
        sources = tuple(origin.get(value.unique(), "outside") for value in node.inputs())
        entries.append((node.kind(), sources, _constant(node), node))
        for j, value in enumerate(node.outputs()):
            origin[value.unique()] = f"node {index} output {j}"
    entries.append(("return", tuple(origin.get(v.unique(), "outside") for v in graph.outputs()), None, None))
    return graph, entries


def _nodes(block: torch._C.Block) -> Iterator[torch._C.Node]:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def _constant(node: torch._C.Node) -> Any:
    if node.kind() != "prim::Constant" or node.outputsSize() != 1:
        return None
    try:
        value = node.output().toIValue()
    except RuntimeError:
        return None
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.cpu().numpy().tobytes())
    return repr(value)


def _first_difference(
    example: list[tuple[Any, ...]], other: list[tuple[Any, ...]]
) -> tuple[str, str | None] | None:
    """(what differs, the model line) at the first node where the traces part, or None."""
    counts = f"{len(other) - 1} operations, {len(example) - 1} in the example's trace"
    for index, ((kind, sources, constant, node), (other_kind, other_sources, other_constant, other_node)) in enumerate(
        zip(example, other)
    ):
        if kind != other_kind:
            found = f"{_short(other_kind)} where the example's trace has {_short(kind)}"
        elif constant != other_constant:
            found = f"the constant {_shown(other_constant)} where the example's trace has {_shown(constant)}"
        elif sources != other_sources:
            found = f"{_short(kind)} reading other values"
        else:
            continue
        lines = (_source(n) for n in (other_node, node, *(entry[3] for entry in reversed(example[:index]))))
        found += f" ({counts})" if len(example) != len(other) else ""
        return found, next((line for line in lines if line), None)
    if len(example) != len(other):
        return counts, None
    return None


def _short(kind: str) -> str:
    return "the output" if kind == "return" else kind


def _shown(constant: Any) -> str:
    return f"a tensor of shape {list(constant[2])}" if isinstance(constant, tuple) else str(constant)


def _source(node: torch._C.Node | None) -> str | None:
    """The innermost frame of ``node``'s recorded stack outside torch and dynexport, as
    ``file, line N, in function: code``."""
    if node is None:
        return None
    for line in node.sourceRange().splitlines():
        frame = _FRAME.match(line.strip())
        if frame and not any(part in frame.group(1) for part in _LIBRARY_PARTS):
            path, number, function = frame.group(1), int(frame.group(2)), frame.group(3)
            code = linecache.getline(path, number).strip()
            return f'File "{path}", line {number}, in {function}' + (f": {code}" if code else "")
    return None
