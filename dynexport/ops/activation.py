"""Activation functions, softmax and log-softmax (tanh lives with the elementwise math)."""

from __future__ import annotations

import math

import onnx_ir as ir
import torch

from dynexport.ops import _float64 as float64
from dynexport.ops._helpers import (
    bfloat16_as_float,
    cast,
    ints,
    normalize_dim,
    only_first_output_used,
    rank,
    scalar_like,
    split_equally,
)
from dynexport.registry import Promote, translates

aten = torch.ops.aten

# ONNX Relu has no unsigned or bool kernel type; relu is the identity on them.
_NON_NEGATIVE = frozenset({ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64, ir.DataType.BOOL})

# ONNX Elu, Selu, HardSigmoid, HardSwish, Mish and Softplus take bfloat16 only from opset 22.
# onnxruntime has no float64 kernel for them, nor for LeakyRelu, PRelu, Celu and Gelu: at
# float64 those are written out in ops it has.
_DOUBLE = ir.DataType.DOUBLE


@translates(aten.relu.default)
def relu(ctx, self):
    if self.dtype in _NON_NEGATIVE:
        return self
    if self.dtype.is_integer() and ctx.opset < 14:
        # Relu takes integers from opset 14; onnxruntime's Max none narrower than 32 bits.
        wide = cast(ctx, self, ir.DataType.INT32) if self.dtype.itemsize < 4 else self
        return cast(ctx, ctx.op.Max(wide, scalar_like(ctx, 0, wide)), self.dtype)
    # onnxruntime has no int16 or int64 Relu.
    if self.dtype == ir.DataType.INT16:
        return cast(ctx, ctx.op.Relu(cast(ctx, self, ir.DataType.INT32)), self.dtype)
    if self.dtype == ir.DataType.INT64:
        return ctx.op.Max(self, scalar_like(ctx, 0, self))
    return ctx.op.Relu(self)


@translates(aten.hardtanh.default)
def hardtanh(ctx, self, min_val=-1, max_val=1):
    # Max/Min instead of Clip: they propagate NaN as PyTorch does.
    return ctx.op.Min(ctx.op.Max(self, scalar_like(ctx, min_val, self)), scalar_like(ctx, max_val, self))


@translates(aten.sigmoid.default, promote=Promote.RESULT, promoted=("self",))
def sigmoid(ctx, self):
    return ctx.op.Sigmoid(self)


@translates(aten.silu.default)
def silu(ctx, self):
    return ctx.op.Mul(self, ctx.op.Sigmoid(self))


@translates(aten.gelu.default, min_opset=20)
def gelu(ctx, self, *, approximate="none"):
    if self.dtype == _DOUBLE:
        return gelu_composed(ctx, self, approximate=approximate)
    return ctx.op.Gelu(self, approximate=approximate)


@translates(aten.gelu.default)
def gelu_composed(ctx, self, *, approximate="none"):
    if approximate == "tanh":
        cube = ctx.op.Mul(ctx.op.Mul(self, self), self)
        inner = ctx.op.Add(self, ctx.op.Mul(cube, scalar_like(ctx, 0.044715, self)))
        inner = ctx.op.Mul(inner, scalar_like(ctx, math.sqrt(2 / math.pi), self))
        gate = ctx.op.Tanh(inner)
    else:
        scaled = ctx.op.Mul(self, scalar_like(ctx, math.sqrt(0.5), self))
        gate = float64.erf(ctx, scaled) if self.dtype == _DOUBLE else ctx.op.Erf(scaled)
    half_x = ctx.op.Mul(self, scalar_like(ctx, 0.5, self))
    return ctx.op.Mul(half_x, ctx.op.Add(gate, scalar_like(ctx, 1.0, self)))


def _softplus(ctx, x: ir.Value) -> ir.Value:
    if x.dtype != _DOUBLE:
        return ctx.op.Softplus(x)
    # log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)): exp never overflows.
    zero = scalar_like(ctx, 0, x)
    tail = ctx.op.Log(ctx.op.Add(scalar_like(ctx, 1, x), ctx.op.Exp(ctx.op.Neg(ctx.op.Abs(x)))))
    return ctx.op.Add(ctx.op.Max(x, zero), tail)


@translates(aten.softplus.default)
@bfloat16_as_float
def softplus(ctx, self, beta=1, threshold=20):
    scaled = self if beta == 1 else ctx.op.Mul(self, scalar_like(ctx, beta, self))
    smooth = _softplus(ctx, scaled)
    if beta != 1:
        smooth = ctx.op.Div(smooth, scalar_like(ctx, beta, self))
    # ONNX Softplus has no threshold: PyTorch returns the input itself where beta * x > threshold.
    return ctx.op.Where(ctx.op.Greater(scaled, scalar_like(ctx, threshold, self)), self, smooth)


@translates(aten.leaky_relu.default)
def leaky_relu(ctx, self, negative_slope=0.01):
    if self.dtype == _DOUBLE:
        return _prelu_kernel(ctx, self, scalar_like(ctx, negative_slope, self))
    return ctx.op.LeakyRelu(self, alpha=float(negative_slope))


@translates(aten.hardswish.default, min_opset=14)
@bfloat16_as_float
def hardswish(ctx, self):
    if self.dtype == _DOUBLE:
        return hardswish_composed(ctx, self)
    return ctx.op.HardSwish(self)


@translates(aten.hardswish.default)
@bfloat16_as_float
def hardswish_composed(ctx, self):
    return ctx.op.Mul(self, hardsigmoid(ctx, self))


