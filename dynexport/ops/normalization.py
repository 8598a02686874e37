"""Batch (inference), layer, group, instance and RMS normalization."""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.dtypes import to_onnx_dtype
from dynexport.ops._helpers import (
    cast,
    ints,
    only_first_output_used,
    rank,
    reduce,
    reshape,
    scalar_like,
    size_of,
    size_of_dims,
    with_shape,
)
from dynexport.registry import translates

aten = torch.ops.aten

_LOW_PRECISION = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def _in_inference(node: torch.fx.Node) -> bool:
    training = node.args[5] if len(node.args) > 5 else node.kwargs["training"]
    return not training


def _one(ctx, dtype: ir.DataType) -> ir.Value:
    # Scale inputs broadcast unidirectionally, so a single 1 stands for an absent weight.
    return ctx.constant([1], dtype)


def _filled_like(ctx, value: float, like: ir.Value) -> ir.Value:
    return ctx.op.Expand(scalar_like(ctx, value, like), ctx.op.Shape(like))


def _per_channel(ctx, param: ir.Value, input: ir.Value) -> ir.Value:
    """``param`` (one value per channel, dim 1) shaped to broadcast against ``input``."""
    param = cast(ctx, param, input.dtype)
    if rank(input) <= 2:
        return param
    return ctx.op.Unsqueeze(param, ints(ctx, list(range(1, rank(input) - 1))))


def _channel_affine(ctx, normalized, input, weight, bias):
    if weight is not None:
        normalized = ctx.op.Mul(normalized, _per_channel(ctx, weight, input))
    if bias is not None:
        normalized = ctx.op.Add(normalized, _per_channel(ctx, bias, input))
    return normalized


# -- batch norm ----------------------------------------------------------------------------


def _batch_norm_inference(ctx, input, weight, bias, running_mean, running_var, eps):
    if weight is None:
        weight = _filled_like(ctx, 1, running_mean)
    if bias is None:
        bias = _filled_like(ctx, 0, running_mean)
    return ctx.op.BatchNormalization(input, weight, bias, running_mean, running_var, epsilon=eps)


@translates(aten.batch_norm.default, checker=_in_inference)
def batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    return _batch_norm_inference(ctx, input, weight, bias, running_mean, running_var, eps)


