"""Scaled dot-product attention -> Attention (opset 23):
``Softmax(q * scale @ Transpose(k) [+ mask | masked with Where(mask, ., -inf)]) @ v`` on 4-D
(batch, heads, sequence, head size) tensors."""

from __future__ import annotations

import math

import onnx_ir as ir

from dynexport.passes.onnx.values import (
    constant_array,
    constant_scalar,
    insert_replacement,
    nodes_of,
    producer,
    single_consumer,
)

__all__ = ["fuse_attention"]


def fuse_attention(graph: ir.Graph, *, opset: int) -> int:
    """Replace every attention pattern in ``graph`` (of a model at ``opset``); return how many
    (none below opset 23)."""
    if opset < 23:
        return 0
    fused = 0
    for softmax in nodes_of(graph, "Softmax"):
        axis = softmax.attributes["axis"].as_int() if "axis" in softmax.attributes else -1
        output = single_consumer(softmax.outputs[0])
        if axis not in (-1, 3) or output is None or output.op_type != "MatMul" or output.inputs[0] is not softmax.outputs[0]:
            continue
        scores, mask = _unmasked(softmax.inputs[0])
        matmul = producer(scores, "MatMul")
        if matmul is None or single_consumer(scores) is None:
            continue
        transpose = producer(matmul.inputs[1], "Transpose")
        if transpose is None or list(transpose.attributes["perm"].as_ints()) != [0, 1, 3, 2]:
            continue
        q, scale = _scaled(matmul.inputs[0])
        k, v = transpose.inputs[0], output.inputs[1]
        if any(t.shape is None or len(t.shape) != 4 for t in (q, k, v)):
            continue
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        attention = ir.Node("", "Attention", inputs, [ir.AttrFloat32("scale", scale)])
        fused += insert_replacement(graph, output, attention, output.outputs[0])
    return fused


def _unmasked(value: ir.Value) -> tuple[ir.Value, ir.Value | None]:
    """(scores, mask) for ``scores + mask`` or ``Where(mask, scores, -inf)``, else (value, None)."""
    where = producer(value, "Where")
    if where is not None and single_consumer(value) is not None:
        condition, scores, fill = where.inputs
        if constant_scalar(fill) == -math.inf and condition.dtype == ir.DataType.BOOL:
            return scores, condition
    add = producer(value, "Add")
    if add is not None and single_consumer(value) is not None:
        for scores, mask in (add.inputs, add.inputs[::-1]):
            if producer(scores, "MatMul") is not None and mask.dtype == scores.dtype:
                return scores, mask
    return value, None


def _scaled(value: ir.Value) -> tuple[ir.Value, float]:
    """(q, scale) for ``q * scale`` with a constant scalar, else (value, 1.0)."""
    multiply = producer(value, "Mul")
    if multiply is not None and single_consumer(value) is not None:
        for q, factor in (multiply.inputs, multiply.inputs[::-1]):
            number = constant_scalar(factor)
            if number is not None and constant_array(q) is None:
                return q, number
    return value, 1.0
