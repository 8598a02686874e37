"""Quantization: ``quantized_decomposed`` quantize/dequantize and ATen's fake quantization as
QuantizeLinear/DequantizeLinear, the pattern quantization-aware runtimes recognize.

PyTorch multiplies by ``1 / scale`` where QuantizeLinear divides by ``scale``; both round half to
even, so the two agree except where that one-ulp difference crosses a rounding tie. A
``[quant_min, quant_max]`` narrower than the storage type is a Clip after QuantizeLinear (PyTorch
clamps the same rounded value). Per-axis parameters exist from opset 13, 16-bit storage from
opset 21: below it a 16-bit quantization is a TranslationError that says so.
"""

from __future__ import annotations

import onnx_ir as ir
import torch
import torch.ao.quantization.fx._decomposed  # defines torch.ops.quantized_decomposed

from dynexport.dtypes import to_onnx_dtype
from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import argument, cast, normalize_dim, rank, scalar
from dynexport.registry import translates

aten = torch.ops.aten
quantized_decomposed = torch.ops.quantized_decomposed

_FLOAT = ir.DataType.FLOAT
_RANGES = {
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT16: (0, 65535),
    ir.DataType.INT16: (-32768, 32767),
}
_SIXTEEN_BIT = frozenset({ir.DataType.UINT16, ir.DataType.INT16})
_SIXTEEN_BIT_OPSET = 21


def _storage(quant_min: int, quant_max: int) -> ir.DataType | None:
    """The narrowest QuantizeLinear output type that holds ``[quant_min, quant_max]``."""
    for dtype, (low, high) in _RANGES.items():
        if low <= quant_min and quant_max <= high:
            return dtype
    return None


def _check_opset(ctx, dtype: ir.DataType) -> None:
    if dtype in _SIXTEEN_BIT and ctx.opset < _SIXTEEN_BIT_OPSET:
        raise TranslationError(
            str(ctx.node.target),
            source_line(ctx.node),
            f"{dtype.name.lower()} quantization needs QuantizeLinear/DequantizeLinear of opset "
            f"{_SIXTEEN_BIT_OPSET} or later; the model is exported at opset {ctx.opset}",
            f"export with opset_version={_SIXTEEN_BIT_OPSET} or later, or quantize to 8 bits",
        )


def _quantize(ctx, x, scale, zero_point, quant_min: int, quant_max: int, dtype: ir.DataType, axis=None):
    """QuantizeLinear of ``x`` (computed in float32, as PyTorch does) into ``dtype``, clipped to
    ``[quant_min, quant_max]``; ``axis`` (normalized) for per-channel parameters."""
    _check_opset(ctx, dtype)
    attributes = {} if axis is None else {"axis": axis}
    scale, zero_point = _parameter(ctx, scale, _FLOAT, axis), _parameter(ctx, zero_point, dtype, axis)
    q = ctx.op.QuantizeLinear(cast(ctx, x, _FLOAT), scale, zero_point, **attributes)
    if (quant_min, quant_max) != _RANGES[dtype]:
        q = ctx.op.Clip(q, ctx.constant(quant_min, dtype), ctx.constant(quant_max, dtype))
    return q


def _dequantize(ctx, q, scale, zero_point, dtype: ir.DataType, axis=None):
    """DequantizeLinear of ``q`` in float32, cast to ``dtype``: PyTorch's half-precision
    dequantization rounds the same float32 product."""
    _check_opset(ctx, q.dtype)
    attributes = {} if axis is None else {"axis": axis}
    zero_points = [] if zero_point is None else [_parameter(ctx, zero_point, q.dtype, axis)]
    dequantized = ctx.op.DequantizeLinear(q, _parameter(ctx, scale, _FLOAT, axis), *zero_points, **attributes)
    return cast(ctx, dequantized, dtype)


def _parameter(ctx, value, dtype: ir.DataType, axis) -> ir.Value:
    """A scale or zero point as ``dtype``; per tensor, 0-d (a one-element 1-D one would be read
    as per-axis)."""
    value = scalar(ctx, value, dtype)
    if axis is None and rank(value):
        value = ctx.op.Reshape(value, ctx.constant([], ir.DataType.INT64))
    return value


# -- quantized_decomposed ---------------------------------------------------------------------


def _storable(node: torch.fx.Node) -> bool:
    return to_onnx_dtype(argument(node, "dtype")) in _RANGES


