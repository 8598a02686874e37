"""Elementwise arithmetic, math, comparison and logical operators."""

from __future__ import annotations

import math

import onnx_ir as ir
import torch

from dynexport.ops import _float64 as float64
from dynexport.ops._helpers import (
    arithmetic,
    bfloat16_as_float,
    bitwise,
    cast,
    invert,
    is_floating,
    is_inf,
    scalar,
    scalar_like,
    select,
)
from dynexport.registry import Promote, translates

aten = torch.ops.aten
# Some of torch's decompositions (its Python references) emit prims directly.
prims = torch.ops.prims


# -- arithmetic ---------------------------------------------------------------------------


@translates(aten.add.Tensor, aten.add.Scalar, promote=Promote.RESULT)
def add(ctx, self, other, alpha=1):
    if self.dtype == ir.DataType.BOOL:
        return ctx.op.Or(self, other)
    if alpha != 1:
        other = arithmetic(ctx, "Mul", other, scalar_like(ctx, alpha, other))
    return arithmetic(ctx, "Add", self, other)


@translates(aten.sub.Tensor, aten.sub.Scalar, prims.sub.default, promote=Promote.RESULT)
def sub(ctx, self, other, alpha=1):
    if alpha != 1:
        other = arithmetic(ctx, "Mul", other, scalar_like(ctx, alpha, other))
    return arithmetic(ctx, "Sub", self, other)


@translates(aten.rsub.Tensor, aten.rsub.Scalar, promote=Promote.RESULT)
def rsub(ctx, self, other, alpha=1):
    return sub(ctx, other, self, alpha)


@translates(aten.mul.Tensor, aten.mul.Scalar, prims.mul.default, promote=Promote.RESULT)
def mul(ctx, self, other):
    if self.dtype == ir.DataType.BOOL:
        return ctx.op.And(self, other)
    return arithmetic(ctx, "Mul", self, other)


@translates(aten.div.Tensor, aten.div.Scalar, promote=Promote.RESULT)
def div(ctx, self, other):
    return ctx.op.Div(self, other)


@translates(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, self, other, *, rounding_mode=None):
    dtype = ctx.out_dtype
    self, other = scalar(ctx, self, dtype), scalar(ctx, other, dtype)
    if rounding_mode is None:
        return ctx.op.Div(self, other)
    if rounding_mode == "floor":
        return _floor_divide(ctx, self, other)
    if is_floating(self):
        return _trunc(ctx, ctx.op.Div(self, other))
    # ONNX integer Div truncates toward zero, as rounding_mode="trunc" asks.
    return ctx.op.Div(self, other)


@translates(prims.div.default, promote=Promote.RESULT)
def prims_div(ctx, self, other):
    # prims.div truncates integers (ONNX integer Div does too) and divides floats exactly.
    return ctx.op.Div(self, other)


@translates(aten.floor_divide.default, aten.floor_divide.Scalar, promote=Promote.RESULT)
def floor_divide(ctx, self, other):
    return _floor_divide(ctx, self, other)


def _floor_divide(ctx, self, other):
    if is_floating(self):
        return _floor_divide_floating(ctx, self, other)
    # Integer Div truncates; subtract one where the signs differ and the division is inexact.
    quotient = ctx.op.Div(self, other)
    zero = scalar_like(ctx, 0, self)
    signs_differ = ctx.op.Xor(ctx.op.Less(self, zero), ctx.op.Less(other, zero))
    inexact = ctx.op.Not(ctx.op.Equal(ctx.op.Mul(quotient, other), self))
    adjust = ctx.op.And(signs_differ, inexact)
    return ctx.op.Sub(quotient, cast(ctx, adjust, self.dtype))


