"""Elementwise arithmetic, math, comparison and logic rules against onnxruntime."""

from __future__ import annotations

import math

import pytest
import torch

from tests.equivalence import assert_batch_dynamic_equivalent, op_histogram

FLOAT_DTYPES = [torch.float32, torch.float16, torch.float64]
INT_DTYPES = [torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: x + y,
        lambda x, y: x - y,
        lambda x, y: x * y,
        lambda x, y: torch.add(x, y, alpha=3),
        lambda x, y: torch.sub(x, y, alpha=2),
        lambda x, y: torch.rsub(x, y),
        lambda x, y: torch.maximum(x, y),
        lambda x, y: torch.minimum(x, y),
        lambda x, y: x + 2,
        lambda x, y: 3 - x,
        lambda x, y: x * 0.5,
    ],
    ids=["add", "sub", "mul", "add_alpha", "sub_alpha", "rsub", "maximum", "minimum", "add_int", "rsub_scalar", "mul_float"],
)
def test_arithmetic(fn, dtype):
    # Whole numbers: float16 add with alpha rounds alpha * y once or twice in eager depending on
    # the tensor's size (vectorized or not), so non-integral values differ by a ulp either way.
    x = (torch.randn(2, 3) * 10).round().to(dtype)
    y = (torch.randn(2, 3) * 10).round().to(dtype)
    assert_batch_dynamic_equivalent(fn, x, y)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