_QUANTIZE = (quantized_decomposed.quantize_per_tensor.default, quantized_decomposed.quantize_per_tensor.tensor)
_DEQUANTIZE = (quantized_decomposed.dequantize_per_tensor.default, quantized_decomposed.dequantize_per_tensor.tensor)


@translates(*_QUANTIZE, checker=_storable)
def quantize_per_tensor(ctx, input, scale, zero_point, quant_min, quant_max, dtype):
    return _quantize(ctx, input, scale, zero_point, quant_min, quant_max, ctx.out_dtype)


@translates(quantized_decomposed.quantize_per_channel.default, checker=_storable)
def quantize_per_channel(ctx, input, scales, zero_points, axis, quant_min, quant_max, dtype):
    axis = normalize_dim(axis, rank(input))
    return _quantize(ctx, input, scales, zero_points, quant_min, quant_max, ctx.out_dtype, axis)


def _dequantizable(node: torch.fx.Node) -> bool:
    return argument(node, "dtype") is torch.int32 or _storable(node)


@translates(*_DEQUANTIZE, checker=_dequantizable)
def dequantize_per_tensor(ctx, input, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    return _dequantize(ctx, input, scale, zero_point, ctx.out_dtype)


@translates(quantized_decomposed.dequantize_per_channel.default, checker=_dequantizable)
def dequantize_per_channel(ctx, input, scales, zero_points, axis, quant_min, quant_max, dtype, *, out_dtype=None):
    return _dequantize(ctx, input, scales, zero_points, ctx.out_dtype, normalize_dim(axis, rank(input)))


@translates(quantized_decomposed.choose_qparams.tensor)
def choose_qparams(ctx, input, quant_min, quant_max, eps, dtype):
    # torch.ao.quantization.utils.determine_qparams for per-tensor affine: the range always
    # includes 0, scale is at least eps, the zero point is clamped into range.
    zero = ctx.constant(0.0, input.dtype)
    low = ctx.op.Min(ctx.op.ReduceMin(input, keepdims=0), zero)
    high = ctx.op.Max(ctx.op.ReduceMax(input, keepdims=0), zero)
    scale = ctx.op.Div(ctx.op.Sub(high, low), ctx.constant(float(quant_max - quant_min), input.dtype))
    scale = ctx.op.Max(cast(ctx, scale, _FLOAT), ctx.constant([eps], _FLOAT))
    offset = cast(ctx, ctx.op.Round(ctx.op.Div(cast(ctx, low, _FLOAT), scale)), ir.DataType.INT32)
    zero_point = ctx.op.Sub(ctx.constant(quant_min, ir.DataType.INT32), offset)
    zero_point = ctx.op.Max(
        ctx.op.Min(zero_point, ctx.constant(quant_max, ir.DataType.INT32)), ctx.constant(quant_min, ir.DataType.INT32)
    )
    return cast(ctx, scale, ir.DataType.DOUBLE), cast(ctx, zero_point, ir.DataType.INT64)


# -- fake quantization ------------------------------------------------------------------------


def _fake_quantizable(node: torch.fx.Node) -> bool:
    zero_point = argument(node, "zero_point")
    if isinstance(zero_point, torch.fx.Node) and zero_point.meta["val"].dtype.is_floating_point:
        return False  # a fractional zero point shifts the grid off the integers
    return _storage(argument(node, "quant_min"), argument(node, "quant_max")) is not None


def _fake_quantize(ctx, self, scale, zero_point, quant_min: int, quant_max: int, axis=None):
    storage = _storage(quant_min, quant_max)
    q = _quantize(ctx, self, scale, zero_point, quant_min, quant_max, storage, axis)
    return _dequantize(ctx, q, scale, zero_point, self.dtype, axis)


_FAKE_PER_TENSOR = (aten.fake_quantize_per_tensor_affine.default, aten.fake_quantize_per_tensor_affine.tensor_qparams)


@translates(*_FAKE_PER_TENSOR, checker=_fake_quantizable)
def fake_quantize_per_tensor_affine(ctx, self, scale, zero_point, quant_min, quant_max):
    return _fake_quantize(ctx, self, scale, zero_point, quant_min, quant_max)


@translates(aten.fake_quantize_per_channel_affine.default, checker=_fake_quantizable)
def fake_quantize_per_channel_affine(ctx, self, scale, zero_point, axis, quant_min, quant_max):
    return _fake_quantize(ctx, self, scale, zero_point, quant_min, quant_max, normalize_dim(axis, rank(self)))
