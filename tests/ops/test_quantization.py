"""Quantization rules (quantized_decomposed quantize/dequantize, fake quantization) against
onnxruntime, and half-precision models end to end."""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # defines torch.ops.quantized_decomposed

import dynexport
from tests.equivalence import assert_batch_dynamic_equivalent, op_histogram

quantized_decomposed = torch.ops.quantized_decomposed
aten = torch.ops.aten

EXACT = {"rtol": 0.0, "atol": 0.0}


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def _assert_qdq_only(program, pairs: int = 1):
    """The graph quantizes with QuantizeLinear/DequantizeLinear, not with rounding arithmetic."""
    histogram = op_histogram(program)
    assert histogram["QuantizeLinear"] == pairs and histogram["DequantizeLinear"] == pairs
    assert not {"Round", "Floor", "Div"} & set(histogram)


class FakeQuantizedLinear(torch.nn.Module):
    """A linear layer with fake-quantized input and weight, as quantization-aware training leaves it."""

    def __init__(self, quant_min: int, quant_max: int):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.range = (quant_min, quant_max)
        self.zero_point = (quant_min + quant_max + 1) // 2

    def forward(self, x):
        x = torch.fake_quantize_per_tensor_affine(x, 0.05, self.zero_point, *self.range)
        weight = torch.fake_quantize_per_channel_affine(
            self.linear.weight, torch.full((4,), 0.01), torch.zeros(4, dtype=torch.int32), 0, -128, 127
        )
        return torch.nn.functional.linear(x, weight, self.linear.bias)


# -- fake quantization -----------------------------------------------------------------------


