"""Merge initializers that hold the same tensor (same dtype, shape and bytes) into one.

Candidates are grouped by dtype, shape and a sample of their elements, so that a model's
gigabytes of distinct weights are never read whole; only tensors whose samples agree are
compared in full.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

# Elements read from each tensor to tell most distinct tensors apart.
_SAMPLE = 4096

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
        by_sample: dict[bytes, list[tuple[ir.Value, np.ndarray]]] = {}
        for value in values:
            contents = value.const_value.numpy()
            kept = by_sample.setdefault(_sample(contents), [])
            first = next((f for f, other in kept if np.array_equal(other, contents)), None)
            if first is None:
                kept.append((value, contents))
                continue
            value.replace_all_uses_with(first)
            del graph.initializers[value.name]
            removed += 1
    return removed


def _sample(contents: np.ndarray) -> bytes:
    """Up to _SAMPLE evenly spaced elements, read without copying the tensor (a folded weight
    may be a transposed view)."""
    if contents.size <= _SAMPLE:
        return np.ascontiguousarray(contents).tobytes()
    flat_positions = np.linspace(0, contents.size - 1, _SAMPLE, dtype=np.int64)
    return contents[np.unravel_index(flat_positions, contents.shape)].tobytes()
