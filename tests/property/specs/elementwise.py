"""Property specs: elementwise math, comparisons and bitwise ops (dynexport/ops/elementwise.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from hypothesis import strategies as st

from tests.property.specs.common import (
    F32,
    NO_NAN,
    SPECIALS,
    OpSpec,
    aten,
    composite,
    one,
    scalar_operand,
    two,
    with_scalar,
)
from tests.property.strategies import ALL, BOOL, FLOATS, INTS, NUMERIC, Domain, broadcast_shapes, maybe, shapes, tensors

POSITIVE = Domain(0.1, 10.0)
NONZERO = Domain(-10, 10, exclude_zero=True)
NO_NAN_OR_INF = Domain(-10, 10)
ZEROS = Domain(fill=0.0)
NANS = Domain(fill=math.nan)
NONZERO_INT = Domain(-10, 10, exclude_zero=True, integral=True)
MATH = NUMERIC + BOOL  # math ops promote integer and bool inputs to float


def _nonzero_scalar(dtype):
    return scalar_operand(dtype).filter(lambda v: v != 0)


@composite
def _where(draw, dtype):
    a, b, c = draw(broadcast_shapes(3))
    return (draw(tensors(a, torch.bool)), draw(tensors(b, dtype, SPECIALS)), draw(tensors(c, dtype, SPECIALS))), {}


@composite
def _clamp(draw, dtype):
    x = draw(tensors(draw(shapes()), dtype, SPECIALS))
    low, high = draw(maybe(st.integers(-5, 0))), draw(maybe(st.integers(0, 5)))
    if low is None and high is None:
        low = -1
    return (x,), {"min": low, "max": high}


@composite
def _clamp_tensor(draw, dtype):
    a, b, c = draw(broadcast_shapes(3))
    return (
        draw(tensors(a, dtype, SPECIALS)),
        draw(tensors(b, dtype, Domain(-5, 0))),
        draw(tensors(c, dtype, Domain(0, 5))),
    ), {}


@composite
def _shift(draw, dtype):
    a, b = draw(broadcast_shapes(2))
    bits = torch.iinfo(dtype).bits
    return (draw(tensors(a, dtype, Domain(0, 100))), draw(tensors(b, dtype, Domain(0, bits - 1)))), {}


def _unary(name: str, fn: Callable, domain: Domain = SPECIALS, dtypes=MATH, **kw) -> OpSpec:
    return OpSpec(name, fn, one(domain), dtypes, **kw)


def _binary(
    name: str, fn: Callable, domain: Domain = SPECIALS, other: Domain | None = None, dtypes=NUMERIC, **kw
) -> OpSpec:
    return OpSpec(name, fn, two(domain, other), dtypes, **kw)


def _scalar_op(name: str, fn: Callable, domain: Domain = SPECIALS, dtypes=NUMERIC, scalar=None, **kw) -> OpSpec:
    return OpSpec(name, fn, with_scalar(domain, scalar), dtypes, **kw)


SPECS: list[OpSpec] = [
    *(
        _unary(name, fn, domain)
        for name, fn, domain in [
            ("abs.default", aten.abs.default, SPECIALS),
            ("acos.default", aten.acos.default, Domain(-1, 1, specials=True)),
            ("acosh.default", aten.acosh.default, Domain(1, 10, specials=True)),
            ("asin.default", aten.asin.default, Domain(-1, 1, specials=True)),
            ("asinh.default", aten.asinh.default, SPECIALS),
            ("atan.default", aten.atan.default, SPECIALS),
            ("atanh.default", aten.atanh.default, Domain(-0.95, 0.95, specials=True)),
            ("ceil.default", aten.ceil.default, SPECIALS),
            ("cos.default", aten.cos.default, SPECIALS),
            ("cosh.default", aten.cosh.default, Domain(-5, 5, specials=True)),
            ("erf.default", aten.erf.default, SPECIALS),
            ("exp.default", aten.exp.default, SPECIALS),
            ("exp2.default", aten.exp2.default, SPECIALS),
            ("expm1.default", aten.expm1.default, SPECIALS),
            ("floor.default", aten.floor.default, SPECIALS),
            ("log.default", aten.log.default, Domain(0, 10, specials=True)),
            ("log10.default", aten.log10.default, Domain(0, 10, specials=True)),
            ("log1p.default", aten.log1p.default, Domain(-0.9, 10, specials=True)),
            ("log2.default", aten.log2.default, Domain(0, 10, specials=True)),
            ("reciprocal.default", aten.reciprocal.default, NONZERO),
            ("round.default", aten.round.default, Domain(-10, 10, specials=True)),
            ("rsqrt.default", aten.rsqrt.default, POSITIVE),
            ("sigmoid.default", aten.sigmoid.default, SPECIALS),
            ("sign.default", aten.sign.default, NO_NAN),
            ("sin.default", aten.sin.default, SPECIALS),
            ("sinh.default", aten.sinh.default, Domain(-5, 5, specials=True)),
            ("sqrt.default", aten.sqrt.default, Domain(0, 10, specials=True)),
            ("square.default", aten.square.default, SPECIALS),
            ("tan.default", aten.tan.default, Domain(-1.2, 1.2, specials=True)),
            ("tanh.default", aten.tanh.default, SPECIALS),
            ("trunc.default", aten.trunc.default, SPECIALS),
            ("isnan.default", aten.isnan.default, SPECIALS),
            ("isinf.default", aten.isinf.default, SPECIALS),
            ("logical_not.default", aten.logical_not.default, SPECIALS),
        ]
    ),
    _unary("relu.default", aten.relu.default, SPECIALS, dtypes=NUMERIC),
    _unary("neg.default", aten.neg.default, SPECIALS, dtypes=NUMERIC),
    _unary("sign.default(nan)", aten.sign.default, NANS, dtypes=F32),
    _unary("bitwise_not.default", aten.bitwise_not.default, Domain(-100, 100), dtypes=INTS + BOOL),
    OpSpec("add.Tensor", aten.add.Tensor, two(alpha=st.sampled_from([1, 2, -1])), ALL),
    OpSpec("sub.Tensor", aten.sub.Tensor, two(alpha=st.sampled_from([1, 2, -1])), NUMERIC),
    _binary("mul.Tensor", aten.mul.Tensor, dtypes=ALL),
    _binary("div.Tensor", aten.div.Tensor, SPECIALS, NONZERO),
    OpSpec(
        "div.Tensor_mode",
        aten.div.Tensor_mode,
        two(NO_NAN_OR_INF, NONZERO_INT, rounding_mode=st.sampled_from(["trunc", "floor"])),
        NUMERIC,
    ),
    OpSpec(
        "div.Tensor_mode(inf, floor)",
        aten.div.Tensor_mode,
        two(Domain(fill=math.inf), Domain(fill=5.0), rounding_mode=st.just("floor")),
        F32,
    ),
    _binary("remainder.Tensor", aten.remainder.Tensor, Domain(-10, 10), NONZERO_INT),
    _binary("fmod.Tensor", aten.fmod.Tensor, Domain(-10, 10), NONZERO_INT),
    _binary("pow.Tensor_Tensor", aten.pow.Tensor_Tensor, Domain(-4, 4, specials=True), Domain(0, 3, integral=True)),
    _binary("maximum.default", aten.maximum.default, dtypes=ALL),
    _binary("minimum.default", aten.minimum.default, dtypes=ALL),
    _binary(
        "atan2.default", aten.atan2.default, SPECIALS, Domain(-10, 10, exclude_zero=True, specials=True), dtypes=MATH
    ),
    _binary("atan2.default(zeros)", aten.atan2.default, ZEROS, ZEROS, dtypes=F32),
    _binary("floor_divide.default", aten.floor_divide.default, Domain(-10, 10), NONZERO_INT),
    *(_binary(f"{op}.Tensor", getattr(aten, op).Tensor, dtypes=ALL) for op in ("eq", "ne", "lt", "le", "gt", "ge")),
    *(
        _binary(f"{op}.default", getattr(aten, op).default, dtypes=ALL)
        for op in ("logical_and", "logical_or", "logical_xor")
    ),
    *(
        _binary(f"{op}.Tensor", getattr(aten, op).Tensor, Domain(-100, 100), dtypes=INTS + BOOL)
        for op in ("bitwise_and", "bitwise_or", "bitwise_xor")
    ),
    OpSpec("where.self", aten.where.self, _where, ALL),
    OpSpec("clamp.default", aten.clamp.default, _clamp, NUMERIC),
    OpSpec("clamp.Tensor", aten.clamp.Tensor, _clamp_tensor, NUMERIC),
    *(
        _scalar_op(name, fn, domain, dtypes, scalar)
        for name, fn, domain, dtypes, scalar in [
            ("add.Scalar", aten.add.Scalar, SPECIALS, NUMERIC, None),
            ("sub.Scalar", aten.sub.Scalar, SPECIALS, NUMERIC, None),
            ("mul.Scalar", aten.mul.Scalar, SPECIALS, ALL, None),
            ("div.Scalar", aten.div.Scalar, SPECIALS, NUMERIC, _nonzero_scalar),
            (
                "remainder.Scalar",
                aten.remainder.Scalar,
                Domain(-10, 10),
                NUMERIC,
                lambda d: st.integers(1, 5) | st.integers(-5, -1),
            ),
            (
                "fmod.Scalar",
                aten.fmod.Scalar,
                Domain(-10, 10),
                NUMERIC,
                lambda d: st.integers(1, 5) | st.integers(-5, -1),
            ),
            *(
                (f"{op}.Scalar", getattr(aten, op).Scalar, SPECIALS, ALL, None)
                for op in ("eq", "ne", "lt", "le", "gt", "ge")
            ),
            *(
                (f"{op}.Scalar", getattr(aten, op).Scalar, Domain(-100, 100), INTS, lambda d: st.integers(-8, 8))
                for op in ("bitwise_and", "bitwise_or", "bitwise_xor")
            ),
        ]
    ),
    # No exponent 0.5: PyTorch's vectorized CPU kernel computes x ** 0.5 as sqrt (NaN at -inf), its
    # scalar path as pow (+inf), so eager is no reference there.
    OpSpec(
        "pow.Tensor_Scalar",
        aten.pow.Tensor_Scalar,
        with_scalar(
            Domain(-4, 4, specials=True),
            lambda d: (
                st.sampled_from([0, 1, 2, 3, 1.5, -1, 2.5]) if d.is_floating_point else st.sampled_from([0, 1, 2, 3])
            ),
            name="exponent",
        ),
        NUMERIC,
    ),
    OpSpec(
        "pow.Scalar",
        lambda x, base: aten.pow.Scalar(base, x),
        with_scalar(Domain(-3, 3), lambda d: st.sampled_from([2, 0.5, 3.0]), name="base"),
        FLOATS,
    ),
    OpSpec(
        "div.Scalar_mode",
        aten.div.Scalar_mode,
        with_scalar(
            Domain(-10, 10),
            lambda d: st.sampled_from([2, -3, 1.5]),
            name="other",
            rounding_mode=st.sampled_from(["trunc", "floor"]),
        ),
        NUMERIC,
    ),
    OpSpec(
        "bitwise_left_shift.Tensor", aten.bitwise_left_shift.Tensor, _shift, (torch.uint8, torch.int32, torch.int64)
    ),
    OpSpec(
        "bitwise_right_shift.Tensor", aten.bitwise_right_shift.Tensor, _shift, (torch.uint8, torch.int32, torch.int64)
    ),
    _unary("signbit.default", aten.signbit.default, NO_NAN, dtypes=NUMERIC),
    _binary("copysign.Tensor", aten.copysign.Tensor, NO_NAN, dtypes=FLOATS),
    _binary("hypot.default", aten.hypot.default, Domain(-10, 10), dtypes=FLOATS),
    _binary("rsub.Tensor", aten.rsub.Tensor, dtypes=NUMERIC),
    OpSpec(
        "clamp_min.default",
        aten.clamp_min.default,
        with_scalar(NO_NAN, lambda d: st.integers(-3, 3), name="min"),
        NUMERIC,
    ),
    OpSpec(
        "clamp_max.default",
        aten.clamp_max.default,
        with_scalar(NO_NAN, lambda d: st.integers(-3, 3), name="max"),
        NUMERIC,
    ),
    _binary("clamp_min.Tensor", aten.clamp_min.Tensor, NO_NAN, dtypes=NUMERIC),
    _binary("clamp_max.Tensor", aten.clamp_max.Tensor, NO_NAN, dtypes=NUMERIC),
]