def _floor_divide_floating(ctx, self, other):
    # c10::div_floor_floating, not Floor(Div): it goes through fmod, so inf // 5 is NaN and
    # -5 // inf is -1. Half types compute in float32.
    dtype = self.dtype
    if dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        self, other = cast(ctx, self, ir.DataType.FLOAT), cast(ctx, other, ir.DataType.FLOAT)
    zero, one, half = (scalar_like(ctx, v, self) for v in (0.0, 1.0, 0.5))
    mod = ctx.op.Mod(self, other, fmod=1)
    quotient = ctx.op.Div(ctx.op.Sub(self, mod), other)
    signs_differ = ctx.op.Xor(ctx.op.Less(other, zero), ctx.op.Less(mod, zero))
    adjust = ctx.op.And(ctx.op.Not(ctx.op.Equal(mod, zero)), signs_differ)
    quotient = ctx.op.Sub(quotient, cast(ctx, adjust, self.dtype))
    floored = ctx.op.Floor(quotient)
    floored = ctx.op.Where(ctx.op.Greater(ctx.op.Sub(quotient, floored), half), ctx.op.Add(floored, one), floored)
    true_quotient = ctx.op.Div(self, other)
    is_zero = ctx.op.Equal(quotient, zero)
    result = ctx.op.Where(ctx.op.Equal(other, zero), true_quotient, ctx.op.Where(is_zero, zero, floored))
    # A zero takes the true quotient's sign; multiplied in, as onnxruntime's Where drops -0.0.
    negative = ctx.op.And(is_zero, _signbit(ctx, true_quotient))
    result = ctx.op.Mul(result, ctx.op.Where(negative, ctx.op.Neg(one), one))
    return cast(ctx, result, dtype)


def _trunc(ctx, x):
    # Trunc is not an ONNX op: floor the magnitude and restore the sign.
    return ctx.op.Mul(ctx.op.Sign(x), ctx.op.Floor(ctx.op.Abs(x)))


@translates(aten.remainder.Tensor, aten.remainder.Scalar, promote=Promote.RESULT)
def remainder(ctx, self, other):
    if is_floating(self):
        # Python-style modulo: the result takes the divisor's sign.
        return ctx.op.Sub(self, ctx.op.Mul(ctx.op.Floor(ctx.op.Div(self, other)), other))
    return ctx.op.Mod(self, other, fmod=0)


@translates(aten.fmod.Tensor, aten.fmod.Scalar, promote=Promote.RESULT)
def fmod(ctx, self, other):
    # fmod=1: C fmod, the result takes the dividend's sign (required for floats, valid for ints).
    return ctx.op.Mod(self, other, fmod=1)


@translates(
    aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar, promote=Promote.RESULT,
    promoted=("self", "exponent"),
)
def pow(ctx, self, exponent):
    if self.dtype in _NARROW_POW_BITS:
        return _narrow_integer_pow(ctx, self, exponent)
    return ctx.op.Pow(self, exponent)


# ONNX Pow has no 8- or 16-bit integer types, and a wider Pow goes through double, inexact
# past 2**53, where PyTorch's products wrap around.
_NARROW_POW_BITS = {ir.DataType.INT8: 8, ir.DataType.UINT8: 8, ir.DataType.INT16: 16}


def _narrow_integer_pow(ctx, self, exponent):
    # Square-and-multiply over the exponent's bits in int32 (a product of two narrow values
    # fits), each product wrapped to the narrow type as PyTorch's are.
    int32 = ir.DataType.INT32

    def wrapped_product(a, b):
        return cast(ctx, cast(ctx, ctx.op.Mul(a, b), self.dtype), int32)

    base, exponent = cast(ctx, self, int32), cast(ctx, exponent, int32)
    magnitude = ctx.op.Abs(exponent)
    zero, one = ctx.constant(0, int32), ctx.constant(1, int32)
    result = ctx.op.Expand(one, ctx.op.Shape(ctx.op.Add(base, magnitude)))
    power = base
    for bit in range(_NARROW_POW_BITS[self.dtype]):
        low_bits = ctx.op.Mod(magnitude, ctx.constant(2 << bit, int32))
        bit_set = ctx.op.GreaterOrEqual(low_bits, ctx.constant(1 << bit, int32))
        result = ctx.op.Where(bit_set, wrapped_product(result, power), result)
        power = wrapped_product(power, power)
    # A negative exponent truncates 1 / base**-exponent: zero unless the base is 1 or -1.
    vanishes = ctx.op.And(ctx.op.Less(exponent, zero), ctx.op.Not(ctx.op.Equal(ctx.op.Abs(base), one)))
    return cast(ctx, ctx.op.Where(vanishes, zero, result), self.dtype)


