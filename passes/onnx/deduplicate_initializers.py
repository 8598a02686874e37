"""Merge initializers that hold the same tensor (same dtype, shape and bytes) into one."""

from __future__ import annotations

import hashlib

import onnx_ir as ir

__all__ = ["deduplicate_initializers"]


def deduplicate_initializers(graph: ir.Graph) -> int:
    """Point every reader of a duplicate initializer at the first copy; return how many went."""
    by_layout: dict[tuple, list[ir.Value]] = {}
    for value in graph.initializers.values():
        if value.const_value is None or value.is_graph_input() or value.is_graph_output():
            continue
        by_layout.setdefault((value.dtype, tuple(value.const_value.shape)), []).append(value)
    removed = 0
    for values in by_layout.values():
        if len(values) < 2:
            continue
        first_with: dict[bytes, ir.Value] = {}
        for value in values:
            digest = hashlib.sha256(value.const_value.tobytes()).digest()
            first = first_with.setdefault(digest, value)
            if first is not value:
                value.replace_all_uses_with(first)
                del graph.initializers[value.name]
                removed += 1
    return removed