@pytest.mark.parametrize("rounding_mode", [None, "floor", "trunc"])
def test_div_rounding_modes(dtype, rounding_mode):
    x = torch.tensor([[7, -7, 6, -6, 0, 5]], dtype=dtype)
    y = torch.tensor([[2, 2, -4, -4, 3, -5]], dtype=dtype)
    assert_batch_dynamic_equivalent(lambda a, b: torch.div(a, b, rounding_mode=rounding_mode), x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_remainder_and_fmod_follow_pytorch_signs(dtype):
    x = torch.tensor([[7, -7, 7, -7, 0]], dtype=dtype)
    y = torch.tensor([[3, 3, -3, -3, 2]], dtype=dtype)
    assert_batch_dynamic_equivalent(lambda a, b: (torch.remainder(a, b), torch.fmod(a, b), a // b), x, y)


def test_int_tensor_times_float_scalar_promotes():
    x = torch.arange(6).reshape(2, 3)
    program = assert_batch_dynamic_equivalent(lambda a: a * 1.5 + a / 2, x)
    assert program.model.graph.outputs[0].dtype.name == "FLOAT"


def test_mixed_dtypes_promote_like_pytorch():
    x = torch.randn(2, 3, dtype=torch.float16)
    y = torch.randn(2, 3, dtype=torch.float32)
    i = torch.randint(0, 5, (2, 3), dtype=torch.int32)
    assert_batch_dynamic_equivalent(lambda a, b, c: (a + b, a * c, c + 1, c > a), x, y, i)


@pytest.mark.parametrize(
    "fn",
    [torch.exp, torch.log, torch.sqrt, torch.rsqrt, torch.sin, torch.cos, torch.tan, torch.tanh,
     torch.sinh, torch.cosh, torch.atan, torch.asinh, torch.erf, torch.log1p, torch.expm1,
     torch.log2, torch.log10, torch.exp2, torch.reciprocal, torch.square, torch.floor, torch.ceil,
     torch.round, torch.trunc, torch.abs, torch.neg, torch.sign],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unary_math(fn, dtype):
    x = torch.rand(3, 4, dtype=dtype) * 3 + 0.1
    if fn in (torch.floor, torch.ceil, torch.round, torch.trunc, torch.abs, torch.neg, torch.sign, torch.sin, torch.tanh, torch.atan, torch.erf):
        x = x - 1.7
    # In onnxruntime itself: it has no float64 Erf, Tan nor inverse or hyperbolic trigonometry.
    assert_batch_dynamic_equivalent(fn, x, runtime="onnxruntime")


@pytest.mark.parametrize("fn", [torch.asin, torch.acos, torch.atanh])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unary_math_unit_domain(fn, dtype):
    assert_batch_dynamic_equivalent(fn, (torch.rand(3, 4) * 1.8 - 0.9).to(dtype), runtime="onnxruntime")


def test_float64_math_over_wide_ranges_and_special_values():
    # The float64 forms (series, argument reductions) across their ranges' seams, both signs,
    # zeros, infinities and NaN, outside the domains too.
    x = torch.tensor(
        [[0.0, 1e-300, 1e-8, 0.1, 0.19, 0.2, 0.41, 0.5, 0.99, 1.0, 1.01, 2.5, 3.0, 5.9, 6.0, 6.5, 30.0, 1e10,
          1e200, math.inf, math.nan]], dtype=torch.float64,
    )
    x = torch.cat([x, -x], dim=1)

    def fn(x):
        return (
            torch.erf(x), torch.erfc(x), torch.atan(x), torch.asin(x), torch.acos(x), torch.atanh(x),
            torch.asinh(x.clamp(-1e100, 1e100)), torch.acosh(x.clamp(-1e100, 1e100)), torch.tan(x),
            torch.sinh(x.clamp(-700, 700)), torch.cosh(x.clamp(-700, 700)), torch.atan2(x, x.flip(-1)),
        )

    assert_batch_dynamic_equivalent(fn, x, runtime="onnxruntime", rtol=1e-12, atol=1e-14)


def test_unary_math_on_integers_computes_in_float():
    assert_batch_dynamic_equivalent(lambda x: (torch.sqrt(x), torch.exp(x), torch.abs(-x), x.sign()), torch.arange(8).reshape(2, 4))


def test_round_half_to_even():
    assert_batch_dynamic_equivalent(torch.round, torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, 2.4]]))


def test_atan2_all_quadrants():
    y = torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0, 1.0, -1.0]])
    x = torch.tensor([[1.0, -1.0, -1.0, 1.0, -1.0, 0.0, 0.0]])
    assert_batch_dynamic_equivalent(torch.atan2, y, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_pow(dtype):
    x = torch.tensor([[1, 2, 3, 4]], dtype=dtype)
    assert_batch_dynamic_equivalent(lambda a: (a**2, torch.pow(a, a), 2**a), x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
def test_clamp_scalar_and_tensor_bounds(dtype):
    x = (torch.randn(2, 5) * 5).to(dtype)
    low = torch.full((1, 5), -2).to(dtype)
    high = torch.full((2, 1), 3).to(dtype)
    assert_batch_dynamic_equivalent(
        lambda a, lo, hi: (a.clamp(-1, 2), a.clamp(min=0), a.clamp(max=1), torch.clamp(a, lo, hi)),
        x, low, high,
    )


def test_bool_extrema_and_clamps_are_or_and():
    a, b = torch.tensor([[True, False, True, False]]), torch.tensor([[True, True, False, False]])
    program = assert_batch_dynamic_equivalent(
        lambda a, b: (torch.clamp_min(a, b), torch.clamp_max(a, b), torch.maximum(a, b), torch.minimum(a, b)), a, b
    )
    assert "Max" not in op_histogram(program) and "Min" not in op_histogram(program)


def test_clamp_propagates_nan():
    assert_batch_dynamic_equivalent(lambda a: a.clamp(-1, 1), torch.tensor([[float("nan"), 3.0, -3.0, 0.5]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(op, dtype):
    x = torch.tensor([[1, 2, 3, 0]]).to(dtype)
    y = torch.tensor([[3, 2, 1, 0]]).to(dtype)
    compare = getattr(torch, op)
    assert_batch_dynamic_equivalent(lambda a, b: (compare(a, b), compare(a, 1)), x, y)


def test_comparison_promotes_int_tensor_against_float_scalar():
    assert_batch_dynamic_equivalent(lambda a: (a > 1.5, a == 2.0), torch.tensor([[1, 2, 3]]))


def test_logical_and_bitwise():
    a = torch.tensor([[True, False, True, False]])
    b = torch.tensor([[True, True, False, False]])
    i = torch.tensor([[12, 10, 7, -3]])
    j = torch.tensor([[10, 6, 1, 5]])
    assert_batch_dynamic_equivalent(
        lambda a, b, i, j: (
            a & b, a | b, a ^ b, ~a, torch.logical_and(i, j), torch.logical_or(i, a),
            torch.logical_not(i), torch.logical_xor(i, j), i & j, i | j, i ^ j, ~i,
        ),
        a, b, i, j,
    )


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64], ids=str)
def test_bitwise_ops_at_the_extremes_of_each_integer_type(dtype):
    # Below opset 18, which defines the Bitwise ops, they are computed from each operand's bits.
    info = torch.iinfo(dtype)
    a = torch.tensor([[info.min, info.max, info.min, info.max, -1 if info.min else 0, 0, 93, 6]], dtype=dtype)
    b = torch.tensor([[info.max, info.max, info.min, 1, 77, info.min, 6, 93]], dtype=dtype)
    assert_batch_dynamic_equivalent(lambda a, b: (a & b, a | b, a ^ b, ~a), a, b)


def test_where_with_tensors_and_scalars():
    cond = torch.tensor([[True, False, True]])
    x = torch.randn(1, 3)
    y = torch.randn(1, 3)
    assert_batch_dynamic_equivalent(
        lambda c, a, b: (torch.where(c, a, b), torch.where(c, a, 0.0), torch.where(c, 1.0, b), torch.where(a > 0, 1, 0)),
        cond, x, y,
    )


def test_isnan():
    assert_batch_dynamic_equivalent(lambda a: (torch.isnan(a), torch.isnan(a.long())), torch.tensor([[1.0, float("nan"), 0.0]]))


@pytest.mark.parametrize("dtype", [torch.int16, torch.bool, torch.uint8, torch.int64])
def test_where_and_extrema_in_onnxruntime(dtype):
    # onnxruntime has no bool or int16 Where and no int16 Max or Min: they compute in a wider type.
    a, b = (torch.randn(2, 5) * 50).to(dtype), (torch.randn(2, 5) * 50).to(dtype)
    mask = torch.randn(2, 5) > 0
    bounded = dtype is not torch.bool
    assert_batch_dynamic_equivalent(
        lambda a, b, m: (
            torch.where(m, a, b), torch.maximum(a, b), torch.minimum(a, b), a.clamp(3, 20) if bounded else a,
            a.clamp(min=b) if bounded else a,
        ),
        a, b, mask, runtime="onnxruntime",
    )


def test_bool_arithmetic():
    a = torch.tensor([[True, False, True]])
    b = torch.tensor([[False, False, True]])
    assert_batch_dynamic_equivalent(lambda a, b: (a * b, torch.maximum(a, b), torch.minimum(a, b), a + b), a, b)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_bit_shifts_follow_pytorch_for_signs_and_large_amounts(dtype):
    bits = torch.iinfo(dtype).bits
    info = torch.iinfo(dtype)
    x = torch.tensor([[info.min, info.max, 0, 1, 5, -7 if info.min else 7, -1 if info.min else 200, 3]], dtype=dtype)
    amounts = torch.tensor([[1, 1, 3, bits - 1, bits, bits + 3, 2, 0]], dtype=dtype)
    if info.min:
        amounts[0, 7] = -2

    def fn(x, n):
        return x << n, x >> n, x << 2, x >> 3, torch.bitwise_right_shift(x, bits + 1), torch.bitwise_left_shift(x, bits)

    # In onnxruntime itself: a model it has no kernel for (uint64 Where) does not load.
    assert_batch_dynamic_equivalent(fn, x, amounts, runtime="onnxruntime")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int32])
def test_signbit_and_copysign(dtype):
    x = torch.tensor([[-0.0, 0.0, -2.5, 3.0, float("inf"), float("-inf"), float("nan"), 1.5]])
    if not dtype.is_floating_point:
        x = torch.tensor([[0, -3, 4, -1, 2, 7, 0, -9]])
    x = x.to(dtype)
    y = x.flip(-1)
    assert_batch_dynamic_equivalent(
        lambda x, y: (torch.signbit(x), torch.copysign(x, y), torch.copysign(y, -0.0), torch.copysign(x, 2)), x, y
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_hypot(dtype):
    big = 1e30 if dtype is not torch.float16 else 6e4
    x = torch.tensor([[3.0, 0.0, -5.0, big, float("inf"), float("nan"), 1e-3, -0.0]], dtype=dtype)
    y = torch.tensor([[4.0, 0.0, 12.0, big, float("nan"), 2.0, 2e-3, 0.0]], dtype=dtype)
    assert_batch_dynamic_equivalent(torch.hypot, x, y)


def test_uint8_with_negative_python_scalars_wraps_like_pytorch():
    # Regression (property tests): the constant -1 overflowed uint8 at export; PyTorch wraps it.
    x = torch.tensor([[0, 1, 200, 255]], dtype=torch.uint8)
    assert_batch_dynamic_equivalent(lambda a: (a + (-1), a - (-3), torch.add(a, a, alpha=-1), a > -4), x)


@pytest.mark.parametrize("opset", [20, 22])
@pytest.mark.parametrize("op", ["acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "round"])
def test_bfloat16_math_before_and_from_opset_22(op, opset):
    # Regression (property tests): ONNX gives these bfloat16 only from opset 22.
    x = torch.tensor([[0.25, -0.5, 0.75, 1.5, 2.5]], dtype=torch.bfloat16)
    x = x.abs() + 1 if op == "acosh" else x.clamp(-0.9, 0.9) if op in ("acos", "asin", "atanh") else x
    assert_batch_dynamic_equivalent(getattr(torch, op), x, opset_version=opset, rtol=1e-2, atol=1e-2)


def test_bfloat16_atan2():
    y = torch.tensor([[1.0, -1.0, 0.5, -2.0]], dtype=torch.bfloat16)
    x = torch.tensor([[1.0, -1.0, -3.0, 0.25]], dtype=torch.bfloat16)
    assert_batch_dynamic_equivalent(torch.atan2, y, x, rtol=1e-2, atol=1e-2)


def test_atan2_signed_zeros_and_infinities_follow_pytorch():
    # Regression (property tests): atan2(0, 0) was NaN; PyTorch follows C's atan2.
    values = [0.0, -0.0, math.inf, -math.inf, 1.0, -1.0, math.nan]
    y = torch.tensor([[a for a in values for _ in values]])
    x = torch.tensor([[b for _ in values for b in values]])
    program = assert_batch_dynamic_equivalent(torch.atan2, y, x)
    actual, expected = program(y, x), torch.atan2(y, x)
    # assert_close does not tell -0.0 from 0.0 (nor need NaNs agree in sign).
    numbers = ~expected.isnan()
    assert torch.equal(torch.signbit(actual[numbers]), torch.signbit(expected[numbers]))


def test_sign_of_nan_is_zero():
    x = torch.tensor([[math.nan, -2.0, 0.0, 3.0, -math.inf]])
    assert_batch_dynamic_equivalent(torch.sign, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_floor_division_of_infinities_follows_pytorch(dtype):
    # Regression (property tests): PyTorch floors through fmod, so inf // 2 is NaN, -5 // inf is -1.
    x = torch.tensor([[math.inf, -math.inf, math.nan, 5.0, -5.0, 0.0, -0.0, 1.0, 7.0, -7.0]], dtype=dtype)
    y = torch.tensor([[2.0, 2.0, 2.0, math.inf, math.inf, -math.inf, 2.0, 0.0, -0.0, -math.inf]], dtype=dtype)
    program = assert_batch_dynamic_equivalent(lambda a, b: (torch.div(a, b, rounding_mode="floor"), a // b), x, y)
    zeros = torch.tensor([[0.0, -0.0, 0.0, -0.0, 3.0, -3.0, 3.0, -3.0, 1.0, -1.0]], dtype=dtype)
    divisors = torch.tensor([[5.0, 5.0, -5.0, -5.0, math.inf, -math.inf, 4.0, -4.0, -0.5, 0.5]], dtype=dtype)
    # assert_close does not tell -0.0 from 0.0.
    actual, expected = program(zeros, divisors)[0], torch.div(zeros, divisors, rounding_mode="floor")
    assert torch.equal(torch.signbit(actual), torch.signbit(expected))


def test_neg_uint8_wraps_like_pytorch():
    x = torch.tensor([[0, 1, 128, 200, 255]], dtype=torch.uint8)
    assert_batch_dynamic_equivalent(torch.neg, x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_pow_narrow_integers_wraps_like_pytorch(dtype):
    # Regression (property tests): ONNX Pow has no 8- or 16-bit integer types. Large powers
    # wrap around; negative exponents give 0 but for bases 1 and -1.
    signed = dtype != torch.uint8
    x = torch.tensor([[0, 1, 2, 3, 7, 127, -3 if signed else 5, 1, -1 if signed else 9, 2]], dtype=dtype)
    e = torch.tensor([[3, 0, 5, 40, 30, 100, 21, -1 if signed else 200, -3 if signed else 77, -2 if signed else 9]], dtype=dtype)
    assert_batch_dynamic_equivalent(lambda a, b: (torch.pow(a, b), a**2, 3**b), x, e)


def test_fmax_fmin_let_numbers_win_over_nan():
    nan = float("nan")
    a, b = torch.tensor([[1.0, nan, 3.0, nan, -0.5]]), torch.tensor([[2.0, 1.0, nan, nan, -1.0]])
    assert_batch_dynamic_equivalent(lambda a, b: (torch.fmax(a, b), torch.fmin(a, b), torch.fmax(a.long(), b.nan_to_num().long())), a, b)


def test_round_to_decimals_and_erfc():
    x = torch.tensor([[1.2345, -2.5551, 1234.5678, 0.125, -0.0005, 2.5]])
    assert_batch_dynamic_equivalent(
        lambda x: (torch.round(x, decimals=2), torch.round(x, decimals=-2), torch.round(x, decimals=0), torch.erfc(x), torch.erfc(3 * x)),
        x, atol=1e-6,
    )


def test_ops_whose_decompositions_emit_prims():
    # torch decomposes these through its Python references, which emit prims.* directly.
    x = torch.tensor([[1.0, 2.5, float("nan"), -3.0, 4.0]])
    y = torch.tensor([[1.0, 2.4, float("nan"), -3.0, 5.0]])
    assert_batch_dynamic_equivalent(
        lambda x, y: (torch.isclose(x, y, rtol=0.05, equal_nan=True), torch.quantile(x.nan_to_num(), 0.3, dim=1)),
        x, y,
    )
    assert_batch_dynamic_equivalent(lambda a, b: torch.isclose(a, b, atol=1), torch.tensor([[1, 5, 9]]), torch.tensor([[2, 7, 9]]))
