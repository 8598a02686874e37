"""Quantized models end to end: eager-mode (prepare/convert), FX graph mode (prepare_fx/convert_fx
and its reference form), quantization-aware training (prepare_qat, fused conv-bn-relu) and the
QDQ form PT2E's convert_pt2e produces, each exported with a dynamic batch and compared with
eager PyTorch in onnxruntime at the example and at another batch.

The bound (docs/quantization.md): the exported graph computes what PyTorch's quantized kernels
compute. Run with onnxruntime's graph optimizations off, a single quantized op's output equals
eager PyTorch's, or is one step of its output scale off where the kernel rounds its own way
(averaging kernels' ties, qnnpack's and oneDNN's requantization) or where two float
convolutions, summed in different orders, round a value within float error of a tie apart; in a
chain, later layers carry such a step forward. With onnxruntime's default optimizations, which
fuse DequantizeLinear -> op -> QuantizeLinear into integer kernels (QLinearConv, QGemm, ...) that
round their own way, each fused op can add a step. Each test states its bound in steps.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import (
    DeQuantStub,
    QuantStub,
    convert,
    disable_observer,
    float_qparams_weight_only_qconfig,
    fuse_modules,
    fuse_modules_qat,
    get_default_qat_qconfig,
    get_default_qconfig,
    get_default_qconfig_mapping,
    prepare,
    prepare_qat,
)
from torch.ao.quantization.quantize_fx import convert_fx, convert_to_reference_fx, prepare_fx

import dynexport
from tests.equivalence import assert_batch_dynamic_equivalent, assert_exports_equivalent, op_histogram

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.ao.quantization is deprecated",
    "ignore:.*quantized tensor creation functions.*",
    "ignore:Please use quant_min and quant_max",
    "ignore:.*TypedStorage is deprecated",
)

quantized_decomposed = torch.ops.quantized_decomposed


@pytest.fixture(autouse=True)
def seeded_weights():
    """Modules initialize their weights from torch's global generator: the same in every run."""
    torch.manual_seed(0)


def _randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _quantized(model: nn.Module, example: torch.Tensor, qconfig="x86") -> nn.Module:
    """``model`` through eager-mode post-training quantization, calibrated on wider data than
    the example so that the example does not saturate."""
    model.eval()
    model.qconfig = get_default_qconfig(qconfig) if isinstance(qconfig, str) else qconfig
    prepared = prepare(model)
    for seed in range(3):
        prepared(_randn(*example.shape, seed=seed + 1) * 1.5)
    return convert(prepared)


def _unoptimized(program: dynexport.ONNXProgram, x: torch.Tensor) -> torch.Tensor:
    """The exported graph's own arithmetic: onnxruntime without its QDQ fusions."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (result,) = session.run(None, program.input_feeds(x))
    return torch.from_numpy(np.asarray(result))


def assert_quantized_export(model, x, *, step: float, fused_steps: int = 1, rounding_steps: int = 0, **options):
    """Export ``model`` with a dynamic batch; compare with eager PyTorch at ``x`` and at three
    times its batch: with onnxruntime's defaults within ``fused_steps`` steps of the output scale
    ``step``, and without its fusions within ``rounding_steps`` (0: equal; 1 where a kernel
    rounds ties its own way or two float convolutions sum in different orders)."""
    program = assert_batch_dynamic_equivalent(model, x, atol=fused_steps * step * 1.0001, rtol=0.0, **options)
    for inputs in (x, torch.cat([x, x.flip(0), x])):
        with torch.no_grad():
            expected = model(inputs)
        difference = (_unoptimized(program, inputs) - expected).abs().max().item()
        assert difference <= rounding_steps * step * 1.0001, f"{difference / step:.2f} steps from eager"
    return program


class Quantized(nn.Module):
    """``body`` between a QuantStub and a DeQuantStub, as eager-mode quantization wants it."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.quant, self.body, self.dequant = QuantStub(), body, DeQuantStub()

    def forward(self, x):
        return self.dequant(self.body(self.quant(x)))


def _output_scale(model: nn.Module) -> float:
    """The scale of the last quantized module's output."""
    *_, last = (m for m in model.modules() if isinstance(getattr(m, "scale", None), float))
    return last.scale


