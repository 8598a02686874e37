"""Remove nodes whose outputs nobody reads, and initializers nobody uses."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["remove_dead_code"]


def remove_dead_code(graph: ir.Graph) -> int:
    """Remove dead nodes and unused initializers from ``graph``; return how many nodes went."""
    outputs = {id(v) for v in graph.outputs}
    removed = 0
    for node in reversed(list(graph)):
        if any(v.uses() or id(v) in outputs for v in node.outputs):
            continue
        if any(isinstance(a.value, ir.Graph) for a in node.attributes.values()):
            continue
        graph.remove(node, safe=True)
        removed += 1
    inputs = {id(v) for v in graph.inputs}
    for name, value in list(graph.initializers.items()):
        if not value.uses() and id(value) not in inputs and id(value) not in outputs:
            del graph.initializers[name]
    return removed