@translates(aten.neg.default, promote=Promote.RESULT)
def neg(ctx, self):
    if self.dtype == ir.DataType.UINT8:
        # ONNX Neg has no unsigned types; the cast back wraps around as PyTorch's uint8 does.
        return cast(ctx, ctx.op.Neg(cast(ctx, self, ir.DataType.INT32)), self.dtype)
    return ctx.op.Neg(self)


@translates(aten.abs.default)
def abs(ctx, self):
    if self.dtype == ir.DataType.BOOL:
        return ctx.op.Identity(self)
    return ctx.op.Abs(self)


@translates(aten.reciprocal.default, promote=Promote.RESULT)
def reciprocal(ctx, self):
    return ctx.op.Reciprocal(self)


@translates(aten.sign.default)
def sign(ctx, self):
    if self.dtype == ir.DataType.BOOL:
        return ctx.op.Identity(self)
    if is_floating(self):
        # PyTorch's sign(NaN) is 0; ONNX Sign propagates NaN.
        return ctx.op.Where(ctx.op.IsNaN(self), scalar_like(ctx, 0.0, self), ctx.op.Sign(self))
    return ctx.op.Sign(self)


# Max and Min have no bool kernels: for bools they are Or and And. onnxruntime has none for 16-bit
# integers either: those compare in int32.
_EXTREMA_IN_INT32 = frozenset({ir.DataType.INT16, ir.DataType.UINT16})


def _extremum(ctx, onnx_op: str, a: ir.Value, b: ir.Value) -> ir.Value:
    if a.dtype in _EXTREMA_IN_INT32:
        wide = getattr(ctx.op, onnx_op)(cast(ctx, a, ir.DataType.INT32), cast(ctx, b, ir.DataType.INT32))
        return cast(ctx, wide, a.dtype)
    return getattr(ctx.op, onnx_op)(a, b)


def _larger(ctx, a: ir.Value, b: ir.Value) -> ir.Value:
    return ctx.op.Or(a, b) if a.dtype == ir.DataType.BOOL else _extremum(ctx, "Max", a, b)


def _smaller(ctx, a: ir.Value, b: ir.Value) -> ir.Value:
    return ctx.op.And(a, b) if a.dtype == ir.DataType.BOOL else _extremum(ctx, "Min", a, b)


@translates(aten.maximum.default, aten.max.other, promote=Promote.RESULT)
def maximum(ctx, self, other):
    return _larger(ctx, self, other)


@translates(aten.minimum.default, aten.min.other, promote=Promote.RESULT)
def minimum(ctx, self, other):
    return _smaller(ctx, self, other)


@translates(
    aten.clamp.default, aten.clamp.Tensor, promote=Promote.RESULT, promoted=("self", "min", "max")
)
def clamp(ctx, self, min=None, max=None):
    # Max/Min instead of Clip: they broadcast tensor bounds and propagate NaN like PyTorch.
    if min is not None:
        self = _larger(ctx, self, min)
    if max is not None:
        self = _smaller(ctx, self, max)
    return self


@translates(aten.clamp_min.default, aten.clamp_min.Tensor, promote=Promote.RESULT, promoted=("self", "min"))
def clamp_min(ctx, self, min):
    return _larger(ctx, self, min)


