"""The layer-norm formula over the last axis -> LayerNormalization:
``(x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps) * gamma + beta``."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from dynexport.passes.onnx.values import (
    add_initializer,
    constant_array,
    constant_scalar,
    insert_replacement,
    producer,
    single_consumer,
)

__all__ = ["fuse_layer_norm", "reduces_last_axis"]


def fuse_layer_norm(graph: ir.Graph) -> int:
    """Replace every layer-norm formula in ``graph``; return how many."""
    fused = 0
    for divide in list(graph):
        if divide.op_type != "Div" or divide.graph is None:
            continue
        matched = _match(divide)
        if matched is None:
            continue
        x, epsilon = matched
        root, scale, bias = _affine(divide.outputs[0])
        if scale is None:
            if x.shape is None or not isinstance(x.shape[-1], int):
                continue
            scale = add_initializer(graph, np.ones(x.shape[-1], dtype=x.dtype.numpy()), "layer_norm_scale")
        inputs = [x, scale] + ([bias] if bias is not None else [])
        norm = ir.Node("", "LayerNormalization", inputs, [ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", epsilon)])
        fused += insert_replacement(graph, root, norm, root.outputs[0])
    return fused


def reduces_last_axis(node: ir.Node | None, rank: int) -> bool:
    """True for a ReduceMean over the last axis only (of a rank-``rank`` input), keeping dims."""
    if node is None or node.op_type != "ReduceMean":
        return False
    if "keepdims" in node.attributes and not node.attributes["keepdims"].as_int():
        return False
    axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None and "axes" in node.attributes:
        axes = np.array(node.attributes["axes"].as_ints())
    return axes is not None and axes.size == 1 and int(axes.reshape(-1)[0]) in (-1, rank - 1)


def _match(divide: ir.Node) -> tuple[ir.Value, float] | None:
    centered, std = divide.inputs
    subtract = producer(centered, "Sub")
    mean = producer(subtract.inputs[1], "ReduceMean") if subtract is not None else None
    x = subtract.inputs[0] if subtract is not None else None
    if mean is None or mean.inputs[0] is not x or x.shape is None or not reduces_last_axis(mean, len(x.shape)):
        return None
    sqrt = producer(std, "Sqrt")
    add = producer(sqrt.inputs[0], "Add") if sqrt is not None else None
    if add is None:
        return None
    variance, epsilon = add.inputs if constant_scalar(add.inputs[1]) is not None else add.inputs[::-1]
    epsilon = constant_scalar(epsilon)
    variance_mean = producer(variance, "ReduceMean")
    if epsilon is None or not reduces_last_axis(variance_mean, len(x.shape)):
        return None
    square = variance_mean.inputs[0].producer()
    if square is None or not _is_square_of(square, centered):
        return None
    return x, epsilon


def _is_square_of(node: ir.Node, value: ir.Value) -> bool:
    if node.op_type == "Mul":
        return node.inputs[0] is value and node.inputs[1] is value
    return node.op_type == "Pow" and node.inputs[0] is value and constant_scalar(node.inputs[1]) == 2.0


def _affine(normalized: ir.Value) -> tuple[ir.Node, ir.Value | None, ir.Value | None]:
    """The last node of ``normalized * gamma + beta`` (either factor optional) and the two."""
    root, scale, bias = normalized.producer(), None, None
    consumer = single_consumer(normalized)
    if consumer is not None and consumer.op_type == "Mul":
        other = consumer.inputs[1] if consumer.inputs[0] is normalized else consumer.inputs[0]
        if _is_vector(other):
            root, scale, normalized = consumer, other, consumer.outputs[0]
            consumer = single_consumer(normalized)
    if consumer is not None and consumer.op_type == "Add":
        other = consumer.inputs[1] if consumer.inputs[0] is normalized else consumer.inputs[0]
        if _is_vector(other):
            root, bias = consumer, other
    return root, scale, bias


def _is_vector(value: ir.Value) -> bool:
    """A 1-D constant: what LayerNormalization takes as scale and bias."""
    array = constant_array(value)
    return array is not None and array.ndim == 1
