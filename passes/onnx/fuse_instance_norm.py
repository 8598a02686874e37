"""Instance and group norm (a normalization over every dim from 2, with one scale for all) made
fast in onnxruntime, at every opset.

From opset 17 the op rules write them, and layer norm without affine, as LayerNormalization
with a one-element scale, which onnxruntime runs 4.5x slower than with a scale of the
normalized shape (0.20 ms against 0.045 ms over the last two dims of 2x16x64x64, float32, one
thread). Where the normalized dims are static, the scale is written out at that shape. Where
they are dynamic (instance norm over an image of any size, group norm over its grouped reshape)
and the normalization covers every dim from 2, the node and the per-channel scale and shift
that follow it become InstanceNormalization, as fast again. Below opset 17 the rules write the
formula, ``(x - mean) * Reciprocal(Sqrt(mean((x - mean)**2) + eps))``, which becomes the same.

onnxruntime's InstanceNormalization computes ``x * s + (b - mean * s)`` with ``s = scale /
std``: both terms are large where the mean is large against the spread, and their sum cancels
to 1.1-6.4x the error of eager float32 PyTorch there (whose own comes from rounding the mean:
7.0e-3 from float64 on ``1000 + 0.05·randn``, eager 1.5e-3), float rounding, as torch.onnx's
graph has it. ``shifted=True`` (``dynexport.export(exact_norms=True)``) feeds it x minus its
first element per channel instead, whose mean is then within ``sqrt(n)`` deviations of 0
whatever x's: within 1e-6 of float64, for a Slice and a Sub more (0.040 ms against 0.029 ms at
that shape; centering by the mean, 0.047 ms).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.patterns import is_square_of, mean_plus_epsilon, per_channel_operand
from dynexport.passes.onnx.values import (
    add_initializer,
    constant_array,
    insert_replacement,
    nodes_of,
    producer,
    single_consumer,
)

__all__ = ["fuse_instance_norm"]

# A written-out scale is kept this small; a larger normalized shape goes to InstanceNormalization.
_MAX_SCALE_BYTES = 64 * 1024


def fuse_instance_norm(graph: ir.Graph, *, shifted: bool = False) -> int:
    """Give each eligible LayerNormalization a full scale, or rewrite it (with its channel
    affine) as InstanceNormalization (of x less its first element per channel, ``shifted``);
    rewrite each written-out normalization over the dims from 2 the same way; return how many."""
    fused = 0
    for norm in nodes_of(graph, "LayerNormalization"):
        x, scale = norm.inputs[0], constant_array(norm.inputs[1])
        rank = len(x.shape) if x.shape is not None else 0
        axis = (norm.attributes["axis"].as_int() if "axis" in norm.attributes else -1) % max(rank, 1)
        if rank < 2 or scale is None or scale.size != 1 or norm.outputs[0].dtype != ir.DataType.FLOAT:
            continue
        normalized = list(x.shape[axis:])
        if all(isinstance(d, int) for d in normalized) and math.prod(normalized) * 4 <= _MAX_SCALE_BYTES:
            full = add_initializer(graph, np.full(normalized, scale.reshape(-1)[0], np.float32), "layer_norm_scale")
            norm.replace_input_with(1, full)
            fused += 1
        elif axis == 2 and _is_filled(norm.inputs[1], 1.0) and _has_no_bias(norm) and not _statistics_read(norm):
            epsilon = norm.attributes["epsilon"].as_float() if "epsilon" in norm.attributes else 1e-5
            fused += _as_instance_norm(graph, norm.outputs[0], x, epsilon, shifted)
    for sqrt in nodes_of(graph, "Sqrt"):
        matched = _written_out_normalization(sqrt)
        if matched is not None:
            fused += _as_instance_norm(graph, *matched, shifted)
    return fused


def _has_no_bias(norm: ir.Node) -> bool:
    return len(norm.inputs) < 3 or norm.inputs[2] is None or _is_filled(norm.inputs[2], 0.0)


def _statistics_read(norm: ir.Node) -> bool:
    """True when the mean or inverse deviation output of ``norm`` is read."""
    return any(v.uses() or v.is_graph_output() for v in norm.outputs[1:])


def _written_out_normalization(sqrt: ir.Node) -> tuple[ir.Value, ir.Value, float] | None:
    """(the normalized value, x, eps) where ``sqrt`` is the deviation of
    ``centered / sqrt(mean(centered**2) + eps)`` (a Div, or a Mul by its Reciprocal), with
    ``centered = x - mean(x)``, both means over every dim of x from 2."""
    matched = mean_plus_epsilon(sqrt)
    if matched is None:
        return None
    variance, epsilon = matched
    normalizing = single_consumer(sqrt.outputs[0])
    if normalizing is not None and normalizing.op_type == "Reciprocal":
        inverse = normalizing.outputs[0]
        normalizing = single_consumer(inverse)
        if normalizing is None or normalizing.op_type != "Mul":
            return None
        centered = normalizing.inputs[1] if normalizing.inputs[0] is inverse else normalizing.inputs[0]
    elif normalizing is not None and normalizing.op_type == "Div" and normalizing.inputs[1] is sqrt.outputs[0]:
        centered = normalizing.inputs[0]
    else:
        return None
    subtract = producer(centered, "Sub")
    mean = producer(subtract.inputs[1], "ReduceMean") if subtract is not None else None
    if mean is None or mean.inputs[0] is not subtract.inputs[0] or not is_square_of(variance.inputs[0].producer(), centered):
        return None
    x = subtract.inputs[0]
    if x.shape is None or not all(_reduces_dims_from_2(node, len(x.shape)) for node in (mean, variance)):
        return None
    return normalizing.outputs[0], x, epsilon


def _reduces_dims_from_2(node: ir.Node, rank: int) -> bool:
    """True for a ReduceMean over dims 2 to ``rank`` - 1 of its input (axes as an input or an
    attribute), keeping them."""
    if "keepdims" in node.attributes and not node.attributes["keepdims"].as_int():
        return False
    axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None and "axes" in node.attributes:
        axes = np.array(node.attributes["axes"].as_ints())
    return rank >= 3 and axes is not None and sorted(int(a) % rank for a in axes.reshape(-1)) == list(range(2, rank))


def _as_instance_norm(graph: ir.Graph, normalized: ir.Value, x: ir.Value, epsilon: float, shifted: bool) -> bool:
    """Replace ``normalized`` (``x`` normalized over its dims from 2) and the per-channel scale
    and shift after it by InstanceNormalization of x (``shifted``: less its first element)."""
    rank, channels = len(x.shape), x.shape[1]
    if not isinstance(channels, int) or normalized.dtype != ir.DataType.FLOAT:
        return False
    last, scale, shift = normalized.producer(), np.ones(channels, np.float32), np.zeros(channels, np.float32)
    affine = per_channel_operand(last.outputs[0], "Mul", channels, rank)
    if affine is not None:
        last, scale = affine
    affine = per_channel_operand(last.outputs[0], "Add", channels, rank)
    if affine is not None:
        last, shift = affine
    shifting = _first_element_subtracted(graph, x) if shifted else []
    if shifting:
        for node in shifting:
            node.metadata_props.update(normalized.producer().metadata_props)
        graph.insert_before(last, shifting)
    parameters = [
        add_initializer(graph, scale.astype(np.float32), "instance_norm_scale"),
        add_initializer(graph, shift.astype(np.float32), "instance_norm_bias"),
    ]
    epsilon_attribute = ir.AttrFloat32("epsilon", epsilon)
    normalizing = shifting[-1].outputs[0] if shifting else x
    instance = ir.Node("", "InstanceNormalization", [normalizing, *parameters], [epsilon_attribute])
    if insert_replacement(graph, last, instance, last.outputs[0]):
        return True
    if shifting:
        graph.remove(list(reversed(shifting)))
    return False


def _first_element_subtracted(graph: ir.Graph, x: ir.Value) -> list[ir.Node]:
    """A Slice of ``x``'s first element per channel and the Sub of it from ``x``: rather than
    its mean, as accurate (the shifted mean is within sqrt(n) deviations of 0) and faster, one
    pass over x fewer."""
    rest = list(range(2, len(x.shape)))
    starts, ends, axes = (
        add_initializer(graph, np.array(v, np.int64), name)
        for v, name in (([0] * len(rest), "first_starts"), ([1] * len(rest), "first_ends"), (rest, "first_axes"))
    )
    first = ir.Node("", "Slice", [x, starts, ends, axes])
    return [first, ir.Node("", "Sub", [x, first.outputs[0]])]


def _is_filled(value: ir.Value | None, number: float) -> bool:
    array = constant_array(value)
    return array is not None and bool(np.all(array == number))
