"""Node counts of representative models after the ONNX passes, so that a regression in folding
or fusion fails here (no timings). Each model is checked in onnxruntime against eager PyTorch at
the export size and at others; the counts are those of torch.onnx.export (dynamo=True) or fewer
(benchmarks/graph_quality.py measures both side by side)."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx_ir as ir
import pytest
import torch
from torch import nn

from dynexport.passes.onnx import optimize_model
from tests.equivalence import assert_exports_equivalent, op_histogram
from tests.passes.graphs import model, ops, run

Dim = torch.export.Dim


def _images(sides, channels=3):
    return [(torch.randn(b, channels, h, w),) for b, (h, w) in zip([2, 3, 1, 4], sides)]


def _image_dims(low=8):
    return ({0: Dim("batch"), 2: Dim("height", min=low, max=512), 3: Dim("width", min=low, max=512)},)


def _randomize_batchnorm_statistics(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.5, 0.5)
    return model.eval()


class Residual(nn.Module):
    """A ResNet basic block at 512 channels (the BatchNorm statistics are 2 KiB, over folding's
    small-result size), with a strided 1x1 downsample: Conv without bias into BatchNorm."""

    def __init__(self, c_in=64, c_out=512):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, c_out, 3, 2, 1, bias=False), nn.BatchNorm2d(c_out)
        self.conv2, self.bn2 = nn.Conv2d(c_out, c_out, 1, bias=False), nn.BatchNorm2d(c_out)
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, 2, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


def test_every_batchnorm_of_a_residual_block_folds_into_its_conv():
    torch.manual_seed(0)
    model_ = _randomize_batchnorm_statistics(Residual())
    program = assert_exports_equivalent(
        model_, _images([(8, 8)], 64)[0], dynamic_shapes=_image_dims(),
        resized=_images([(8, 8), (12, 10), (9, 9), (16, 10)], 64)[1:], atol=1e-4, rtol=1e-4,
    )
    assert op_histogram(program) == {"Conv": 3, "Relu": 2, "Add": 1}


class SharedWeights(nn.Module):
    """One convolution applied to two tensors, once followed by a BatchNorm; a ConvTranspose with groups
    and a Linear, each followed by a BatchNorm."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.up, self.up_bn = nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2), nn.BatchNorm2d(6)
        self.linear, self.linear_bn = nn.Linear(6, 5), nn.BatchNorm1d(5)

    def forward(self, x):
        y = self.up_bn(self.up(self.bn(self.conv(x)) + self.conv(torch.relu(x))))
        return self.linear_bn(self.linear(y.mean((2, 3))))


def test_batchnorm_folds_into_a_shared_conv_a_grouped_conv_transpose_and_a_linear():
    torch.manual_seed(0)
    model_ = _randomize_batchnorm_statistics(SharedWeights())
    calls = _images([(6, 6), (5, 9), (8, 4), (7, 7)], 4)
    program = assert_exports_equivalent(model_, calls[0], dynamic_shapes=_image_dims(2), resized=calls[1:], atol=1e-5)
    histogram = op_histogram(program)
    assert "BatchNormalization" not in histogram and histogram["Conv"] == 2 and histogram["ConvTranspose"] == 1
    assert histogram["Gemm"] == 1


class DepthwiseSeparable(nn.Module):
    """MobileNet-style: depthwise 3x3 + BatchNorm + ReLU6, pointwise 1x1 + BatchNorm + hardtanh."""

    def __init__(self):
        super().__init__()
        self.depthwise = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.pointwise = nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), nn.Hardtanh(-2.0, 3.0))

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


def test_relu6_and_hardtanh_become_clip_and_keep_nan():
    torch.manual_seed(0)
    model_ = _randomize_batchnorm_statistics(DepthwiseSeparable())
    calls = _images([(8, 8), (5, 11), (9, 3), (6, 6)], 8)
    calls[1][0][0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    program = assert_exports_equivalent(model_, calls[0], dynamic_shapes=_image_dims(2), resized=calls[1:], atol=1e-5)
    assert op_histogram(program) == {"Conv": 2, "Clip": 2}


def test_the_fusions_constants_are_stored_once():
    """MobileNetV2's 35 ReLU6 are 35 Clips to the same bounds: two initializers, not 70."""
    model_ = nn.Sequential(*(nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU6()) for _ in range(3))).eval()
    program = assert_exports_equivalent(model_, torch.randn(2, 8, 5, 5), atol=1e-5)
    bounds = {node.inputs[1].name for node in program.model.graph if node.op_type == "Clip"}
    bounds |= {node.inputs[2].name for node in program.model.graph if node.op_type == "Clip"}
    assert op_histogram(program) == {"Conv": 3, "Clip": 3} and len(bounds) == 2