# -- eager mode ------------------------------------------------------------------------------


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.grouped = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2, padding_mode="reflect")
        self.skip = nnq.FloatFunctional()
        self.act = nn.Hardswish()
        self.up = nn.Upsample(scale_factor=2)
        self.head = nn.Conv2d(8, 4, 1, stride=2)

    def forward(self, x):
        x = self.pool(self.relu(self.conv(x)))
        x = self.act(self.skip.add_relu(x, self.grouped(x)))
        return torch.flatten(self.head(self.up(x)), 1)


@pytest.mark.parametrize("opset", [14, 17, 23])  # HardSwish exists from opset 14
def test_eager_quantized_convnet(opset):
    model = _quantized(fuse_modules(Quantized(ConvNet()).eval(), [["body.conv", "body.relu"]]), _randn(2, 3, 8, 8))
    program = assert_quantized_export(
        model, _randn(2, 3, 8, 8), step=_output_scale(model), fused_steps=2, opset_version=opset
    )
    histogram = op_histogram(program)
    assert histogram["DequantizeLinear"] > histogram["QuantizeLinear"] >= 5  # int8 weights behind DequantizeLinear
    int8 = {name for name, value in program.model.graph.initializers.items() if value.dtype.name == "INT8"}
    assert "body.grouped.weight" in int8  # (the smaller weights' DequantizeLinear folds: as floats they are small)


@pytest.mark.parametrize("opset", [13, None], ids=["opset13", "default-opset"])
@pytest.mark.parametrize(
    "body, shape",
    [
        (lambda: nn.Conv1d(3, 4, 3, padding=1), (2, 3, 10)),
        (lambda: nn.Conv3d(3, 4, 3, padding=1), (2, 3, 4, 5, 5)),
        (lambda: nn.Sequential(nn.Linear(8, 6), nn.ReLU6()), (2, 5, 8)),
    ],
    ids=["conv1d", "conv3d", "linear_3d_relu6"],
)
def test_eager_quantized_layers(body, shape, opset):
    model = _quantized(Quantized(body()), _randn(*shape))
    assert_quantized_export(model, _randn(*shape), step=_output_scale(model), opset_version=opset)


def test_conv_transpose_with_per_tensor_weights(quantized_engine):
    # Per-tensor weights: PyTorch has no per-channel ConvTranspose. The x86 engine's
    # ConvTranspose2d kernel is tens of steps off conv_transpose2d on some CPUs (seen on an
    # AVX2-only AMD EPYC), as its 1d kernel is everywhere (test_conv_transpose_1d): the eager reference is
    # qnnpack's, the engine the qconfig is made for.
    quantized_engine("qnnpack")
    qconfig = get_default_qconfig("qnnpack")
    model = _quantized(Quantized(nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1)), _randn(2, 3, 5, 5), qconfig)
    assert_quantized_export(model, _randn(2, 3, 5, 5), step=_output_scale(model), rounding_steps=1)


