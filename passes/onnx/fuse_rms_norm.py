"""The RMS-norm formula over the last axis -> RMSNormalization (opset 23):
``x * 1 / sqrt(mean(x**2) + eps) * weight`` (or ``x / sqrt(...)``)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from dynexport.passes.onnx.fuse_layer_norm import reduces_last_axis
from dynexport.passes.onnx.values import (
    add_initializer,
    constant_array,
    constant_scalar,
    insert_replacement,
    producer,
    single_consumer,
)

__all__ = ["fuse_rms_norm"]


def fuse_rms_norm(graph: ir.Graph) -> int:
    """Replace every RMS-norm formula in ``graph``; return how many (none below opset 23)."""
    if graph.opset_imports.get("", 0) < 23:
        return 0
    fused = 0
    for sqrt in list(graph):
        if sqrt.op_type != "Sqrt" or sqrt.graph is None:
            continue
        matched = _mean_square(sqrt)
        if matched is None:
            continue
        x, epsilon = matched
        normalized = _normalized(sqrt, x)
        if normalized is None:
            continue
        root, scale = normalized, None
        consumer = single_consumer(normalized.outputs[0])
        if consumer is not None and consumer.op_type == "Mul":
            other = consumer.inputs[1] if consumer.inputs[0] is normalized.outputs[0] else consumer.inputs[0]
            array = constant_array(other)
            if array is not None and array.ndim == 1:
                root, scale = consumer, other
        if scale is None:
            if x.shape is None or not isinstance(x.shape[-1], int):
                continue
            scale = add_initializer(graph, np.ones(x.shape[-1], dtype=x.dtype.numpy()), "rms_norm_scale")
        norm = ir.Node("", "RMSNormalization", [x, scale], [ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", epsilon)])
        fused += insert_replacement(graph, root, norm, root.outputs[0])
    return fused


def _mean_square(sqrt: ir.Node) -> tuple[ir.Value, float] | None:
    """(x, eps) when ``sqrt`` computes ``sqrt(mean(x**2, last axis) + eps)``."""
    add = producer(sqrt.inputs[0], "Add")
    if add is None:
        return None
    mean, epsilon = add.inputs if constant_scalar(add.inputs[1]) is not None else add.inputs[::-1]
    epsilon = constant_scalar(epsilon)
    mean = producer(mean, "ReduceMean")
    square = mean.inputs[0].producer() if mean is not None else None
    if epsilon is None or square is None:
        return None
    is_pow = square.op_type == "Pow" and constant_scalar(square.inputs[1]) == 2.0
    x = square.inputs[0]
    if not (is_pow or (square.op_type == "Mul" and x is square.inputs[1])) or x.shape is None:
        return None
    return (x, epsilon) if reduces_last_axis(mean, len(x.shape)) else None


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
