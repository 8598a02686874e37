"""The RMS-norm formula over the last axis -> RMSNormalization (opset 23):
``x * 1 / sqrt(mean(x**2) + eps) * weight`` (or ``x / sqrt(...)``)."""

from __future__ import annotations

import onnx_ir as ir

from dynexport.passes.onnx.patterns import (
    is_square_of,
    last_axis_scale,
    mean_plus_epsilon,
    reduces_last_axis,
    scaled_by_vector,
)
from dynexport.passes.onnx.values import constant_scalar, insert_replacement, nodes_of, single_consumer

__all__ = ["fuse_rms_norm"]


def fuse_rms_norm(graph: ir.Graph, *, opset: int) -> int:
    """Replace every RMS-norm formula in ``graph`` (of a model at ``opset``); return how many
    (none below opset 23)."""
    if opset < 23:
        return 0
    fused = 0
    for sqrt in nodes_of(graph, "Sqrt"):
        matched = _mean_square(sqrt)
        if matched is None:
            continue
        x, epsilon = matched
        normalized = _normalized(sqrt, x)
        if normalized is None:
            continue
        root, scale = scaled_by_vector(normalized.outputs[0]) or (normalized, None)
        if scale is None:
            scale = last_axis_scale(graph, x, "rms_norm_scale")
            if scale is None:
                continue
        norm = ir.Node("", "RMSNormalization", [x, scale], [ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", epsilon)])
        fused += insert_replacement(graph, root, norm, root.outputs[0])
    return fused


def _mean_square(sqrt: ir.Node) -> tuple[ir.Value, float] | None:
    """(x, eps) when ``sqrt`` computes ``sqrt(mean(x**2, last axis) + eps)``."""
    matched = mean_plus_epsilon(sqrt)
    square = matched[0].inputs[0].producer() if matched is not None else None
    if square is None:
        return None
    x = square.inputs[0]
    if not is_square_of(square, x) or x.shape is None or not reduces_last_axis(matched[0], len(x.shape)):
        return None
    return x, matched[1]


def _normalized(sqrt: ir.Node, x: ir.Value) -> ir.Node | None:
    """The node computing ``x / sqrt`` or ``x * (1 / sqrt)``."""
    consumer = single_consumer(sqrt.outputs[0])
    if consumer is None:
        return None
    if consumer.op_type == "Div" and consumer.inputs == (x, sqrt.outputs[0]):
        return consumer
    if consumer.op_type == "Div" and constant_scalar(consumer.inputs[0]) == 1.0 or consumer.op_type == "Reciprocal":
        multiply = single_consumer(consumer.outputs[0])
        if multiply is not None and multiply.op_type == "Mul" and x in multiply.inputs and consumer.outputs[0] in multiply.inputs:
            return multiply
    return None
