"""Turn in-place ATen ops into their functional forms where no alias can observe the mutation.

torch.export's default IR keeps in-place ops (``relu_``, ``add_``, ``copy_``). ONNX values are
immutable, so a mutation is translated as a new value that every later use reads instead. That
is only right when nothing else aliases the mutated tensor: when the tensor is a view, or has
views, the whole program must be functionalized by torch instead (the caller's fallback).
"""

from __future__ import annotations

import torch

__all__ = ["functional_variant", "functionalize_inplace"]


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
    namespace = getattr(torch.ops, op.namespace)
    packet = getattr(namespace, name[:-1], None)
    overload = getattr(packet, op._overloadname, None) if packet is not None else None
    if overload is None or overload._schema.is_mutable:
        return None
    return overload


def functionalize_inplace(graph: torch.fx.Graph) -> bool:
    """Rewrite every in-place op of ``graph`` to its functional form.

    Returns False, leaving the graph unchanged, when some mutation could be seen through an
    alias (a view of the mutated tensor, or the tensor being a view itself).
    """
    nodes = list(graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    rewrites = []
    for node in nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable:
            continue
        arguments = target._schema.arguments
        mutated = [
            i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
        ]
        functional = functional_variant(target)
        if mutated != [0] or functional is None or not node.args:
            return False
        base = node.args[0]
        if not isinstance(base, torch.fx.Node) or _is_view(base):
            return False
        if any(_is_view(user) for user in base.users):
            return False
        rewrites.append((node, functional))
    for node, functional in rewrites:
        base = node.args[0]
        for user in list(base.users):
            if user is not node and position[user] > position[node]:
                user.replace_input_with(base, node)
        node.target = functional
    return True