class Activations(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(4)
        self.elu, self.leaky = nn.ELU(), nn.LeakyReLU(0.2)
        self.layer_norm, self.group_norm = nn.LayerNorm(5), nn.GroupNorm(2, 4)

    def forward(self, x):
        x = self.leaky(self.elu(self.norm(x)))
        x = self.group_norm(self.layer_norm(x))
        return torch.cat([torch.sigmoid(x), torch.tanh(x), F.hardsigmoid(x), F.hardtanh(x, -0.5, 0.5)], dim=1)


def test_eager_quantized_activations_and_norms():
    model = _quantized(Quantized(Activations()), _randn(3, 4, 5, 5))
    # torch.cat keeps its first input's parameters: sigmoid's fixed 1/256.
    assert_quantized_export(model, _randn(3, 4, 5, 5), step=1.0 / 256)


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.add, self.mul, self.cat = nnq.FloatFunctional(), nnq.FloatFunctional(), nnq.FloatFunctional()
        self.add_scalar, self.mul_scalar = nnq.FloatFunctional(), nnq.FloatFunctional()

    def forward(self, x):
        y = self.conv(x)
        z = self.mul.mul(self.add.add(x, y), y)
        z = self.mul_scalar.mul_scalar(self.add_scalar.add_scalar(z, 0.75), -1.5)
        return self.cat.cat([z, x.mean(1, keepdim=True), y[:, :1].transpose(2, 3)], dim=1)


def test_eager_quantized_functional():
    model = _quantized(Quantized(Functional()), _randn(2, 3, 6, 6))
    # Six quantized ops in a row, the last a multiplication by -1.5: fused kernels' steps add up.
    assert_quantized_export(model, _randn(2, 3, 6, 6), step=model.body.cat.scale, fused_steps=4)


@pytest.mark.parametrize(
    "pool",
    [nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Upsample(scale_factor=2, mode="bilinear")],
    ids=["avg_pool", "adaptive_avg_pool", "bilinear"],
)
def test_eager_quantized_averaging_rounds_within_one_step(pool):
    model = _quantized(Quantized(pool), _randn(3, 3, 8, 8))
    step = model.quant.scale.item()  # averaging keeps the input's parameters
    assert_quantized_export(model, _randn(3, 3, 8, 8), step=step, rounding_steps=1)


class Direct(nn.Module):
    """A quantized module built directly (as ``convert`` would make it), between a Quantize and
    a DeQuantize; ``twice`` passes the quantized input as both operands."""

    def __init__(self, module: nn.Module, method: str = "forward", twice: bool = False):
        super().__init__()
        self.quant, self.module, self.dequant = nnq.Quantize(0.05, 128, torch.quint8), module, nnq.DeQuantize()
        self.method, self.twice = method, twice

    def forward(self, x):
        q = self.quant(x)
        operation = getattr(self.module, self.method)
        return self.dequant(operation(q, q.transpose(-1, -2)) if self.twice else operation(q))


def _with_weight(module: nn.Module, out_features: int, in_features: int) -> nn.Module:
    weight = torch.quantize_per_tensor(_randn(out_features, in_features, seed=3) * 0.3, 0.005, 0, torch.qint8)
    module.set_weight_bias(weight, _randn(out_features, seed=4) * 0.1)
    module.scale, module.zero_point = 0.02, 90
    return module


def _matmul() -> nnq.QFunctional:
    functional = nnq.QFunctional()
    functional.scale, functional.zero_point = 0.1, 100
    return functional


def _conv_add_relu() -> nn.Module:
    conv = nniq.ConvAddReLU2d(4, 4, 3, padding=1)
    conv.scale, conv.zero_point = 0.1, 20
    return conv


@pytest.mark.parametrize(
    "engine, model, shape, step, rounding_steps",
    [
        ("x86", lambda: Direct(nnq.Softmax(1, 1.0 / 256, 0)), (2, 4, 5), 1.0 / 256, 0),
        ("x86", lambda: Direct(nnq.Sigmoid(1.0 / 256, 0)), (2, 4, 5), 1.0 / 256, 0),
        (
            "x86",
            lambda: Direct(nnq.InstanceNorm2d(4, nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4)), 0.04, 120)),
            (2, 4, 5, 5),
            0.04,
            0,
        ),
        ("x86", lambda: Direct(_matmul(), "matmul", twice=True), (2, 4, 4), 0.1, 0),
        # Fused modules only oneDNN's engine has kernels for.
        ("onednn", lambda: Direct(_with_weight(nniq.LinearLeakyReLU(6, 5, 0.1), 5, 6)), (2, 3, 6), 0.02, 0),
        ("onednn", lambda: Direct(_with_weight(nniq.LinearTanh(6, 5), 5, 6)), (2, 3, 6), 0.02, 0),
        # oneDNN adds the second input to the convolution after requantizing its own way.
        ("onednn", lambda: Direct(_conv_add_relu(), twice=True), (2, 4, 6, 6), 0.1, 1),
    ],
    ids=["softmax", "sigmoid", "instance_norm", "matmul", "linear_leaky_relu", "linear_tanh", "conv_add_relu"],
)
def test_quantized_modules_built_directly(engine, model, shape, step, rounding_steps, quantized_engine):
    quantized_engine(engine)
    assert_quantized_export(model().eval(), _randn(*shape) * 2, step=step, rounding_steps=rounding_steps)


