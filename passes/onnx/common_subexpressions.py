"""Common-subexpression elimination: of two nodes with the same op, attributes and inputs, the
later one goes and its readers read the earlier one's outputs."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from dynexport.passes.onnx.values import NONDETERMINISTIC_OPS

__all__ = ["eliminate_common_subexpressions"]


def eliminate_common_subexpressions(graph: ir.Graph) -> int:
    """Remove repeated computations from ``graph``; return how many nodes went."""
    seen: dict[tuple, ir.Node] = {}
    removed = 0
    for node in list(graph):
        key = _key(node)
        if key is None:
            continue
        earlier = seen.setdefault(key, node)
        if earlier is node or any(v.is_graph_output() for v in node.outputs):
            continue
        for old, new in zip(node.outputs, earlier.outputs):
            old.replace_all_uses_with(new)
        graph.remove(node, safe=True)
        removed += 1
    return removed


def _key(node: ir.Node) -> tuple | None:
    if node.op_type in NONDETERMINISTIC_OPS or any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()
    ):
        return None
    attributes = tuple(sorted((name, _attribute_key(a)) for name, a in node.attributes.items()))
    inputs = tuple(id(v) if v is not None else None for v in node.inputs)
    return node.domain, node.op_type, node.overload, inputs, attributes, len(node.outputs)


def _attribute_key(attribute: ir.Attr) -> Any:
    value = attribute.value
    if attribute.type == ir.AttributeType.TENSOR:
        return (value.dtype, tuple(value.shape), value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value