def _clamped(dtype: str, low: str = "0.0", high: str = "6.0") -> ir.Model:
    return model(f"""g ({dtype}[N] x) => ({dtype}[N] y) <{dtype} low = {{{low}}}, {dtype}[1] high = {{{high}}}> {{
        m = Max(x, low)
        y = Min(high, m)
    }}""")


def test_clamps_as_clip_is_an_option_and_only_for_float_and_double():
    """Clip is slower than Max + Min in onnxruntime at float16 and no faster for integers."""
    x = np.array([np.nan, -1.0, 3.0, 9.0, np.inf], np.float32)
    fused = _clamped("float")
    optimize_model(fused)
    assert ops(fused) == ["Clip"]
    np.testing.assert_array_equal(run(fused, x=x)[0], [np.nan, 0.0, 3.0, 6.0, 6.0])
    strict = _clamped("float")
    optimize_model(strict, clamps_as_clip=False)
    assert ops(strict) == ["Max", "Min"]
    integer = _clamped("int32", "0", "6")
    optimize_model(integer)
    assert ops(integer) == ["Max", "Min"]


class BidirectionalLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def test_lstm_gate_reordering_of_large_weights_folds_away():
    """Each 16 KiB weight is sliced into its four gates and concatenated in ONNX's order: the
    slices and concatenations fold together, the weight dying with them."""
    torch.manual_seed(0)
    calls = [(torch.randn(b, t, 16),) for b, t in [(2, 9), (3, 4), (1, 12), (4, 1)]]
    program = assert_exports_equivalent(
        BidirectionalLSTM().eval(), calls[0], dynamic_shapes=({0: Dim("batch"), 1: Dim("steps")},), resized=calls[1:],
        atol=1e-5,
    )
    histogram = op_histogram(program)
    assert histogram["LSTM"] == 2 and "Concat" not in {op for op, n in histogram.items() if n > 1}
    assert sum(histogram.values()) <= 16


class Normalized(nn.Module):
    def __init__(self):
        super().__init__()
        self.group, self.instance = nn.GroupNorm(4, 16), nn.InstanceNorm2d(16, affine=True)
        for norm in (self.group, self.instance):
            norm.weight.data.uniform_(0.5, 1.5)
            norm.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.instance(torch.relu(self.group(x)) * 3 + 50)