@translates(aten.clamp_max.default, aten.clamp_max.Tensor, promote=Promote.RESULT, promoted=("self", "max"))
def clamp_max(ctx, self, max):
    return _smaller(ctx, self, max)


# -- unary math ----------------------------------------------------------------------------

# These take bfloat16 only from opset 22.
_BFLOAT16_FROM_22 = frozenset({"Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"})


def _unary(onnx_op: str):
    def rule(ctx, self):
        if self.dtype == ir.DataType.DOUBLE and onnx_op in float64.FORMS:
            return float64.FORMS[onnx_op](ctx, self)
        return getattr(ctx.op, onnx_op)(self)

    rule.__name__ = rule.__qualname__ = onnx_op.lower()
    return bfloat16_as_float(rule) if onnx_op in _BFLOAT16_FROM_22 else rule


for _aten_op, _onnx_op in {
    aten.exp.default: "Exp",
    aten.log.default: "Log",
    aten.sqrt.default: "Sqrt",
    prims.sqrt.default: "Sqrt",
    aten.sin.default: "Sin",
    aten.cos.default: "Cos",
    aten.tan.default: "Tan",
    aten.asin.default: "Asin",
    aten.acos.default: "Acos",
    aten.atan.default: "Atan",
    aten.sinh.default: "Sinh",
    aten.cosh.default: "Cosh",
    aten.tanh.default: "Tanh",
    aten.asinh.default: "Asinh",
    aten.acosh.default: "Acosh",
    aten.atanh.default: "Atanh",
    aten.erf.default: "Erf",
}.items():
    translates(_aten_op, promote=Promote.RESULT)(_unary(_onnx_op))


@translates(
    aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default,
    prims.floor.default, prims.ceil.default, prims.round.default, prims.trunc.default,
)
def rounding(ctx, self):
    if not is_floating(self):
        return ctx.op.Identity(self)
    name = ctx.node.target.overloadpacket.__name__
    if name == "trunc":
        return _trunc(ctx, self)
    if name == "round":
        return _round(ctx, self)
    return getattr(ctx.op, name.capitalize())(self)


@bfloat16_as_float
def _round(ctx, self):
    # ONNX Round takes bfloat16 only from opset 22.
    return ctx.op.Round(self)


@translates(aten.round.decimals)
def round_decimals(ctx, self, *, decimals=0):
    # As PyTorch: scale by 10**|decimals| so that the scale itself is exact, round half to even.
    if not is_floating(self):
        return ctx.op.Identity(self)
    scale = scalar_like(ctx, 10.0 ** (decimals if decimals >= 0 else -decimals), self)
    if decimals >= 0:
        return ctx.op.Div(_round(ctx, ctx.op.Mul(self, scale)), scale)
    return ctx.op.Mul(_round(ctx, ctx.op.Div(self, scale)), scale)


@translates(aten.erfc.default, prims.erfc.default, promote=Promote.RESULT)
def erfc(ctx, self):
    erf = float64.erf(ctx, self) if self.dtype == ir.DataType.DOUBLE else ctx.op.Erf(self)
    return ctx.op.Sub(scalar_like(ctx, 1.0, self), erf)


@translates(aten.fmax.default, aten.fmin.default, prims.fmax.default, prims.fmin.default, promote=Promote.RESULT)
def fmax_fmin(ctx, self, other):
    # Like maximum/minimum, but a NaN loses to a number.
    larger = ctx.node.target in (aten.fmax.default, prims.fmax.default)
    extremum = (_larger if larger else _smaller)(ctx, self, other)
    if not is_floating(self):
        return extremum
    return ctx.op.Where(ctx.op.IsNaN(self), other, ctx.op.Where(ctx.op.IsNaN(other), self, extremum))


@translates(aten.rsqrt.default, promote=Promote.RESULT)
def rsqrt(ctx, self):
    return ctx.op.Reciprocal(ctx.op.Sqrt(self))