@pytest.fixture
def quantized_engine():
    """Sets torch's quantized engine for one test."""
    previous = torch.backends.quantized.engine
    yield lambda engine: setattr(torch.backends.quantized, "engine", engine)
    torch.backends.quantized.engine = previous


def test_conv_transpose_1d(quantized_engine):
    # x86's fbgemm ConvTranspose1d kernel computes something else than conv_transpose1d (tens of
    # steps off); qnnpack's computes it, and requantizes with its own rounding.
    quantized_engine("qnnpack")
    model = _quantized(Quantized(nn.ConvTranspose1d(4, 3, 3, stride=2)), _randn(2, 4, 7), "qnnpack")
    assert_quantized_export(model, _randn(2, 4, 7), step=_output_scale(model), rounding_steps=1)


class Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding, self.bag = nn.Embedding(20, 6), nn.EmbeddingBag(20, 6, mode="sum")

    def forward(self, indices, offsets):
        return self.embedding(indices).sum(1) + self.bag(indices.flatten(), offsets)


def test_weight_only_quantized_embeddings():
    model = Embeddings().eval()
    for module in (model.embedding, model.bag):
        module.qconfig = float_qparams_weight_only_qconfig
    model = convert(prepare(model))
    assert type(model.bag).__module__.startswith("torch.ao.nn.quantized")

    def example(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(0, 20, (batch, 4), generator=torch.Generator().manual_seed(batch)), torch.arange(batch) * 4

    batch = torch.export.Dim("batch")
    assert_exports_equivalent(model, example(3), dynamic_shapes=({0: batch}, {0: batch}), resized=[example(7)])


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("dtype", [torch.qint8, torch.float16])
def test_dynamically_quantized_linear(dtype):
    model = torch.ao.quantization.quantize_dynamic(Mlp().eval(), {nn.Linear}, dtype=dtype)
    assert type(model.up).__module__.startswith("torch.ao.nn.quantized.dynamic")
    # The input's parameters come from its own range: the other sizes and ranges get their own.
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},)
    program = assert_exports_equivalent(
        model, (_randn(3, 5, 16),), dynamic_shapes=dims, resized=[(_randn(4, 9, 16, seed=2) * 3,)]
    )
    assert op_histogram(program)["QuantizeLinear"] == (2 if dtype is torch.qint8 else 0)


class QuantizesInForward(nn.Module):
    """Quantized tensors made and read by the forward itself."""

    def forward(self, x):
        q = torch.quantize_per_tensor(x, 0.05, 3, torch.qint8)
        integers = q.int_repr()
        pooled = F.max_pool2d(F.pad(q, (1, 1, 1, 1), value=0.33), 2)  # the pad value rounded to the grid
        per_channel = torch.quantize_per_channel(
            x, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 5, -5]), 1, torch.qint8
        )
        return (
            pooled.dequantize() * q.q_scale(),
            integers.float(),
            per_channel.contiguous().dequantize().transpose(1, 3),
        )


def test_quantize_per_tensor_and_dequantize_in_forward():
    x = _randn(2, 3, 6, 6) * 4  # saturates the int8 range
    program = assert_batch_dynamic_equivalent(QuantizesInForward(), x, rtol=0.0, atol=0.0)
    assert op_histogram(program)["QuantizeLinear"] == 4  # the tensors, the integers, the padded one


# -- FX graph mode ----------------------------------------------------------------------------


class FxNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        x = x + self.conv2(x)
        x = torch.sigmoid(x) * x
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.parametrize("convert_function", [convert_fx, convert_to_reference_fx], ids=["convert_fx", "reference"])
def test_fx_graph_mode_quantized(convert_function):
    x = _randn(2, 3, 8, 8)
    prepared = prepare_fx(FxNet().eval(), get_default_qconfig_mapping("x86"), (x,))
    for seed in range(3):
        prepared(_randn(4, 3, 8, 8, seed=seed + 1))
    model = convert_function(prepared)
    if convert_function is convert_fx:
        # The quantized fc's own scale; adaptive_avg_pool2d's quantized kernel rounds its ties its own way.
        assert_quantized_export(model, x, step=_output_scale(model), fused_steps=5, rounding_steps=1)
    else:
        # The reference form: float ops between torch.quantize_per_tensor and dequantize, fc's output
        # last. PyTorch's float convolutions and onnxruntime's sum in different orders: a value
        # within float error of a rounding tie can go the other way, and later layers carry it.
        (*_, step) = (value.item() for name, value in model.named_buffers() if "scale" in name and value.numel() == 1)
        assert_quantized_export(model, x, step=step, fused_steps=5, rounding_steps=3)


# -- torchvision's quantizable models ----------------------------------------------------------


@pytest.mark.slow  # 15 to 50 s each
@pytest.mark.parametrize(
    "name, fused_steps, rounding_steps",
    [
        ("resnet18", 6, 6),
        ("mobilenet_v3_large", 4, 4),
        ("mobilenet_v2", 4, 4),
        ("shufflenet_v2_x0_5", 4, 4),
        ("googlenet", 4, 4),
    ],
)
def test_torchvision_quantized_classifiers(torchvision, name, fused_steps, rounding_steps):
    from torchvision.models import quantization

    options = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    model = getattr(quantization, name)(weights=None, quantize=False, num_classes=10, **options).eval()
    model.fuse_model()
    model = _quantized(model, _randn(2, 3, 64, 64))
    # Eighteen and more quantized layers: each can move a value by a step, and the next carry it.
    assert_quantized_export(
        model, _randn(2, 3, 64, 64), step=_output_scale(model), fused_steps=fused_steps, rounding_steps=rounding_steps
    )


# -- quantization-aware training ----------------------------------------------------------------


class QatNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = QuantStub(), DeQuantStub()
        self.conv, self.norm, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.relu(self.norm(self.conv(self.quant(x))))
        return self.dequant(self.fc(x.mean((2, 3))))


def _qat(qconfig) -> nn.Module:
    model = fuse_modules_qat(QatNet().train(), [["conv", "norm", "relu"]])
    model.qconfig = qconfig
    prepared = prepare_qat(model)
    for seed in range(3):
        prepared(_randn(4, 3, 6, 6, seed=seed + 1))
    return prepared.eval()


@pytest.mark.parametrize("opset", [13, 23])
@pytest.mark.parametrize("backend", ["x86", "qnnpack"], ids=["per_channel", "per_tensor"])
def test_qat_model_frozen(backend, opset):
    model = _qat(get_default_qat_qconfig(backend))
    model.apply(disable_observer)
    program = assert_batch_dynamic_equivalent(model, _randn(2, 3, 6, 6), rtol=0.0, atol=0.0, opset_version=opset)
    histogram = op_histogram(program)
    assert histogram["QuantizeLinear"] == histogram["DequantizeLinear"] == 3  # activations; weights folded
    assert type(model.conv.weight_fake_quant).__name__ == "FusedMovingAvgObsFakeQuantize"  # put back


def test_qat_model_with_observers_on_exports_current_qparams_and_warns():
    model = _qat(get_default_qat_qconfig("x86"))
    x = _randn(2, 3, 6, 6)
    with pytest.warns(UserWarning, match="still observe") as record:
        program = dynexport.export(model, (x,))
    assert record[0].filename == __file__  # the user's call
    assert model.conv.weight_fake_quant.observer_enabled.item() == 1  # the model is left as it was
    model.apply(disable_observer)
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), rtol=0.0, atol=0.0)


class QatFusions(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = QuantStub(), DeQuantStub()
        self.conv1d, self.norm1d = nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4)
        self.conv3d, self.norm3d, self.relu3d = nn.Conv3d(4, 4, 1), nn.BatchNorm3d(4), nn.ReLU()
        self.linear, self.norm = nn.Linear(4, 6), nn.BatchNorm1d(6)
        self.head, self.relu = nn.Linear(6, 3), nn.ReLU()

    def forward(self, x):
        x = self.norm1d(self.conv1d(self.quant(x)))
        x = self.relu3d(self.norm3d(self.conv3d(x[:, :, :, None, None]))).mean((2, 3, 4))
        return self.dequant(self.relu(self.head(self.norm(self.linear(x)))))