def _error_from_float64(program, module: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """How far ``program`` and eager float32 ``module`` are from float64 at ``x``."""
    with torch.no_grad():
        precise, eager = module.double()(x.double()), module.float()(x).double()
    return (program(x).double() - precise).abs().max().item(), (eager - precise).abs().max().item()


@pytest.mark.parametrize("exact_norms", [False, True], ids=["default", "exact"])
@pytest.mark.parametrize("opset", [13, 20])
def test_group_and_instance_norm_become_instance_normalization(opset, exact_norms):
    """At every opset (below 17 from the written-out formula) the group norm is Unsqueeze,
    Reshape, InstanceNormalization, Reshape, Squeeze and its affine as one BatchNormalization,
    and the instance norm one InstanceNormalization: torch.onnx's node count. onnxruntime's
    InstanceNormalization computes x * s + (b - mean * s), which cancels on inputs whose mean is
    large against their spread, to a few times eager float32's own error (its mean's rounding);
    ``exact_norms`` feeds it x minus its first element (a Slice and a Sub more per norm), and
    it stays near the float64 result."""
    torch.manual_seed(0)
    model_ = Normalized().eval()
    calls = [(torch.randn(b, 16, h, w) * 3,) for b, (h, w) in zip([2, 3, 1, 4], [(6, 6), (5, 9), (8, 3), (7, 7)])]
    program = assert_exports_equivalent(
        model_, calls[0], dynamic_shapes=_image_dims(2), resized=calls[1:], atol=1e-4, opset_version=opset,
        exact_norms=exact_norms,
    )
    histogram = op_histogram(program)
    assert histogram["InstanceNormalization"] == 2 and histogram["BatchNormalization"] == 1
    # The two norms' 7, and the Relu, Mul, Add between them; a Slice and a Sub per norm exact.
    assert sum(histogram.values()) == (14 if exact_norms else 10)
    assert histogram.get("Slice", 0) == histogram.get("Sub", 0) == (2 if exact_norms else 0)
    error, eager_error = _error_from_float64(program, model_, 1000 + torch.randn(2, 16, 5, 7) * 0.05)
    assert error < (1e-4 if exact_norms else 10 * eager_error)


@pytest.mark.parametrize("exact_norms", [False, True], ids=["default", "exact"])
@pytest.mark.parametrize("opset", [13, 20])
def test_one_group_norm_is_the_widened_input_normalized(opset, exact_norms):
    """GroupNorm(1, C), PoolFormer's and ConvNeXt's channel norm: (N, 1, C, *S) is its one group
    already, so no Reshape either way: Unsqueeze, InstanceNormalization, Squeeze and the affine
    BatchNormalization (``exact_norms``: a Slice and a Sub before the normalization)."""
    torch.manual_seed(0)
    norm = nn.GroupNorm(1, 16)
    norm.weight.data.uniform_(0.5, 1.5)
    norm.bias.data.uniform_(-0.5, 0.5)
    calls = [(torch.randn(b, 16, h, w) * 3,) for b, (h, w) in zip([2, 3, 1, 4], [(6, 6), (5, 9), (8, 3), (7, 7)])]
    program = assert_exports_equivalent(
        norm.eval(), calls[0], dynamic_shapes=_image_dims(2), resized=calls[1:], atol=1e-4, opset_version=opset,
        exact_norms=exact_norms,
    )
    shifting = {"Slice": 1, "Sub": 1} if exact_norms else {}
    assert op_histogram(program) == {
        "Unsqueeze": 1, **shifting, "InstanceNormalization": 1, "Squeeze": 1, "BatchNormalization": 1,
    }
    error, eager_error = _error_from_float64(program, norm, 1000 + torch.randn(2, 16, 5, 7) * 0.05)
    assert error < (1e-4 if exact_norms else 10 * eager_error)


class Unshuffle(nn.Module):
    def forward(self, x):
        return nn.functional.pixel_unshuffle(x, 2) * 2


def test_floor_division_of_sizes_is_one_div():
    """Sizes are never negative: their floor division by a positive number is ONNX's Div."""
    calls = [(torch.randn(b, 3, 2 * h, 2 * w),) for b, h, w in [(2, 4, 5), (1, 3, 7), (3, 1, 1), (2, 8, 2)]]
    dims = ({0: Dim("batch"), 2: 2 * Dim("half_height", max=64), 3: 2 * Dim("half_width", max=64)},)
    program = assert_exports_equivalent(Unshuffle(), calls[0], dynamic_shapes=dims, resized=calls[1:])
    histogram = op_histogram(program)
    assert histogram["Div"] <= 2 and not {"Less", "Xor", "And", "Not"} & set(histogram)


def test_layer_norm_without_affine_gets_a_scale_of_the_normalized_shape():
    """onnxruntime's LayerNormalization is several times slower with a scale that broadcasts."""
    model_ = nn.Sequential(nn.LayerNorm([4, 6], elementwise_affine=False), nn.InstanceNorm1d(4)).eval()
    calls = [(torch.randn(b, 4, 6) * 5 + 2,) for b in (2, 5, 1)]
    batch = ({0: Dim("batch")},)
    program = assert_exports_equivalent(model_, calls[0], dynamic_shapes=batch, resized=calls[1:], atol=1e-5)
    scales = [node.inputs[1].shape for node in program.model.graph if node.op_type == "LayerNormalization"]
    assert scales == [ir.Shape([4, 6]), ir.Shape([6])]


def test_mean_over_dims_declared_nonempty_is_one_reduce_mean():
    """A mean over dims that may be 0 divides explicitly (ReduceMean of nothing gives 0, PyTorch
    NaN); over dims declared at least 3 it is ReduceMean."""

    def pooled(x):
        return x.mean((2, 3))

    calls = [(torch.randn(b, 3, h, w),) for b, h, w in [(2, 8, 9), (1, 3, 5), (3, 16, 4)]]
    declared = ({0: Dim("batch"), 2: Dim("height", min=3), 3: Dim("width", min=3)},)
    program = assert_exports_equivalent(pooled, calls[0], dynamic_shapes=declared, resized=calls[1:], atol=1e-6)
    assert dict(op_histogram(program)) == {"ReduceMean": 1}
    program = assert_exports_equivalent(
        pooled, calls[0], dynamic_shapes=({0: Dim("batch"), 2: Dim("height"), 3: Dim("width")},),
        resized=[*calls[1:], (torch.randn(2, 3, 0, 4),)], atol=1e-6,
    )
    assert "ReduceMean" not in op_histogram(program)


def test_mean_over_dims_declared_at_least_one_is_one_reduce_mean_also_through_a_multiple():
    """The least size the program accepts is the declared one, also below torch's assumed 2
    (``min=1``) and for the root of a multiple the model makes of a dim (``h = 8*_h``, h from 8:
    ``_h`` from 1, tresnet's pooled maps)."""

    def pooled(x):
        return x.mean((2, 3))

    calls = [(torch.randn(b, 3, h, w),) for b, h, w in [(2, 8, 9), (1, 1, 1), (3, 16, 4)]]
    declared = ({0: Dim("batch"), 2: Dim("height", min=1), 3: Dim("width", min=1)},)
    program = assert_exports_equivalent(pooled, calls[0], dynamic_shapes=declared, resized=calls[1:], atol=1e-6)
    assert dict(op_histogram(program)) == {"ReduceMean": 1}

    def patch_means(x):
        return x.unflatten(2, (-1, 8)).mean(2)

    calls = [(torch.randn(b, 3, h, 5),) for b, h in [(2, 16), (1, 8), (3, 40)]]
    for minimum, means in ((8, 1), (0, 0)):
        with pytest.warns(UserWarning, match=r"height = 8\*_height"):
            program = assert_exports_equivalent(
                patch_means, calls[0], dynamic_shapes=({0: Dim("batch"), 2: Dim("height", min=minimum)},),
                resized=calls[1:], atol=1e-6,
            )
        assert op_histogram(program)["ReduceMean"] == means, minimum


class _SqueezeExcite(nn.Module):
    """timm's squeeze-and-excitation: a mean over the map a convolution made, padded by the
    convolution or, as timm's ``tf_`` models do, by TensorFlow's "same" rule computed from the
    input's size."""

    def __init__(self, padding: int | str):
        super().__init__()
        self.tf_same = padding == "tf_same"
        self.conv = nn.Conv2d(3, 4, 5, stride=2, padding=0 if self.tf_same else padding)
        self.gate = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        if self.tf_same:
            pad_h, pad_w = (max((math.ceil(size / 2) - 1) * 2 + 5 - size, 0) for size in x.shape[2:])
            x = nn.functional.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        x = self.conv(x)
        return x * self.gate(x.mean((2, 3), keepdim=True)).sigmoid()


@pytest.mark.parametrize("padding, least", [(2, 1), (0, 5), ("tf_same", 1)])
def test_mean_over_a_convolution_is_one_reduce_mean_with_dynamic_axes(padding, least):
    """torch.onnx's ``dynamic_axes`` declare no minimum, yet PyTorch refuses to run a convolution
    whose output would be empty: the least side it runs at (1 with padding, the kernel's 5
    without) is the model's minimum, checked at call time, and the mean over the convolution's map
    is ReduceMean (as torch.onnx writes it) rather than a sum divided by a count. TF-style padding
    reads the side twice (``s + Max(0, 2*ceil(s/2) + 3 - s)``), which bounds only once the side is
    moved into the Max."""
    calls = [(torch.randn(b, 3, h, w),) for b, h, w in [(2, 32, 24), (1, least, least), (3, least + 1, 17)]]
    axes = {"x": {0: "batch", 2: "h", 3: "w"}}
    program = assert_exports_equivalent(
        _SqueezeExcite(padding).eval(), calls[0], input_names=["x"], dynamic_axes=axes, resized=calls[1:], atol=1e-5
    )
    assert op_histogram(program)["ReduceMean"] == 1 and "ReduceSum" not in op_histogram(program)
    assert json.loads(program.model.metadata_props["pkg.dynexport.dim_ranges"])["h"] == [least, None]
    with pytest.raises(ValueError, match=rf"dim 2 is {least - 1}, outside the range h >= {least}"):
        program(torch.randn(1, 3, least - 1, least))
    with pytest.raises(RuntimeError):  # PyTorch refuses that size too
        _SqueezeExcite(padding).eval()(torch.randn(1, 3, least - 1, least))


def _sliced_weight(also_multiplied: bool) -> ir.Model:
    weight = ", ".join(str(float(i)) for i in range(1024))
    extra_output, extra_node = (", float[1024] z", "z = Mul(x, w)") if also_multiplied else ("", "")
    return model(f"""g (float[1024] x) => (float[1024] y{extra_output}) <float[1024] w = {{{weight}}},
        int64[1] zero = {{0}}, int64[1] half = {{512}}, int64[1] full = {{1024}}> {{
        a = Slice(w, zero, half)
        b = Slice(w, half, full)
        r = Concat<axis = 0>(b, a)
        y = Add(x, r)
        {extra_node}
    }}""")


def test_a_large_weight_read_only_by_a_foldable_region_folds_with_it():
    """Two 2 KiB slices of a weight, concatenated the other way round: together they replace
    it. With the weight also read by a Mul they would duplicate it, and stay."""
    alone = _sliced_weight(False)
    x = np.arange(1024, dtype=np.float32)
    expected = run(alone, x=x)[0]
    optimize_model(alone)
    assert ops(alone) == ["Add"]
    np.testing.assert_array_equal(run(alone, x=x)[0], expected)
    shared = _sliced_weight(True)
    optimize_model(shared)
    assert ops(shared).count("Slice") == 2


class PaddedConvs(nn.Module):
    """TensorFlow-style asymmetric zero padding before each Conv, a reflect pad (stays) and a
    zero pad read twice (stays)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 4, 3, stride=2), nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.conv3, self.conv4 = nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 1)

    def forward(self, x):
        x = self.conv1(nn.functional.pad(x, (0, 1, 0, 1)))
        x = self.conv2(nn.functional.pad(x, (1, 1, 2, 0)))
        x = self.conv3(nn.functional.pad(x, (1, 1, 1, 1), mode="reflect"))
        padded = nn.functional.pad(x, (0, 0, 1, 1))
        return self.conv4(padded) + padded.mean()


def test_zero_pads_merge_into_the_conv_after_them():
    torch.manual_seed(0)
    calls = _images([(9, 9), (12, 7), (8, 16), (5, 6)])
    program = assert_exports_equivalent(
        PaddedConvs().eval(), calls[0], dynamic_shapes=_image_dims(4), resized=calls[1:], atol=1e-5
    )
    assert op_histogram(program)["Pad"] == 2


def test_resize_of_a_static_input_names_every_dim():
    """onnxruntime's NCHWc optimizer takes only a Resize whose sizes cover every dim."""

    def upsampled(x):
        return nn.functional.interpolate(x, size=(12, 10), mode="bilinear") + 1

    x = torch.randn(2, 3, 5, 4)
    program = assert_exports_equivalent(upsampled, (x,), atol=1e-5)
    (resize,) = [node for node in program.model.graph if node.op_type == "Resize"]
    assert "axes" not in resize.attributes and resize.inputs[3].const_value.numpy().tolist() == [2, 3, 12, 10]
    dynamic = assert_exports_equivalent(
        upsampled, (x,), dynamic_shapes=({0: Dim("batch")},), resized=[(torch.randn(3, 3, 5, 4),)], atol=1e-5
    )
    (resize,) = [node for node in dynamic.model.graph if node.op_type == "Resize"]
    assert list(resize.attributes["axes"].as_ints()) == [2, 3]


def test_resize_by_scales_names_every_dim_whatever_the_sizes():
    """By scales (1 on the dims it keeps), also with dynamic dims: HRNet's upsampling of
    dynamic-size maps then runs in onnxruntime's blocked layout with no reorders around it."""

    def upsampled(x):
        return nn.functional.interpolate(x, scale_factor=2, mode="nearest") + 1

    x = torch.randn(2, 3, 5, 4)
    program = assert_exports_equivalent(
        upsampled, (x,), dynamic_shapes=_image_dims(1), resized=[(torch.randn(3, 3, 7, 9),)]
    )
    (resize,) = [node for node in program.model.graph if node.op_type == "Resize"]
    assert "axes" not in resize.attributes and resize.inputs[2].const_value.numpy().tolist() == [1, 1, 2, 2]


def test_batchnorm_after_a_gemm_with_a_bias_per_row_stays():
    """A Gemm bias of shape [rows, 1] is no per-channel shift: only the per-column one folds."""
    statistics = (
        "float[3] s = {1.5, 0.5, 2.0}, float[3] b = {0.1, 0.2, 0.3}, float[3] m = {0.3, -0.2, 0.1}, "
        "float[3] v = {0.5, 1.5, 2.0}"
    )
    text = f"""g (float[3, 4] x) => (float[3, 3] y, float[3, 3] z) <float[4, 3] w = {{{", ".join(["0.5"] * 12)}}},
        float[3, 1] per_row = {{1.0, 2.0, 3.0}}, float[3] per_column = {{1.0, 2.0, 3.0}}, {statistics}> {{
        rows = Gemm<beta = 2.0>(x, w, per_row)
        y = BatchNormalization(rows, s, b, m, v)
        columns = Gemm<beta = 2.0>(x, w, per_column)
        z = BatchNormalization(columns, s, b, m, v)
    }}"""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected = run(model(text), x=x)
    fused = model(text)
    optimize_model(fused)
    assert sorted(ops(fused)) == ["BatchNormalization", "Gemm", "Gemm"]
    for actual, wanted in zip(run(fused, x=x), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-5)


class Encoder(nn.Module):
    """A BERT layer at toy width: q, k, v projections split into heads, attention over the keys
    a padding mask keeps, output projection, residual LayerNorms, a GELU feed-forward."""

    def __init__(self, width=16, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.feed_forward = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, keep):
        batch, sequence, width = x.shape

        def split(t):
            return t.view(batch, sequence, self.heads, width // self.heads).transpose(1, 2)

        mask = keep[:, None, None, :].expand(batch, 1, sequence, sequence)
        heads = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), mask)
        x = self.norm1(x + self.out(heads.transpose(1, 2).reshape(batch, sequence, width)))
        return self.norm2(x + self.feed_forward(x))


