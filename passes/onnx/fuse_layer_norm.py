"""The layer-norm formula over the last axis -> LayerNormalization (opset 17):
``(x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps) * gamma + beta``."""

from __future__ import annotations

import onnx_ir as ir

from dynexport.passes.onnx.patterns import (
    is_square_of,
    last_axis_scale,
    mean_plus_epsilon,
    reduces_last_axis,
    scaled_by_vector,
)
from dynexport.passes.onnx.values import insert_replacement, nodes_of, producer

__all__ = ["fuse_layer_norm"]


def fuse_layer_norm(graph: ir.Graph, *, opset: int) -> int:
    """Replace every layer-norm formula in ``graph`` (of a model at ``opset``); return how many
    (none below opset 17)."""
    if opset < 17:
        return 0
    fused = 0
    for divide in nodes_of(graph, "Div"):
        matched = _match(divide)
        if matched is None:
            continue
        x, epsilon = matched
        root, scale, bias = _affine(divide.outputs[0])
        if scale is None:
            scale = last_axis_scale(graph, x, "layer_norm_scale")
            if scale is None:
                continue
        inputs = [x, scale] + ([bias] if bias is not None else [])
        norm = ir.Node("", "LayerNormalization", inputs, [ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", epsilon)])
        fused += insert_replacement(graph, root, norm, root.outputs[0])
    return fused


def _match(divide: ir.Node) -> tuple[ir.Value, float] | None:
    centered, std = divide.inputs
    subtract = producer(centered, "Sub")
    mean = producer(subtract.inputs[1], "ReduceMean") if subtract is not None else None
    x = subtract.inputs[0] if subtract is not None else None
    if mean is None or mean.inputs[0] is not x or x.shape is None or not reduces_last_axis(mean, len(x.shape)):
        return None
    matched = mean_plus_epsilon(producer(std, "Sqrt"))
    if matched is None or not reduces_last_axis(matched[0], len(x.shape)):
        return None
    variance_mean, epsilon = matched
    if not is_square_of(variance_mean.inputs[0].producer(), centered):
        return None
    return x, epsilon


def _affine(normalized: ir.Value) -> tuple[ir.Node, ir.Value | None, ir.Value | None]:
    """The last node of ``normalized * gamma + beta`` (either factor optional) and the two."""
    root, scale, bias = normalized.producer(), None, None
    scaled = scaled_by_vector(normalized)
    if scaled is not None:
        root, scale = scaled
        normalized = root.outputs[0]
    shifted = scaled_by_vector(normalized, "Add")
    if shifted is not None:
        root, bias = shifted
    return root, scale, bias