@translates(
    aten.native_batch_norm.default,
    checker=lambda node: _in_inference(node) and only_first_output_used(node),
)
def native_batch_norm(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm_inference(ctx, input, weight, bias, running_mean, running_var, eps), None, None


@translates(aten._native_batch_norm_legit_no_training.default, checker=only_first_output_used)
def _native_batch_norm_legit_no_training(ctx, input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_inference(ctx, input, weight, bias, running_mean, running_var, eps), None, None


# -- layer norm ----------------------------------------------------------------------------


def _layer_normalization(ctx, input, normalized_shape, weight, bias, eps, outputs=1):
    scale = None if weight is None else cast(ctx, weight, input.dtype)
    bias = None if bias is None else cast(ctx, bias, input.dtype)
    return _normalized(ctx, input, scale, bias, rank(input) - len(normalized_shape), eps, outputs)


def _normalized(ctx, x, scale, bias, axis: int, eps: float, outputs: int = 1):
    """ONNX LayerNormalization of ``x`` over its dims from ``axis`` (``scale`` None: by 1): the
    result, then (for 3 ``outputs``) the mean and the inverse standard deviation, kept in
    float32 (its stash_type)."""
    if ctx.opset >= 17:
        scale = _one(ctx, x.dtype) if scale is None else scale
        # Not an empty-named B: onnxruntime 1.31's LayerNormalization crashes on one.
        inputs = [x, scale] if bias is None else [x, scale, bias]
        return ctx.op.LayerNormalization(*inputs, axis=axis, epsilon=eps, _outputs=outputs)
    # LayerNormalization exists from opset 17; before it, its two passes written out.
    stash = ir.DataType.FLOAT if x.dtype in _LOW_PRECISION else x.dtype
    axes = list(range(axis, rank(x)))
    wide = cast(ctx, x, stash)
    mean = reduce(ctx, "ReduceMean", wide, axes)
    centered = ctx.op.Sub(wide, mean)
    variance = reduce(ctx, "ReduceMean", ctx.op.Mul(centered, centered), axes)
    inverse_std = ctx.op.Reciprocal(ctx.op.Sqrt(ctx.op.Add(variance, ctx.constant(eps, stash))))
    result = ctx.op.Mul(centered, inverse_std)
    if scale is not None:
        result = ctx.op.Mul(result, cast(ctx, scale, stash))
    if bias is not None:
        result = ctx.op.Add(result, cast(ctx, bias, stash))
    result = cast(ctx, result, x.dtype)
    return result if outputs == 1 else (result, cast(ctx, mean, ir.DataType.FLOAT), cast(ctx, inverse_std, ir.DataType.FLOAT))


@translates(aten.layer_norm.default)
def layer_norm(ctx, input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _layer_normalization(ctx, input, normalized_shape, weight, bias, eps)


@translates(aten.native_layer_norm.default)
def native_layer_norm(ctx, input, normalized_shape, weight, bias, eps):
    out, mean, rstd = _layer_normalization(ctx, input, normalized_shape, weight, bias, eps, outputs=3)
    # ONNX keeps the statistics in float32 (stash_type), PyTorch in the input's dtype.
    stats_dtype = to_onnx_dtype(ctx.out[1].dtype)
    return out, cast(ctx, mean, stats_dtype), cast(ctx, rstd, stats_dtype)


# -- group and instance norm ---------------------------------------------------------------


@translates(aten.group_norm.default)
def group_norm(ctx, input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    # Not GroupNormalization-21: its variance E[x^2] - E[x]^2 cancels catastrophically (NaN)
    # for inputs whose mean is large against their spread; LayerNormalization's is two-pass.
    # (A zero-size spatial dim fails: onnxruntime's LayerNormalization wants a non-empty axis.)
    channels = input.shape[1]
    if isinstance(channels, int):
        # (N, C, *S) as (N, G, C/G, *S) and back, through a leading 1 that keeps every dim but
        # the channels at its place, where a 0 in a Reshape target copies it: constant targets,
        # right at any zero size (where [0, G, -1] is ambiguous to onnxruntime).
        # One group (PoolFormer's and ConvNeXt's channel norm) is that leading 1 itself.
        copied = [0] * (rank(input) - 2)
        grouped = ctx.op.Unsqueeze(input, ints(ctx, [1]))
        if num_groups > 1:
            grouped = ctx.op.Reshape(grouped, ints(ctx, [0, num_groups, channels // num_groups, *copied]))
        grouped = with_shape(grouped, [input.shape[0], num_groups, channels // num_groups, *input.shape[2:]])
        normalized = _normalized(ctx, grouped, None, None, 2, eps)
        if num_groups > 1:
            normalized = ctx.op.Reshape(normalized, ints(ctx, [0, 1, channels, *copied]))
        normalized = ctx.op.Squeeze(normalized, ints(ctx, [1]))
    else:
        per_group = ctx.op.Div(size_of_dims(ctx, input, 1, rank(input)), ctx.constant(num_groups, ir.DataType.INT64))
        grouped = reshape(ctx, input, [size_of(ctx, input, 0), num_groups, per_group])
        grouped = with_shape(grouped, [input.shape[0], num_groups, None])
        normalized = reshape(ctx, _normalized(ctx, grouped, None, None, 2, eps), ctx.op.Shape(input))
    return _channel_affine(ctx, with_shape(normalized, input.shape), input, weight, bias)


@translates(aten.native_group_norm.default, checker=only_first_output_used)
def native_group_norm(ctx, input, weight, bias, N, C, HxW, group, eps):
    return group_norm(ctx, input, group, weight, bias, eps), None, None


@translates(aten.instance_norm.default)
def instance_norm(
    ctx, input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled
):
    if not use_input_stats:
        return _batch_norm_inference(ctx, input, weight, bias, running_mean, running_var, eps)
    # LayerNormalization over dims 2.. rather than InstanceNormalization: onnxruntime has no
    # double kernel for the latter and computes float16 in float16, where PyTorch uses float32.
    normalized = with_shape(_normalized(ctx, input, None, None, 2, eps), input.shape)
    return _channel_affine(ctx, normalized, input, weight, bias)


# -- RMS norm ------------------------------------------------------------------------------


def _rms_eps(input: ir.Value, eps: float | None) -> float:
    if eps is not None:
        return eps
    # PyTorch's default: the machine epsilon of the dtype the statistics are computed in.
    return torch.finfo(torch.float64 if input.dtype == ir.DataType.DOUBLE else torch.float32).eps


@translates(aten.rms_norm.default, min_opset=23)
def rms_norm(ctx, input, normalized_shape, weight=None, eps=None):
    scale = _one(ctx, ctx.out_dtype) if weight is None else cast(ctx, weight, ctx.out_dtype)
    axis = rank(input) - len(normalized_shape)
    return ctx.op.RMSNormalization(input, scale, axis=axis, epsilon=_rms_eps(input, eps))


@translates(aten.rms_norm.default)
def rms_norm_composed(ctx, input, normalized_shape, weight=None, eps=None):
    dtype = ir.DataType.FLOAT if input.dtype in _LOW_PRECISION else input.dtype
    x = cast(ctx, input, dtype)
    axes = list(range(rank(input) - len(normalized_shape), rank(input)))
    mean_square = reduce(ctx, "ReduceMean", ctx.op.Mul(x, x), axes)
    rms = ctx.op.Sqrt(ctx.op.Add(mean_square, ctx.constant(_rms_eps(input, eps), dtype)))
    normalized = ctx.op.Div(x, rms)
    if weight is not None:
        normalized = ctx.op.Mul(normalized, cast(ctx, weight, dtype))
    return cast(ctx, normalized, ctx.out_dtype)
