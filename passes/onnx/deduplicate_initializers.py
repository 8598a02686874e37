"""Merge initializers that hold the same tensor (same dtype, shape and bytes) into one.

Candidates are grouped by dtype, shape and a sample of their elements, so that a model's
gigabytes of distinct weights are never read whole; only tensors whose samples agree are
compared in full, bit for bit (``-0.0`` is not ``0.0``; a NaN equals the same NaN), a block of
rows at a time so that the comparison allocates little. Two views of the same memory (a tied
embedding and LM head, each an initializer) are the same tensor without reading them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

# Elements read from each tensor to tell most distinct tensors apart.
_SAMPLE = 4096
# Bytes of each tensor compared at a time (the comparison's temporary is a bool per element).
_BLOCK_BYTES = 1 << 22

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
            first = next((f for f, other in kept if _same_bits(other, contents)), None)
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


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` (same dtype and shape) hold the same bits: views of the same
    memory do; otherwise compared a block of leading-axis rows at a time."""
    if a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.strides == b.strides:
        return True
    a, b = _as_bits(a), _as_bits(b)
    if a.ndim == 0 or a.nbytes <= _BLOCK_BYTES:
        return bool(np.array_equal(a, b))
    rows = max(1, _BLOCK_BYTES * a.shape[0] // a.nbytes)
    return all(np.array_equal(a[start : start + rows], b[start : start + rows]) for start in range(0, a.shape[0], rows))


def _as_bits(contents: np.ndarray) -> np.ndarray:
    """``contents`` viewed as unsigned integers of its item size, where one exists (floats then
    compare by bits); other dtypes (strings, bool) as they are."""
    if contents.dtype.kind in "OUSb" or contents.dtype.itemsize not in (1, 2, 4, 8):
        return contents
    return contents.view(f"u{contents.dtype.itemsize}")