@translates(aten.log2.default, aten.log10.default, promote=Promote.RESULT)
def log_base(ctx, self):
    base = 2.0 if ctx.node.target is aten.log2.default else 10.0
    return ctx.op.Div(ctx.op.Log(self), scalar_like(ctx, math.log(base), self))


@translates(aten.log1p.default, promote=Promote.RESULT)
def log1p(ctx, self):
    return ctx.op.Log(ctx.op.Add(self, scalar_like(ctx, 1.0, self)))


@translates(aten.expm1.default, promote=Promote.RESULT)
def expm1(ctx, self):
    return ctx.op.Sub(ctx.op.Exp(self), scalar_like(ctx, 1.0, self))


@translates(aten.exp2.default, promote=Promote.RESULT)
def exp2(ctx, self):
    return ctx.op.Pow(scalar_like(ctx, 2.0, self), self)


@translates(aten.square.default, promote=Promote.RESULT)
def square(ctx, self):
    return ctx.op.Mul(self, self)


@translates(aten.atan2.default, promote=Promote.RESULT)
@bfloat16_as_float
def atan2(ctx, self, other):
    # C's atan2: the angle in the first quadrant from the magnitudes, then mirrored by the
    # sign bits (signed zeros included). 0/0 and inf/inf, NaN for Atan, give 0 and pi/4.
    y, x = ctx.op.Abs(self), ctx.op.Abs(other)
    zero, pi = scalar_like(ctx, 0.0, y), scalar_like(ctx, math.pi, y)
    ratio = ctx.op.Div(y, x)
    angle = float64.atan(ctx, ratio) if ratio.dtype == ir.DataType.DOUBLE else ctx.op.Atan(ratio)
    both_zero = ctx.op.And(ctx.op.Equal(y, zero), ctx.op.Equal(x, zero))
    angle = ctx.op.Where(both_zero, zero, angle)
    both_infinite = ctx.op.And(is_inf(ctx, y), is_inf(ctx, x))
    angle = ctx.op.Where(both_infinite, scalar_like(ctx, math.pi / 4, y), angle)
    angle = ctx.op.Where(_signbit(ctx, other), ctx.op.Sub(pi, angle), angle)
    # A multiplied sign rather than Neg or Where: onnxruntime's Neg(0.0) and its Where choosing
    # -0.0 both give 0.0.
    one = scalar_like(ctx, 1.0, angle)
    return ctx.op.Mul(angle, ctx.op.Where(_signbit(ctx, self), ctx.op.Neg(one), one))


def _signbit(ctx, x):
    if not is_floating(x):
        if x.dtype in (ir.DataType.BOOL, ir.DataType.UINT8):
            return ctx.op.Expand(ctx.constant(False, ir.DataType.BOOL), ctx.op.Shape(x))
        return ctx.op.Less(x, scalar_like(ctx, 0, x))
    # -0.0 is found through 1 / -0.0 = -inf. (A negative NaN's sign bit is not visible without
    # a bitcast, which ONNX lacks; PyTorch's NaNs are positive.)
    zero = scalar_like(ctx, 0.0, x)
    negative_zero = ctx.op.And(ctx.op.Equal(x, zero), ctx.op.Less(ctx.op.Reciprocal(x), zero))
    return ctx.op.Or(ctx.op.Less(x, zero), negative_zero)


@translates(aten.signbit.default)
def signbit(ctx, self):
    return _signbit(ctx, self)


@translates(aten.copysign.Tensor, aten.copysign.Scalar, promote=Promote.RESULT)
def copysign(ctx, self, other):
    magnitude = ctx.op.Abs(self)
    return ctx.op.Where(_signbit(ctx, other), ctx.op.Neg(magnitude), magnitude)


