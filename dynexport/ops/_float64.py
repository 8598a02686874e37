"""Float64 forms of the ONNX math ops onnxruntime has no float64 kernel for (Erf, Tan, the
inverse and hyperbolic trigonometric functions), written in ops it has: Exp, Log, Sqrt, Sin, Cos,
Pow, arithmetic and Where. Each is accurate to a few float64 ulps; NaN stays NaN."""

from __future__ import annotations

import math

import onnx_ir as ir

from dynexport.ops._helpers import ints, reduce, scalar_like

__all__ = ["FORMS", "atan", "erf"]


def _series(ctx, x: ir.Value, exponents: list[int], coefficients: list[float]) -> ir.Value:
    """sum_n coefficients[n] * x ** exponents[n], the terms along a new last axis."""
    powers = ctx.op.Pow(ctx.op.Unsqueeze(x, ints(ctx, [-1])), ctx.constant([float(e) for e in exponents], ir.DataType.DOUBLE))
    terms = ctx.op.Mul(powers, ctx.constant(coefficients, ir.DataType.DOUBLE))
    return reduce(ctx, "ReduceSum", terms, [-1], keepdims=False)


def _signed(ctx, x: ir.Value, magnitude: ir.Value) -> ir.Value:
    """``magnitude`` (an odd function of |x|) with the sign of ``x``."""
    return ctx.op.Mul(ctx.op.Sign(x), magnitude)


# erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (2n+1)!!: positive terms, so no
# cancellation; 100 terms reach float64 precision for |x| <= 6, and erf(6) rounds to 1.
_ERF_TERMS = 100
_ERF_COEFFICIENTS = [math.prod(2 / (2 * k + 3) for k in range(n)) for n in range(_ERF_TERMS)]


def erf(ctx, x: ir.Value) -> ir.Value:
    magnitude = ctx.op.Min(ctx.op.Abs(x), scalar_like(ctx, 6.0, x))
    total = _series(ctx, magnitude, [2 * n + 1 for n in range(_ERF_TERMS)], _ERF_COEFFICIENTS)
    gaussian = ctx.op.Exp(ctx.op.Neg(ctx.op.Mul(magnitude, magnitude)))
    value = ctx.op.Mul(ctx.op.Mul(total, gaussian), scalar_like(ctx, 2 / math.sqrt(math.pi), x))
    # The series' last ulps could take erf past 1.
    return _signed(ctx, x, ctx.op.Min(value, scalar_like(ctx, 1.0, x)))


# atan's Taylor series on |t| <= tan(pi/16) ~ 0.199: 12 terms reach float64 precision.
_ATAN_TERMS = 12


def atan(ctx, x: ir.Value) -> ir.Value:
    # |x| > 1 turns into 1/|x| (atan(u) = pi/2 - atan(1/u)), then two halvings of the angle
    # (atan(t) = 2 atan(t / (1 + sqrt(1 + t^2)))) bring it under tan(pi/16).
    one = scalar_like(ctx, 1.0, x)
    magnitude = ctx.op.Abs(x)
    large = ctx.op.Greater(magnitude, one)
    t = ctx.op.Where(large, ctx.op.Reciprocal(magnitude), magnitude)
    for _ in range(2):
        t = ctx.op.Div(t, ctx.op.Add(one, ctx.op.Sqrt(ctx.op.Add(one, ctx.op.Mul(t, t)))))
    exponents = [2 * n + 1 for n in range(_ATAN_TERMS)]
    angle = ctx.op.Mul(_series(ctx, t, exponents, [(-1) ** n / e for n, e in enumerate(exponents)]), scalar_like(ctx, 4.0, x))
    angle = ctx.op.Where(large, ctx.op.Sub(scalar_like(ctx, math.pi / 2, x), angle), angle)
    return _signed(ctx, x, angle)


def _asin(ctx, x: ir.Value) -> ir.Value:
    # (1 - x)(1 + x) rather than 1 - x^2, which cancels near |x| = 1.
    one = scalar_like(ctx, 1.0, x)
    return atan(ctx, ctx.op.Div(x, ctx.op.Sqrt(ctx.op.Mul(ctx.op.Sub(one, x), ctx.op.Add(one, x)))))


def _acos(ctx, x: ir.Value) -> ir.Value:
    # 2 atan(sqrt((1 - x) / (1 + x))) keeps small angles (x near 1) accurate.
    one = scalar_like(ctx, 1.0, x)
    ratio = ctx.op.Div(ctx.op.Sub(one, x), ctx.op.Add(one, x))
    return ctx.op.Mul(atan(ctx, ctx.op.Sqrt(ratio)), scalar_like(ctx, 2.0, x))


def _tan(ctx, x: ir.Value) -> ir.Value:
    return ctx.op.Div(ctx.op.Sin(x), ctx.op.Cos(x))


def _sinh(ctx, x: ir.Value) -> ir.Value:
    return ctx.op.Mul(ctx.op.Sub(ctx.op.Exp(x), ctx.op.Exp(ctx.op.Neg(x))), scalar_like(ctx, 0.5, x))


def _cosh(ctx, x: ir.Value) -> ir.Value:
    return ctx.op.Mul(ctx.op.Add(ctx.op.Exp(x), ctx.op.Exp(ctx.op.Neg(x))), scalar_like(ctx, 0.5, x))


def _asinh(ctx, x: ir.Value) -> ir.Value:
    # On |x|, then signed: log(x + sqrt(x^2 + 1)) cancels for large negative x.
    magnitude = ctx.op.Abs(x)
    root = ctx.op.Sqrt(ctx.op.Add(ctx.op.Mul(magnitude, magnitude), scalar_like(ctx, 1.0, x)))
    return _signed(ctx, x, ctx.op.Log(ctx.op.Add(magnitude, root)))


def _acosh(ctx, x: ir.Value) -> ir.Value:
    # sqrt(x - 1) sqrt(x + 1), not sqrt(x^2 - 1): NaN below 1, and no overflow.
    one = scalar_like(ctx, 1.0, x)
    root = ctx.op.Mul(ctx.op.Sqrt(ctx.op.Sub(x, one)), ctx.op.Sqrt(ctx.op.Add(x, one)))
    return ctx.op.Log(ctx.op.Add(x, root))


def _atanh(ctx, x: ir.Value) -> ir.Value:
    one = scalar_like(ctx, 1.0, x)
    return ctx.op.Mul(ctx.op.Log(ctx.op.Div(ctx.op.Add(one, x), ctx.op.Sub(one, x))), scalar_like(ctx, 0.5, x))


FORMS = {
    "Erf": erf,
    "Tan": _tan,
    "Asin": _asin,
    "Acos": _acos,
    "Atan": atan,
    "Sinh": _sinh,
    "Cosh": _cosh,
    "Asinh": _asinh,
    "Acosh": _acosh,
    "Atanh": _atanh,
}
