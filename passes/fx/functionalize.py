"""In-place ATen ops, translated as functional ops when no alias can observe the mutation.

torch.export's default IR keeps in-place ops (``relu_``, ``add_``, ``copy_``). ONNX values are
immutable, so the translator emits the op's functional form and lets every later use of the
mutated tensor read the new value. That is only right when nothing else aliases the mutated
tensor: when it is a view, or has views, the whole program must be functionalized by torch
instead (the caller's fallback). This module only analyses; it never changes the graph.
"""

from __future__ import annotations

import operator

import torch

__all__ = ["functional_variant", "inplace_ops_are_local", "mutated_argument"]


def _is_view(node: torch.fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def functional_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The out-of-place overload of an in-place op (``aten.add_.Tensor`` -> ``aten.add.Tensor``)."""
    name = op.overloadpacket.__name__
    if not name.endswith("_") or name.startswith("__"):
        return None
    packet = getattr(getattr(torch.ops, op.namespace), name[:-1], None)
    overload = getattr(packet, op._overloadname, None) if packet is not None else None
    if overload is None or overload._schema.is_mutable:
        return None
    return overload


def mutated_argument(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor an in-place op node writes to (its ``self``), or None for other nodes."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if not target._schema.is_mutable or not node.args:
        return None
    return node.args[0] if isinstance(node.args[0], torch.fx.Node) else None


def inplace_ops_are_local(graph: torch.fx.Graph) -> bool:
    """True when every in-place op of ``graph`` writes its first argument only, has a functional
    form, and writes a tensor that is neither a view nor viewed: then translating it
    functionally and redirecting later uses is exact."""
    for node in graph.nodes:
        if node.op == "get_attr":
            # A cond or while_loop body: torch.export leaves its in-place ops as written.
            owner = graph.owning_module
            attribute = operator.attrgetter(node.target)(owner) if owner is not None else None
            if isinstance(attribute, torch.fx.GraphModule) and not inplace_ops_are_local(attribute.graph):
                return False
            continue
        base = mutated_argument(node)
        if base is None:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
                return False
            continue
        arguments = node.target._schema.arguments
        written = [i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
        if written != [0] or functional_variant(node.target) is None:
            return False
        if _is_view(base) or any(_is_view(user) for user in base.users):
            return False
    return True