@translates(aten.hypot.default, promote=Promote.RESULT)
def hypot(ctx, self, other):
    # Scaled by the larger magnitude so that squares do not overflow, as std::hypot; half types
    # compute in float32 as PyTorch does. An infinite side wins even over NaN.
    a, b = ctx.op.Abs(cast(ctx, self, ir.DataType.FLOAT)), ctx.op.Abs(cast(ctx, other, ir.DataType.FLOAT))
    if self.dtype == ir.DataType.DOUBLE:
        a, b = ctx.op.Abs(self), ctx.op.Abs(other)
    larger, smaller = ctx.op.Max(a, b), ctx.op.Min(a, b)
    ratio = ctx.op.Div(smaller, larger)
    one, zero = scalar_like(ctx, 1.0, a), scalar_like(ctx, 0.0, a)
    result = ctx.op.Mul(larger, ctx.op.Sqrt(ctx.op.Add(one, ctx.op.Mul(ratio, ratio))))
    result = ctx.op.Where(ctx.op.Equal(larger, zero), zero, result)
    infinite = ctx.op.Or(is_inf(ctx, a), is_inf(ctx, b))
    result = ctx.op.Where(infinite, scalar_like(ctx, math.inf, a), result)
    return cast(ctx, result, self.dtype)


# -- comparison and logic ------------------------------------------------------------------

def _comparison(onnx_op: str, negate: bool = False):
    def rule(ctx, self, other):
        if self.dtype == ir.DataType.BOOL and onnx_op != "Equal":
            # ONNX orders numbers only; False < True as 0 < 1.
            self, other = cast(ctx, self, ir.DataType.INT32), cast(ctx, other, ir.DataType.INT32)
        result = getattr(ctx.op, onnx_op)(self, other)
        return ctx.op.Not(result) if negate else result

    rule.__name__ = rule.__qualname__ = onnx_op.lower() + ("_not" if negate else "")
    return rule


for _packet, (_onnx_op, _negate) in {
    aten.eq: ("Equal", False),
    aten.ne: ("Equal", True),
    aten.lt: ("Less", False),
    aten.le: ("LessOrEqual", False),
    aten.gt: ("Greater", False),
    aten.ge: ("GreaterOrEqual", False),
}.items():
    translates(_packet.Tensor, _packet.Scalar, promote=Promote.COMMON)(_comparison(_onnx_op, _negate))


def _logical(onnx_op: str):
    def rule(ctx, self, other):
        return getattr(ctx.op, onnx_op)(_as_bool(ctx, self), _as_bool(ctx, other))

    rule.__name__ = rule.__qualname__ = "logical_" + onnx_op.lower()
    return rule


def _as_bool(ctx, x):
    if x.dtype == ir.DataType.BOOL:
        return x
    return ctx.op.Not(ctx.op.Equal(x, scalar_like(ctx, 0, x)))


translates(aten.logical_and.default)(_logical("And"))
translates(aten.logical_or.default)(_logical("Or"))
translates(aten.logical_xor.default)(_logical("Xor"))


@translates(aten.logical_not.default)
def logical_not(ctx, self):
    return ctx.op.Not(_as_bool(ctx, self))


@translates(aten.bitwise_not.default)
def bitwise_not(ctx, self):
    if self.dtype == ir.DataType.BOOL:
        return ctx.op.Not(self)
    return invert(ctx, self)


def _bitwise(op_type: str):
    def rule(ctx, self, other):
        if ctx.out_dtype == ir.DataType.BOOL:
            return getattr(ctx.op, op_type)(self, other)
        return bitwise(ctx, op_type, self, other)

    rule.__name__ = rule.__qualname__ = f"bitwise_{op_type.lower()}"
    return rule


for _packets, _prim, _op_type in [
    ((aten.bitwise_and, aten.__and__), prims.bitwise_and, "And"),
    ((aten.bitwise_or, aten.__or__), prims.bitwise_or, "Or"),
    ((aten.bitwise_xor, aten.__xor__), prims.bitwise_xor, "Xor"),
]:
    translates(
        *(getattr(p, o) for p in _packets for o in ("Tensor", "Scalar")), _prim.default, promote=Promote.RESULT
    )(_bitwise(_op_type))