@translates(aten.hardsigmoid.default)
@bfloat16_as_float
def hardsigmoid(ctx, self):
    if self.dtype == _DOUBLE:
        line = ctx.op.Add(ctx.op.Mul(self, scalar_like(ctx, 1 / 6, self)), scalar_like(ctx, 0.5, self))
        return ctx.op.Min(ctx.op.Max(line, scalar_like(ctx, 0, self)), scalar_like(ctx, 1, self))
    return ctx.op.HardSigmoid(self, alpha=1 / 6, beta=0.5)


@translates(aten.elu.default)
@bfloat16_as_float
def elu(ctx, self, alpha=1, scale=1, input_scale=1):
    if input_scale == 1 and self.dtype != _DOUBLE:
        result = ctx.op.Elu(self, alpha=float(alpha))
    else:
        exp = ctx.op.Exp(ctx.op.Mul(self, scalar_like(ctx, input_scale, self)))
        negative = ctx.op.Mul(ctx.op.Sub(exp, scalar_like(ctx, 1, self)), scalar_like(ctx, alpha, self))
        result = ctx.op.Where(ctx.op.Greater(self, scalar_like(ctx, 0, self)), self, negative)
    if scale != 1:
        result = ctx.op.Mul(result, scalar_like(ctx, scale, self))
    return result


@translates(aten.selu.default)
@bfloat16_as_float
def selu(ctx, self):
    if self.dtype == _DOUBLE:
        return elu(ctx, self, _SELU_ALPHA, _SELU_SCALE)
    # ONNX Selu's default alpha and gamma are PyTorch's constants.
    return ctx.op.Selu(self)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@translates(aten.celu.default)
def celu(ctx, self, alpha=1.0):
    if self.dtype == ir.DataType.FLOAT:
        return ctx.op.Celu(self, alpha=float(alpha))
    # ONNX Celu is float32-only; PyTorch itself computes celu as elu with input_scale=1/alpha.
    return elu(ctx, self, alpha, 1, 1 / alpha)


@translates(aten.mish.default, min_opset=18)
@bfloat16_as_float
def mish(ctx, self):
    if self.dtype == _DOUBLE:
        return mish_composed(ctx, self)
    return ctx.op.Mish(self)


@translates(aten.mish.default)
@bfloat16_as_float
def mish_composed(ctx, self):
    return ctx.op.Mul(self, ctx.op.Tanh(_softplus(ctx, self)))


@translates(aten.log_sigmoid.default)
@bfloat16_as_float
def log_sigmoid(ctx, self):
    # Softplus is evaluated stably by onnxruntime, so -softplus(-x) keeps large |x| finite.
    return ctx.op.Neg(_softplus(ctx, ctx.op.Neg(self)))


@translates(aten.log_sigmoid_forward.default, checker=only_first_output_used)
def log_sigmoid_forward(ctx, self):
    # The buffer only feeds the backward pass.
    return log_sigmoid(ctx, self), None


@translates(aten.prelu.default)
def prelu(ctx, self, weight):
    # One slope per channel, and the channel dim is dim 1.
    r = rank(self)
    if rank(weight) == 1 and r > 2:
        weight = ctx.op.Unsqueeze(weight, ints(ctx, list(range(1, r - 1))))
    elif r == 0:
        weight = ctx.op.Reshape(weight, ints(ctx, []))
    return _prelu_kernel(ctx, self, weight)


@translates(aten._prelu_kernel.default)
def _prelu_kernel(ctx, self, weight):
    if self.dtype == _DOUBLE:
        return ctx.op.Where(ctx.op.Greater(self, scalar_like(ctx, 0, self)), self, ctx.op.Mul(self, weight))
    return ctx.op.PRelu(self, weight)


@translates(aten.glu.default)
def glu(ctx, self, dim=-1):
    first, second = split_equally(ctx, self, normalize_dim(dim, rank(self)), 2)
    return ctx.op.Mul(first, ctx.op.Sigmoid(second))


@translates(aten.threshold.default)
def threshold(ctx, self, threshold, value):
    below = ctx.op.LessOrEqual(self, scalar_like(ctx, threshold, self))
    return ctx.op.Where(below, scalar_like(ctx, value, self), self)


# -- softmax -------------------------------------------------------------------------------


def _normalized_exp(ctx, onnx_op: str, self, dim: int):
    r = rank(self)
    # The result dtype covers both softmax's dtype= and _softmax's half_to_float.
    self = cast(ctx, self, ctx.out_dtype)
    if r == 0:
        # ONNX softmaxes need an axis; a 0-d tensor is a single-element dim 0.
        unsqueezed = ctx.op.Unsqueeze(self, ints(ctx, [0]))
        return ctx.op.Squeeze(getattr(ctx.op, onnx_op)(unsqueezed, axis=0), ints(ctx, [0]))
    return getattr(ctx.op, onnx_op)(self, axis=normalize_dim(dim, r))


@translates(aten.softmax.int)
def softmax(ctx, self, dim, dtype=None):
    return _normalized_exp(ctx, "Softmax", self, dim)


@translates(aten._softmax.default)
def _softmax(ctx, self, dim, half_to_float):
    return _normalized_exp(ctx, "Softmax", self, dim)


@translates(aten.log_softmax.int)
def log_softmax(ctx, self, dim, dtype=None):
    return _normalized_exp(ctx, "LogSoftmax", self, dim)


@translates(aten._log_softmax.default)
def _log_softmax(ctx, self, dim, half_to_float):
    return _normalized_exp(ctx, "LogSoftmax", self, dim)