def test_qat_fused_conv1d_bn_conv3d_bn_relu_linear_bn_linear_relu():
    model = fuse_modules_qat(
        QatFusions().train(),
        [["conv1d", "norm1d"], ["conv3d", "norm3d", "relu3d"], ["linear", "norm"], ["head", "relu"]],
    )
    model.qconfig = get_default_qat_qconfig("x86")
    model = prepare_qat(model)
    for seed in range(3):
        model(_randn(4, 3, 8, seed=seed + 1))
    model.eval().apply(disable_observer)
    assert [type(m).__name__ for m in (model.conv1d, model.conv3d, model.linear, model.head)] == [
        "ConvBn1d",
        "ConvBnReLU3d",
        "LinearBn1d",
        "LinearReLU",
    ]
    step = model.head.activation_post_process.scale.item()
    assert_quantized_export(model, _randn(2, 3, 8), step=step, fused_steps=2)


def test_fixed_qparams_fake_quantize_and_learnable_refused():
    from torch.ao.quantization import MovingAverageMinMaxObserver, default_fixed_qparams_range_0to1_fake_quant
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize

    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), default_fixed_qparams_range_0to1_fake_quant()).eval()
    assert_batch_dynamic_equivalent(model, _randn(3, 4), rtol=0.0, atol=0.0)
    learnable = _LearnableFakeQuantize(MovingAverageMinMaxObserver, 0, 255, scale=0.1, zero_point=3.0)
    with pytest.raises(dynexport.errors.CaptureError, match="_LearnableFakeQuantize: dynexport exports FakeQuantize"):
        dynexport.export(nn.Sequential(nn.Linear(4, 4), learnable).eval(), (_randn(3, 4),))


# -- the PT2E form -----------------------------------------------------------------------------


class Pt2eConv(nn.Module):
    """What convert_pt2e leaves (torch.ao's quantize_pt2e moved to torchao, which is not
    installed here): quantize_per_tensor -> dequantize_per_tensor around float ops, int8
    weights behind dequantize_per_channel. The weights use 7 bits, as quantizers' reduce_range
    does for x86 CPUs without VNNI, where onnxruntime's int8 kernels sum pairs of 8-bit products
    into 16 bits and saturate (tens of steps off at a few outputs)."""

    def __init__(self):
        super().__init__()
        weight = _randn(8, 3, 3, 3) * 0.3
        self.weight_scale = weight.abs().amax((1, 2, 3)) / 63
        self.register_buffer("weight", torch.round(weight / self.weight_scale[:, None, None, None]).to(torch.int8))
        self.zero_points = torch.zeros(8, dtype=torch.int64)
        self.bias = _randn(8, seed=1) * 0.1

    def forward(self, x):
        q = quantized_decomposed.quantize_per_tensor(x, 0.03, 5, -128, 127, torch.int8)
        x = quantized_decomposed.dequantize_per_tensor(q, 0.03, 5, -128, 127, torch.int8)
        weight = quantized_decomposed.dequantize_per_channel(
            self.weight, self.weight_scale, self.zero_points, 0, -128, 127, torch.int8
        )
        y = torch.relu(F.conv2d(x, weight, self.bias, padding=1))
        q = quantized_decomposed.quantize_per_tensor(y, 0.02, -128, -128, 127, torch.int8)
        return quantized_decomposed.dequantize_per_tensor(q, 0.02, -128, -128, 127, torch.int8)