def _encoder_calls():
    return [(torch.randn(b, s, 16), torch.rand(b, s) > 0.2) for b, s in [(2, 7), (3, 4), (1, 10)]]


_SEQUENCE_DIMS = ({0: Dim("batch"), 1: Dim("sequence")}, {0: Dim("batch"), 1: Dim("sequence")})


def test_node_count_of_an_attention_encoder():
    """The residual block, depthwise-separable and LSTM tests above pin those models' graphs."""
    torch.manual_seed(0)
    calls = _encoder_calls()
    program = assert_exports_equivalent(
        Encoder().eval(), calls[0], dynamic_shapes=_SEQUENCE_DIMS, resized=calls[1:], atol=1e-5
    )
    assert sum(op_histogram(program).values()) <= 39  # torch.onnx (dynamo=True): 50


def test_node_count_of_torchvision_resnet18(torchvision):
    torch.manual_seed(0)
    model_ = _randomize_batchnorm_statistics(torchvision.models.resnet18())
    program = assert_exports_equivalent(model_, (torch.randn(1, 3, 64, 64),), atol=1e-4, rtol=1e-4)
    assert sum(op_histogram(program).values()) <= 49  # torch.onnx: 49
    assert "BatchNormalization" not in op_histogram(program)


def test_onnxruntime_target_fuses_the_encoders_attention():
    torch.manual_seed(0)
    calls = _encoder_calls()
    program = assert_exports_equivalent(
        Encoder().eval(), calls[0], dynamic_shapes=_SEQUENCE_DIMS, resized=calls[1:], atol=1e-5, target="onnxruntime"
    )
    histogram = op_histogram(program)
    assert histogram["MultiHeadAttention"] == 1 and "Softmax" not in histogram
