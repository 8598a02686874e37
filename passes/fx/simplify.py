"""FX clean-ups, computed on the captured program without changing it.

:func:`simplify_program` returns a :class:`Simplifications` that the translator applies while it
walks the graph, so a user's ExportedProgram is never mutated:

- ``dropped``: runtime asserts and shape guards (``_assert_scalar``, ``sym_constrain_range*``,
  ``_assert_tensor_metadata``) and the SymBool/SymInt arithmetic that only feeds them;
- ``aliases``: nodes that return their input (clone, alias, detach, a view/reshape/expand or
  full slice to the same shape, a cast to the same dtype), mapped to that input;
- ``constants``: nodes computed only from parameters, buffers and constants, evaluated with
  torch (a transposed or reshaped weight), unless the result is large and its inputs live on.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.export.graph_signature import InputKind

__all__ = ["Simplifications", "simplify_program"]

aten = torch.ops.aten

_ASSERTS = frozenset(
    {
        aten._assert_scalar.default,
        aten._assert_tensor_metadata.default,
        aten.sym_constrain_range.default,
        aten.sym_constrain_range_for_size.default,
        aten._assert_async.msg,
    }
)
_IDENTITIES = frozenset(
    {aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, aten.contiguous.default}
)
_SAME_SHAPE_VIEWS = frozenset(
    {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default, aten.slice.Tensor}
)
_CASTS = frozenset({aten._to_copy.default, aten.to.dtype})
# Folding a result larger than this is only worth it when its inputs disappear with it.
SMALL_BYTES = 4096


@dataclasses.dataclass
class Simplifications:
    """What the translator skips (``dropped``), reads through (``aliases``) or emits as an
    initializer (``constants``, each with a name derived from the parameter it comes from)."""

    dropped: set[torch.fx.Node] = dataclasses.field(default_factory=set)
    aliases: dict[torch.fx.Node, torch.fx.Node] = dataclasses.field(default_factory=dict)
    constants: dict[torch.fx.Node, tuple[str, torch.Tensor]] = dataclasses.field(default_factory=dict)

    def __contains__(self, node: torch.fx.Node) -> bool:
        return node in self.dropped or node in self.aliases or node in self.constants


def simplify_program(program: torch.export.ExportedProgram, *, fold_constants: bool = True) -> Simplifications:
    """Plan the clean-ups of ``program``'s graph (the program itself is left untouched)."""
    result = Simplifications()
    # Loop bodies and branches too: their nodes are the translator's as much as the main graph's.
    graphs = [module.graph for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)]
    for graph in graphs:
        for node in reversed(graph.nodes):
            if node.op == "call_function" and (node.target in _ASSERTS or (node.users and set(node.users) <= result.dropped)):
                result.dropped.add(node)
        for node in graph.nodes:
            source = _returned_input(node)
            if source is not None and node not in result.dropped:
                result.aliases[node] = result.aliases.get(source, source)
    if fold_constants:
        _fold(program, result)
    return result


def _returned_input(node: torch.fx.Node) -> torch.fx.Node | None:
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    source, target = node.args[0], node.target
    before, after = source.meta.get("val"), node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return None
    if target in _IDENTITIES:
        return source if not node.kwargs.get("memory_format") or before.dtype == after.dtype else None
    if target in _SAME_SHAPE_VIEWS:
        step = node.args[4] if target is aten.slice.Tensor and len(node.args) > 4 else 1
        return source if step == 1 and _same_shape(before, after) else None
    if target in _CASTS:
        return source if before.dtype == after.dtype else None
    return None


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() and all(str(x) == str(y) for x, y in zip(a.shape, b.shape))


def _fold(program: torch.export.ExportedProgram, result: Simplifications) -> None:
    state = {**program.state_dict, **program.constants}
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    known: dict[torch.fx.Node, tuple[str, torch.Tensor]] = {}
    for spec in program.graph_signature.input_specs:
        node = placeholders.get(spec.arg.name)
        if spec.kind in kinds and spec.target not in mutated and node is not None:
            known[node] = (spec.target, state[spec.target])
    for node in program.graph.nodes:
        if node.op != "call_function" or not node.users or node in result.dropped or node in result.aliases:
            continue
        folded = _evaluate(node, known, result.aliases)
        if folded is not None:
            known[node] = folded
            result.constants[node] = folded


def _evaluate(
    node: torch.fx.Node, known: dict[torch.fx.Node, tuple[str, torch.Tensor]], aliases: dict[torch.fx.Node, torch.fx.Node]
) -> tuple[str, torch.Tensor] | None:
    target = node.target
    # Only operators whose eager kernels compute what they mean: not custom ones, such as
    # dynexport's sequence operators, whose tensors stand for something else.
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return None
    if target._schema.is_mutable:
        return None
    if torch.Tag.nondeterministic_seeded in target.tags or not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    inputs = [aliases.get(n, n) for n in node.all_input_nodes]
    if not inputs or any(n not in known for n in inputs) or _has_symbols(node):
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: known[aliases.get(n, n)][1])
    with torch.no_grad():
        value = target(*args, **kwargs)
    if not isinstance(value, torch.Tensor):
        return None
    freed = sum(known[n][1].nbytes for n in set(inputs) if len(n.users) == 1)
    if value.nbytes > max(SMALL_BYTES, freed):
        return None
    name = known[inputs[0]][0]
    return f"{name}.{target.overloadpacket.__name__}", value


def _has_symbols(node: torch.fx.Node) -> bool:
    leaves = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
    return any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in leaves)