def test_pt2e_form_runs_fused_in_onnxruntime(tmp_path):
    model = Pt2eConv().eval()
    # onnxruntime's int8 QLinearConv requantizes its own way: up to 4 steps from PyTorch measured here.
    program = assert_quantized_export(model, _randn(2, 3, 6, 6) * 2, step=0.02, fused_steps=4)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ort.InferenceSession(program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert "QLinearConv" in {node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node}


class Pt2eNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        x = F.max_pool2d(x + self.conv2(x), 2)
        return self.fc(x.mean((2, 3)))


def test_torchao_pt2e_with_the_x86_quantizer():
    # torch 2.13's PT2E flow lives in torchao (not a dependency: this runs where it is installed).
    pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer

    x = _randn(2, 3, 8, 8)
    float_model = Pt2eNet().eval()
    captured = torch.export.export(float_model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    quantizer = x86_inductor_quantizer.X86InductorQuantizer()
    # reduce_range: 7-bit activations, as the quantizer asks on CPUs without VNNI (Pt2eConv's doc).
    quantizer.set_global(x86_inductor_quantizer.get_default_x86_inductor_quantization_config(reduce_range=True))
    prepared = prepare_pt2e(captured.module(), quantizer)
    for seed in range(3):
        prepared(_randn(4, 3, 8, 8, seed=seed + 1))
    model = convert_pt2e(prepared)
    # fc's output is float: one step of its quantized input, through the largest row of weights.
    last_quantize = [n for n in model.graph.nodes if n.target == quantized_decomposed.quantize_per_tensor.default][-1]
    step = last_quantize.args[1] * float_model.fc.weight.abs().sum(1).max().item()
    program = assert_quantized_export(model, x, step=step, rounding_steps=1)
    with torch.no_grad():
        torch.testing.assert_close(_unoptimized(program, x), model(x))  # the graph is PyTorch's computation
    assert op_histogram(program)["QuantizeLinear"] >= 4


# -- refusals and scoping ----------------------------------------------------------------------


def test_unknown_function_on_quantized_tensor_is_refused_with_its_name():
    class Exp(nn.Module):
        def forward(self, x):
            return torch.exp(torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)).dequantize()

    with pytest.raises(dynexport.errors.CaptureError, match=r"torch\.exp on a quantized tensor"):
        dynexport.export(Exp(), (_randn(2, 3),))

    def per_channel_view(x):
        scales, zero_points = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1, 2])
        return torch.quantize_per_channel(x, scales, zero_points, 1, torch.qint8).transpose(0, 1).dequantize()

    with pytest.raises(dynexport.errors.CaptureError, match=r"Tensor\.transpose on a per-channel quantized tensor"):
        dynexport.export(per_channel_view, (_randn(2, 3),))


def test_quantized_module_without_float_form_is_refused_and_model_left_unchanged():
    model = _quantized(Quantized(nn.Sequential(nn.Linear(4, 4))), _randn(2, 4))
    model.body.append(torch.ao.nn.quantized.dynamic.GRUCell(4, 4))
    with pytest.raises(
        dynexport.errors.CaptureError, match=r"GRUCell \(torch.ao.nn.quantized.dynamic.* has no float form"
    ):
        dynexport.export(model, (_randn(2, 4),))
    assert [type(m).__name__ for m in model.body] == ["Linear", "GRUCell"]
    assert type(model.body[0]).__module__.startswith("torch.ao.nn.quantized")


def test_quantized_tensor_held_by_a_module_is_refused_naming_it():
    class HoldsQuantized(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.quantize_per_tensor(_randn(4, 4), 0.1, 0, torch.qint8)

        def forward(self, x):
            return x @ self.table.dequantize()

    with pytest.raises(dynexport.errors.CaptureError, match=r"HoldsQuantized holds quantized tensors .*\(table\)"):
        dynexport.export(HoldsQuantized(), (_randn(2, 4),))


def test_quantized_modules_as_functions_keep_their_names():
    model = _quantized(Quantized(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Hardswish())), _randn(2, 3, 6, 6))
    program = dynexport.export(model, (_randn(2, 3, 6, 6),), export_modules_as_functions=True)
    assert {"Quantize", "Conv2d", "Hardswish"} <= {function.name for function in program.model.functions.values()}


def test_model_is_unchanged_after_export():
    model = _quantized(Quantized(ConvNet()), _randn(2, 3, 8, 8))
    before = [(name, type(m)) for name, m in model.named_modules()]
    dynexport.export(model, (_randn(2, 3, 8, 8),))
    assert [(name, type(m)) for name, m in model.named_modules()] == before
    model(_randn(2, 3, 8, 8))  # still runs as a quantized model