@pytest.mark.parametrize("opset", [18, 20, 23])
@pytest.mark.parametrize("quant_range", [(-128, 127), (0, 255), (0, 127), (-8, 7)], ids=str)
def test_fake_quantized_linear(quant_range, opset):
    model = FakeQuantizedLinear(*quant_range).eval()
    # Unoptimized: constant folding would turn the weight's QDQ pair into a float initializer.
    program = assert_batch_dynamic_equivalent(model, _randn(3, 8) * 4, opset_version=opset, optimize=False)
    _assert_qdq_only(program, pairs=2)
    assert op_histogram(program)["Clip"] == (quant_range not in [(-128, 127), (0, 255)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fake_quantize_per_tensor_values_match_exactly(dtype):
    # Ties and saturation: 0.25 / 0.1 rounds half to even, +-50 falls outside the range.
    x = torch.cat([_randn(2, 16) * 3, torch.tensor([[0.25, -0.25, 0.35, 50.0, -50.0, 0.0] * 2 + [1.0] * 4])]).to(dtype)
    program = assert_batch_dynamic_equivalent(
        lambda x: torch.fake_quantize_per_tensor_affine(x, 0.1, 10, 0, 100), x, **EXACT
    )
    _assert_qdq_only(program)


def test_fake_quantize_per_tensor_tensor_qparams():
    scale, zero_point = torch.tensor(0.02), torch.tensor(-3, dtype=torch.int32)
    program = assert_batch_dynamic_equivalent(
        lambda x, s, z: torch.fake_quantize_per_tensor_affine(x, s, z, -128, 127),
        _randn(4, 5),
        scale,
        zero_point,
        batched=[True, False, False],
        **EXACT,
    )
    _assert_qdq_only(program)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_fake_quantize_per_channel(axis):
    x = _randn(4, 3, 5) * 2
    channels = x.shape[axis]
    scales = torch.linspace(0.01, 0.05, channels)
    zero_points = torch.arange(channels, dtype=torch.int32) - 1

    def fn(x):
        return torch.fake_quantize_per_channel_affine(x, scales, zero_points, axis, -128, 127)

    program = assert_batch_dynamic_equivalent(fn, x, batched=[axis != 0], **EXACT)
    _assert_qdq_only(program)


def test_sixteen_bit_fake_quantize_needs_opset_21():
    def fn(x):
        return torch.fake_quantize_per_tensor_affine(x, 1e-3, 0, -32768, 32767)

    program = assert_batch_dynamic_equivalent(fn, _randn(3, 6) * 40, opset_version=21, **EXACT)
    _assert_qdq_only(program)
    with pytest.raises(
        dynexport.errors.TranslationError, match="fake_quantize_per_tensor_affine.*int16 quantization needs .* opset 21"
    ):
        dynexport.export(fn, (_randn(3, 6),), opset_version=20)


def test_fractional_zero_point_is_declined():
    def fn(x):
        return torch.fake_quantize_per_channel_affine(x, torch.tensor([0.1, 0.2]), torch.tensor([0.5, 1.0]), 1, 0, 255)

    with pytest.raises(dynexport.errors.UnsupportedOperatorError, match="fake_quantize_per_channel_affine"):
        dynexport.export(fn, (_randn(3, 2),))


# -- quantized_decomposed --------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, quant_min, quant_max, opset",
    [
        (torch.int8, -128, 127, 20),
        (torch.uint8, 0, 255, 18),
        (torch.int8, -127, 127, 20),
        (torch.uint8, 0, 15, 23),
        (torch.int16, -32768, 32767, 21),
        (torch.uint16, 0, 65535, 23),
    ],
    ids=["int8", "uint8", "int8_symmetric", "uint4_in_uint8", "int16", "uint16"],
)
def test_quantize_dequantize_per_tensor(dtype, quant_min, quant_max, opset):
    scale, zero_point = (0.03, 2) if quant_min < 0 else (0.07, 7)
    qparams = (quant_min, quant_max, dtype)

    def fn(x):
        q = quantized_decomposed.quantize_per_tensor(x, scale, zero_point, *qparams)
        return q, quantized_decomposed.dequantize_per_tensor(q, scale, zero_point, *qparams)

    program = assert_batch_dynamic_equivalent(fn, _randn(3, 7) * 3, opset_version=opset, **EXACT)
    _assert_qdq_only(program)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_dequantize_per_tensor_tensor_overloads(out_dtype):
    scale, zero_point = torch.tensor(0.045, dtype=torch.float64), torch.tensor(-4)

    def fn(x, s, z):
        q = quantized_decomposed.quantize_per_tensor.tensor(x, s, z, -128, 127, torch.int8)
        return quantized_decomposed.dequantize_per_tensor.tensor(q, s, z, -128, 127, torch.int8, out_dtype=out_dtype)

    program = assert_batch_dynamic_equivalent(
        fn, _randn(5, 4), scale, zero_point, batched=[True, False, False], **EXACT
    )
    _assert_qdq_only(program)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("with_zero_points", [True, False])
def test_quantize_dequantize_per_channel(axis, with_zero_points):
    x = _randn(6, 3) * 2
    scales = torch.tensor([0.02, 0.03, 0.05, 0.01, 0.04, 0.06])[: x.shape[axis]]
    zero_points = (
        torch.arange(x.shape[axis]) * 10 if with_zero_points else torch.zeros(x.shape[axis], dtype=torch.int64)
    )

    def fn(x):
        q = quantized_decomposed.quantize_per_channel(x, scales, zero_points, axis, 0, 255, torch.uint8)
        stored = zero_points if with_zero_points else None
        return q, quantized_decomposed.dequantize_per_channel(q, scales, stored, axis, 0, 255, torch.uint8)

    program = assert_batch_dynamic_equivalent(fn, x, batched=[axis == 1], **EXACT)
    _assert_qdq_only(program)


@pytest.mark.parametrize("opset", [13, 20])
@pytest.mark.parametrize("dtype", [torch.int16, torch.uint16])
def test_sixteen_bit_quantization_is_refused_before_opset_21(dtype, opset):
    low, high = (-32768, 32767) if dtype is torch.int16 else (0, 65535)

    def quantize(x):
        return quantized_decomposed.quantize_per_tensor(x, 0.1, 0, low, high, dtype)

    def dequantize(q):
        return quantized_decomposed.dequantize_per_channel(q, torch.tensor([0.1, 0.2, 0.3]), None, 1, low, high, dtype)

    message = (
        f"{dtype}".removeprefix("torch.")
        + f" quantization needs QuantizeLinear/DequantizeLinear of opset 21 .* at opset {opset}"
    )
    with pytest.raises(dynexport.errors.TranslationError, match=f"quantize_per_tensor.*{message}"):
        dynexport.export(quantize, (_randn(2, 3),), opset_version=opset)
    with pytest.raises(dynexport.errors.TranslationError, match=f"dequantize_per_channel.*{message}"):
        dynexport.export(dequantize, (torch.ones(2, 3, dtype=dtype),), opset_version=opset)


@pytest.mark.parametrize("opset", [13, 23])
def test_per_channel_weights_at_opset_range_ends(opset):
    weight = torch.tensor([[-128, 5, 127], [3, -7, 0]], dtype=torch.int8)
    scales, zero_points = torch.tensor([0.01, 0.02]), torch.tensor([1, -2])

    def fn(x):
        w = quantized_decomposed.dequantize_per_channel(weight, scales, zero_points, 0, -128, 127, torch.int8)
        y = torch.nn.functional.linear(x, w)
        q = quantized_decomposed.quantize_per_tensor(y, 0.005, 10, 0, 255, torch.uint8)
        return quantized_decomposed.dequantize_per_tensor(q, 0.005, 10, 0, 255, torch.uint8)

    program = assert_batch_dynamic_equivalent(fn, _randn(4, 3), opset_version=opset, optimize=False, **EXACT)
    assert op_histogram(program)["DequantizeLinear"] == 2


def test_dynamic_quantization_with_choose_qparams():
    def fn(x):
        scale, zero_point = quantized_decomposed.choose_qparams.tensor(x, 0, 255, 1e-5, torch.uint8)
        q = quantized_decomposed.quantize_per_tensor.tensor(x, scale, zero_point, 0, 255, torch.uint8)
        return (
            scale,
            zero_point,
            quantized_decomposed.dequantize_per_tensor.tensor(q, scale, zero_point, 0, 255, torch.uint8),
        )

    x = _randn(4, 6) + 0.5
    program = assert_batch_dynamic_equivalent(fn, x, **EXACT)
    assert op_histogram(program)["QuantizeLinear"] == 1


# -- half-precision models -------------------------------------------------------------------


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 5))

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        return self.head(x.mean(dim=(2, 3))).softmax(-1)


@pytest.mark.parametrize("opset", [20, 22])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_export_and_run(dtype, opset):
    torch.manual_seed(0)
    model = SmallCNN().eval().to(dtype)
    program = assert_batch_dynamic_equivalent(model, torch.randn(2, 3, 6, 6).to(dtype), opset_version=opset)
    assert program.model.graph.outputs[0].dtype.name == {torch.float16: "FLOAT16", torch.bfloat16: "BFLOAT16"}[dtype]