@translates(aten.isnan.default)
def isnan(ctx, self):
    if not is_floating(self):
        return ctx.op.Expand(ctx.constant(False, ir.DataType.BOOL), ctx.op.Shape(self))
    return ctx.op.IsNaN(self)


@translates(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar, promote=Promote.RESULT)
def where(ctx, condition, self, other):
    return select(ctx, _as_bool(ctx, condition), self, other)


def _shiftable(node) -> bool:
    return node.meta["val"].dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


_SHIFT_BITS = {
    ir.DataType.INT8: 8, ir.DataType.UINT8: 8, ir.DataType.INT16: 16, ir.DataType.INT32: 32, ir.DataType.INT64: 64,
}
_UINT64 = ir.DataType.UINT64


def _shift_amount(ctx, other, bits: int, past_width: int) -> tuple[ir.Value, ir.Value]:
    """``other`` as uint64, amounts outside [0, bits) replaced by ``past_width``, and where they
    were. (onnxruntime's Where has no uint64 kernel: the choice is made in int64.)"""
    amount = cast(ctx, other, ir.DataType.INT64)
    out_of_range = ctx.op.Or(
        ctx.op.Less(amount, ctx.constant(0, ir.DataType.INT64)),
        ctx.op.GreaterOrEqual(amount, ctx.constant(bits, ir.DataType.INT64)),
    )
    amount = ctx.op.Where(out_of_range, ctx.constant(past_width, ir.DataType.INT64), amount)
    return ctx.op.Cast(amount, to=_UINT64), out_of_range


# BitShift takes unsigned types only (onnxruntime: 8-, 32- and 64-bit): shifts run on 64-bit
# copies, and the cast back to a narrow type keeps the low bits, as C's shifts do.


@translates(
    aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor,
    aten.__lshift__.Tensor, aten.__lshift__.Scalar, promote=Promote.RESULT, checker=_shiftable,
)
def bitwise_left_shift(ctx, self, other):
    amount, out_of_range = _shift_amount(ctx, other, _SHIFT_BITS[self.dtype], 0)
    wide = ctx.op.Cast(cast(ctx, self, ir.DataType.INT64), to=_UINT64)
    shifted = ctx.op.Cast(ctx.op.BitShift(wide, amount, direction="LEFT"), to=ir.DataType.INT64)
    # PyTorch shifts every bit out for amounts past the width (and negative ones).
    shifted = ctx.op.Where(out_of_range, ctx.constant(0, ir.DataType.INT64), shifted)
    return cast(ctx, shifted, self.dtype)


@translates(
    aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor,
    aten.__rshift__.Tensor, aten.__rshift__.Scalar, promote=Promote.RESULT, checker=_shiftable,
)
def bitwise_right_shift(ctx, self, other):
    # Arithmetic for signed types: a negative x >> n is ~(~x >> n), ~x being non-negative.
    # PyTorch shifts by bits - 1 (signed) or bits (unsigned) for amounts past that or negative.
    signed = self.dtype != ir.DataType.UINT8
    limit = _SHIFT_BITS[self.dtype] - signed
    amount, _ = _shift_amount(ctx, other, limit, limit)
    wide = cast(ctx, self, ir.DataType.INT64)
    negative = ctx.op.Less(wide, ctx.constant(0, ir.DataType.INT64))
    magnitude = ctx.op.Cast(ctx.op.Where(negative, invert(ctx, wide), wide), to=_UINT64)
    shifted = ctx.op.Cast(ctx.op.BitShift(magnitude, amount, direction="RIGHT"), to=ir.DataType.INT64)
    return cast(ctx, ctx.op.Where(negative, invert(ctx, shifted), shifted), self.dtype)
