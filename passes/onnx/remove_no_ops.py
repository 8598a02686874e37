"""Remove nodes that compute their input: Identity, a Cast to the input's own type, an identity
Transpose, a Pad by nothing, ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``, ``x and True``,
``x or False`` (when the constant broadcasts nothing)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import constant_array, replace_value

__all__ = ["remove_no_ops"]

_NEUTRAL = {"Add": (0, True), "Sub": (0, False), "Mul": (1, True), "Div": (1, False), "And": (1, True), "Or": (0, True)}


def remove_no_ops(graph: ir.Graph) -> int:
    """Bypass and remove every no-op node of ``graph``; return how many went."""
    removed = 0
    for node in list(graph):
        source = _passthrough(node)
        if source is None:
            continue
        if replace_value(node.outputs[0], source):
            graph.remove(node, safe=True)
            removed += 1
    return removed


def _passthrough(node: ir.Node) -> ir.Value | None:
    """The input that ``node`` returns unchanged, if it is a no-op."""
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    op, inputs, attrs = node.op_type, node.inputs, node.attributes
    if op == "Identity":
        return inputs[0]
    if op == "Cast":
        return inputs[0] if inputs[0].dtype == ir.DataType(attrs["to"].as_int()) else None
    if op == "Transpose":
        perm = attrs["perm"].as_ints() if "perm" in attrs else None
        return inputs[0] if perm is not None and list(perm) == sorted(perm) else None
    if op == "Pad":
        pads = constant_array(inputs[1]) if len(inputs) > 1 else None
        return inputs[0] if pads is not None and not pads.any() else None
    if op in _NEUTRAL:
        neutral, commutative = _NEUTRAL[op]
        candidates = [(inputs[0], inputs[1])] + ([(inputs[1], inputs[0])] if commutative else [])
        for data, other in candidates:
            array = constant_array(other)
            if array is not None and _is_neutral(array, neutral, data):
                return data
    return None


def _is_neutral(array: np.ndarray, neutral: int, data: ir.Value) -> bool:
    """True when ``data (op) array`` equals ``data``: ``array`` is all ``neutral`` and its shape
    broadcasts into ``data``'s without growing it."""
    if array.size != 1 or (array.ndim > 0 and (data.shape is None or array.ndim > len(data.shape))):
        return False
    return bool(np.all(array == neutral))
