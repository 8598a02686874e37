"""Activation, softmax and log-softmax rules against onnxruntime."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
from torch import nn

import dynexport
from dynexport.options import DEFAULT_OPSET
from tests.equivalence import (
    assert_batch_dynamic_equivalent,
    assert_close,
    assert_exports_equivalent,
    op_histogram,
)

aten = torch.ops.aten
B = torch.export.Dim("batch")
FLOAT_DTYPES = [torch.float32, torch.float16, torch.float64]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _prelu(num_parameters):
    module = nn.PReLU(num_parameters)
    with torch.no_grad():
        module.weight.copy_(torch.linspace(-0.5, 0.8, num_parameters))
    return module


ACTIVATIONS = {
    "relu": (nn.ReLU(), "Relu"),
    "relu6": (nn.ReLU6(), "Min"),
    "hardtanh": (nn.Hardtanh(-2.0, 3.0), "Min"),
    "sigmoid": (nn.Sigmoid(), "Sigmoid"),
    "silu": (nn.SiLU(), "Sigmoid"),
    "gelu": (nn.GELU(), "Gelu"),
    "gelu_tanh": (nn.GELU(approximate="tanh"), "Gelu"),
    "softplus": (nn.Softplus(), "Softplus"),
    "softplus_beta_threshold": (nn.Softplus(beta=2.0, threshold=1.5), "Softplus"),
    "leaky_relu": (nn.LeakyReLU(0.2), "LeakyRelu"),
    "hardswish": (nn.Hardswish(), "HardSwish"),
    "hardsigmoid": (nn.Hardsigmoid(), "HardSigmoid"),
    "elu": (nn.ELU(0.5), "Elu"),
    "selu": (nn.SELU(), "Selu"),
    "celu": (nn.CELU(0.7), "Exp"),
    "mish": (nn.Mish(), "Mish"),
    "logsigmoid": (nn.LogSigmoid(), "Softplus"),
    "prelu_shared": (_prelu(1), "PRelu"),
    "prelu_per_channel": (_prelu(4), "PRelu"),
    "glu_last": (nn.GLU(), "Split"),
    "glu_dim1": (nn.GLU(dim=1), "Split"),
    "threshold": (nn.Threshold(0.1, 20.0), "Where"),
    "softmax_last": (nn.Softmax(dim=-1), "Softmax"),
    "softmax_dim1": (nn.Softmax(dim=1), "Softmax"),
    "softmax_batch_dim": (nn.Softmax(dim=0), "Softmax"),
    "softmin": (nn.Softmin(dim=1), "Softmax"),
    "log_softmax": (nn.LogSoftmax(dim=-2), "LogSoftmax"),
}


_FLOAT64_KERNELS = {"Relu", "Min", "Sigmoid", "Split", "Where", "Softmax", "LogSoftmax", "Exp"}

# Activations whose ONNX op a later opset defines: below it they are composed, of these ops.
_COMPOSED_BELOW = {
    "gelu": (20, "Erf"), "gelu_tanh": (20, "Tanh"), "mish": (18, "Softplus"), "hardswish": (14, "HardSigmoid"),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_modules(name, dtype, tested_opset):
    module, onnx_op = ACTIVATIONS[name]
    if name in _COMPOSED_BELOW and (tested_opset or DEFAULT_OPSET) < _COMPOSED_BELOW[name][0]:
        onnx_op = _COMPOSED_BELOW[name][1]
    module = copy.deepcopy(module).to(dtype)
    if name == "celu" and dtype == torch.float32:
        onnx_op = "Celu"
    if onnx_op == "Min" and dtype != torch.float16:
        onnx_op = "Clip"  # the optimizer's fuse_clip (docs/optimizer.md)
    x = (torch.randn(2, 4, 6) * 4).to(dtype)
    # In onnxruntime itself, which has no float64 kernel for most activation ops: at float64
    # they are written out in ops it has.
    program = assert_batch_dynamic_equivalent(module, x, runtime="onnxruntime")
    if dtype != torch.float64 or onnx_op in _FLOAT64_KERNELS:
        assert op_histogram(program)[onnx_op] >= 1


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_modules_at_opset_bounds(name, opset):
    assert_batch_dynamic_equivalent(ACTIVATIONS[name][0], torch.randn(2, 4, 6) * 4, opset_version=opset)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_gelu_composed_below_opset_20(approximate, dtype):
    x = (torch.randn(3, 5) * 4).to(dtype)
    program = assert_batch_dynamic_equivalent(nn.GELU(approximate=approximate), x, opset_version=18, runtime="onnxruntime")
    ops = op_histogram(program)
    assert "Gelu" not in ops
    # onnxruntime has no float64 Erf: a series instead.
    assert ops["Erf" if approximate == "none" else "Tanh"] == (approximate == "tanh" or dtype != torch.float64)


@pytest.mark.parametrize("opset", [18, 20, 23])
def test_gelu_every_opset(opset):
    def both_modes(x):
        return nn.functional.gelu(x), nn.functional.gelu(x, approximate="tanh")

    program = assert_batch_dynamic_equivalent(both_modes, torch.randn(2, 7), opset_version=opset)
    assert ("Gelu" in op_histogram(program)) == (opset >= 20)


def test_softplus_threshold_boundary():
    # beta * x lands on both sides of the threshold, and exactly on it.
    x = torch.tensor([[-30.0, -1.0, 0.0, 0.74, 0.75, 0.76, 5.0, 40.0]])
    assert_batch_dynamic_equivalent(lambda a: (nn.functional.softplus(a, beta=2, threshold=1.5), nn.functional.softplus(a)), x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_elu_scale_and_input_scale(dtype):
    x = (torch.randn(2, 9) * 3).to(dtype)
    program = assert_batch_dynamic_equivalent(
        lambda a: (aten.elu(a, 1.5, 2.0, 0.5), aten.elu(a, 0.3, 1.7)), x, runtime="onnxruntime"
    )
    # onnxruntime has no float64 Elu: the formula instead.
    assert op_histogram(program)["Elu"] == (dtype != torch.float64)


def test_celu_after_a_cast_to_float64():
    # The old exporter tests' form: celu of x.double() (onnxruntime has no float64 Elu or Celu).
    assert_batch_dynamic_equivalent(
        lambda a: (nn.functional.celu(a.double()), nn.functional.celu(a.double(), alpha=2.0)),
        torch.randn(3, 4) * 3, runtime="onnxruntime",
    )


def test_log_sigmoid_is_finite_for_large_magnitudes():
    assert_batch_dynamic_equivalent(nn.functional.logsigmoid, torch.tensor([[-80.0, -20.0, 0.0, 20.0, 80.0]]))


def test_log_sigmoid_forward_output():
    program = assert_batch_dynamic_equivalent(lambda a: aten.log_sigmoid_forward(a)[0], torch.randn(3, 4) * 5)
    assert op_histogram(program)["Softplus"] == 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_prelu_kernel_and_prelu_ranks(dtype):
    two_d, three_d = torch.randn(4, 3, dtype=dtype) * 3, torch.randn(4, 3, 5, dtype=dtype) * 3
    weight = torch.tensor([0.25, -0.5, 2.0], dtype=dtype)
    program = assert_batch_dynamic_equivalent(
        lambda a, b: (
            torch.prelu(a, weight), torch.prelu(b, weight), aten._prelu_kernel(b, weight.view(3, 1))
        ),
        two_d, three_d, runtime="onnxruntime",
    )
    assert op_histogram(program)["PRelu"] == (3 if dtype != torch.float64 else 0)


def test_prelu_on_0d_and_1d_inputs():
    weight = torch.tensor([0.25])
    assert_exports_equivalent(
        lambda a, b: (torch.prelu(a, weight), torch.prelu(b, weight)), (torch.tensor(-3.0), torch.randn(6))
    )


def test_nan_propagates_like_pytorch():
    x = torch.tensor([[float("nan"), -2.0, 0.5, 8.0]])
    assert_batch_dynamic_equivalent(
        lambda a: (
            torch.relu(a), nn.functional.relu6(a), nn.functional.hardtanh(a), nn.functional.threshold(a, 0.0, 5.0)
        ),
        x,
    )


def test_integer_inputs():
    x = torch.arange(-4, 8).reshape(2, 6)
    program = assert_batch_dynamic_equivalent(
        lambda a: (
            torch.relu(a), torch.sigmoid(a), nn.functional.threshold(a, 1.5, -7), nn.functional.relu6(a),
            nn.functional.hardtanh(a, -2, 3),
        ),
        x,
    )
    assert program.model.graph.outputs[1].dtype.name == "FLOAT"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_softmax_dtype_argument(dtype):
    x = (torch.randn(2, 3, 5) * 3).to(dtype)
    assert_batch_dynamic_equivalent(
        lambda a: (
            nn.functional.softmax(a, -1, dtype=torch.float64),
            nn.functional.log_softmax(a, 1, dtype=torch.float32),
            nn.functional.softmax(a, -3, dtype=torch.float16),
        ),
        x,
    )


def test_core_softmax_overloads():
    x = torch.randn(2, 3, 5) * 3
    program = assert_batch_dynamic_equivalent(lambda a: (aten._softmax(a, -1, False), aten._log_softmax(a, 1, False)), x)
    assert op_histogram(program)["Softmax"] == op_histogram(program)["LogSoftmax"] == 1


@pytest.mark.parametrize("op", [aten._softmax.default, aten._log_softmax.default], ids=str)
def test_half_to_float(op):
    # Eager CPU refuses half_to_float, so the reference is the float op on the upcast input.
    x = torch.randn(2, 3, 5).half()
    reference = torch.softmax if op is aten._softmax.default else torch.log_softmax
    program = dynexport.export(lambda a: op(a, 1, True), (x,), dynamic_shapes=({0: B},))
    onnx.checker.check_model(program.model_proto, full_check=True)
    for inputs in (x, torch.cat([x, x, x])):
        assert_close(program(inputs), reference(inputs.float(), 1))


def test_softmax_on_0d_and_integer_inputs():
    assert_exports_equivalent(
        lambda a, i: (
            torch.softmax(a, 0), torch.log_softmax(a, -1), torch.softmax(i, 1, dtype=torch.float32)
        ),
        (torch.tensor(2.5), torch.arange(6).reshape(2, 3)),
    )


@pytest.mark.parametrize(
    "fn",
    [nn.functional.elu, nn.functional.selu, nn.functional.celu, nn.functional.hardsigmoid, nn.functional.hardswish, nn.functional.mish, nn.functional.softplus, nn.functional.logsigmoid,
     lambda x: nn.functional.elu(x, alpha=0.5) * 2],
    ids=["elu", "selu", "celu", "hardsigmoid", "hardswish", "mish", "softplus", "logsigmoid", "elu_scaled"],
)
def test_bfloat16_activations_without_onnx_bfloat16_kernels(fn):
    # Regression (property tests): these ONNX ops take bfloat16 only from opset 22.
    x = (torch.randn(2, 5) * 3).to(torch.bfloat16)
    program = assert_batch_dynamic_equivalent(fn, x, atol=2e-2, rtol=2e-2)
    assert program.model.graph.outputs[0].dtype.name == "BFLOAT16"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_relu_on_integers(dtype):
    # ONNX Relu has no unsigned kernel type; onnxruntime none for int16 and int64.
    x = torch.tensor([[0, 3, 100], [7, 1, 2]], dtype=dtype)
    if dtype.is_signed:
        x[1] = torch.tensor([-7, -1, torch.iinfo(dtype).min])
    assert_batch_dynamic_equivalent(torch.relu, x, runtime="onnxruntime")
