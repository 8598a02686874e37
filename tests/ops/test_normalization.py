"""Batch, layer, group, instance and RMS normalization rules against onnxruntime."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dynexport
from tests.equivalence import assert_batch_dynamic_equivalent, op_histogram

aten = torch.ops.aten
FLOAT_DTYPES = [torch.float32, torch.float16, torch.float64]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _randomized(module, dtype=torch.float32):
    """``module`` in eval mode with random affine parameters and running statistics."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator) * 1.5 + 0.25)
        for name, tensor in module.named_parameters():
            if name == "bias":
                tensor.sub_(1.0)
    return module.to(dtype).eval()


def _input(*shape, dtype=torch.float32, offset=0.5):
    return (torch.randn(*shape) * 2 + offset).to(dtype)


# -- batch norm ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(
    "module, shape",
    [
        (nn.BatchNorm1d(3), (2, 3)),
        (nn.BatchNorm1d(3), (2, 3, 7)),
        (nn.BatchNorm2d(3), (2, 3, 4, 5)),
        (nn.BatchNorm3d(3), (2, 3, 2, 3, 4)),
        (nn.BatchNorm2d(3, affine=False), (2, 3, 4, 5)),
    ],
    ids=["1d_nc", "1d_ncl", "2d", "3d", "2d_no_affine"],
)
def test_batch_norm_inference(module, shape, dtype):
    program = assert_batch_dynamic_equivalent(_randomized(module, dtype), _input(*shape, dtype=dtype))
    assert op_histogram(program)["BatchNormalization"] == 1


def test_batch_norm_without_running_stats_uses_batch_statistics():
    # training=True in the graph: the inference rule declines and the node decomposes.
    module = _randomized(nn.BatchNorm2d(3, track_running_stats=False))
    program = assert_batch_dynamic_equivalent(module, _input(4, 3, 2, 2))
    # The statistics reduced in the graph (its final scale and shift may be a BatchNormalization
    # of mean 0 and variance 1: fuse_channel_affine).
    assert "ReduceMean" in op_histogram(program)


@pytest.mark.parametrize("affine", [True, False])
def test_core_batch_norm_overloads(affine):
    weight, bias = (torch.rand(3) + 0.5, torch.randn(3)) if affine else (None, None)
    mean, var = torch.randn(3), torch.rand(3) + 0.5

    def fn(x):
        no_training = aten._native_batch_norm_legit_no_training(x, weight, bias, mean, var, 0.1, 1e-3)
        native = aten.native_batch_norm(x, weight, bias, mean, var, False, 0.1, 1e-3)
        return no_training[0], native[0]

    program = assert_batch_dynamic_equivalent(fn, _input(2, 3, 4, 5))
    assert op_histogram(program)["BatchNormalization"] == 2


# -- layer norm ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(
    "module",
    [
        nn.LayerNorm(6),
        nn.LayerNorm([4, 6], eps=1e-3),
        nn.LayerNorm(6, elementwise_affine=False),
        nn.LayerNorm(6, bias=False),
    ],
    ids=["last_dim", "last_two_dims", "no_affine", "no_bias"],
)
def test_layer_norm(module, dtype):
    program = assert_batch_dynamic_equivalent(_randomized(module, dtype), _input(2, 4, 6, dtype=dtype))
    assert op_histogram(program)["LayerNormalization"] == 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_native_layer_norm_returns_mean_and_rstd(dtype):
    weight, bias = torch.rand(5, dtype=dtype) + 0.5, torch.randn(5, dtype=dtype)
    program = assert_batch_dynamic_equivalent(
        lambda x: (
            aten.native_layer_norm(x, [5], weight, bias, 1e-5),
            aten.native_layer_norm(x, [3, 5], None, None, 1e-5),
        ),
        _input(2, 3, 5, dtype=dtype),
    )
    assert op_histogram(program)["LayerNormalization"] == 2


def test_batch_norm_half_input_with_float_statistics():
    weight, bias, mean, var = torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    assert_batch_dynamic_equivalent(
        lambda x: nn.functional.batch_norm(x, mean, var, weight, bias), _input(2, 3, 4, dtype=torch.float16)
    )


def test_layer_norm_half_input_with_float_parameters():
    weight, bias = torch.rand(6) + 0.5, torch.randn(6)
    assert_batch_dynamic_equivalent(
        lambda x: nn.functional.layer_norm(x, [6], weight, bias), _input(2, 6, dtype=torch.float16)
    )


# -- group and instance norm ---------------------------------------------------------------


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(
    "module, shape",
    [
        (nn.GroupNorm(2, 4), (2, 4, 3, 5)),
        (nn.GroupNorm(1, 4), (2, 4, 7)),
        (nn.GroupNorm(4, 4, affine=False), (2, 4, 3, 5)),
        (nn.GroupNorm(3, 6, eps=1e-3), (2, 6)),
    ],
    ids=["two_groups", "one_group", "instance_no_affine", "rank2"],
)
def test_group_norm(module, shape, dtype, opset):
    program = assert_batch_dynamic_equivalent(_randomized(module, dtype), _input(*shape, dtype=dtype), opset_version=opset)
    assert op_histogram(program)["LayerNormalization"] == 1


def test_group_norm_input_with_large_mean():
    # ONNX GroupNormalization-21 computes E[x^2] - E[x]^2 and misses this by ~5x the tolerance.
    module = _randomized(nn.GroupNorm(2, 4))
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0)) + 30.0
    assert_batch_dynamic_equivalent(module, x, opset_version=21)


def test_native_group_norm():
    weight, bias = torch.rand(6) + 0.5, torch.randn(6)

    def fn(x):
        n, c, h, w = x.shape
        return aten.native_group_norm(x, weight, bias, n, c, h * w, 3, 1e-5)[0]

    program = assert_batch_dynamic_equivalent(fn, _input(2, 6, 3, 4))
    assert op_histogram(program)["LayerNormalization"] == 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(
    "module, shape",
    [
        (nn.InstanceNorm2d(3), (2, 3, 4, 5)),
        (nn.InstanceNorm1d(3, affine=True), (2, 3, 7)),
        (nn.InstanceNorm3d(3, affine=True), (2, 3, 2, 3, 4)),
    ],
    ids=["2d", "1d_affine", "3d_affine"],
)
def test_instance_norm_input_statistics(module, shape, dtype):
    program = assert_batch_dynamic_equivalent(_randomized(module, dtype), _input(*shape, dtype=dtype))
    assert op_histogram(program)["LayerNormalization"] == 1


@pytest.mark.parametrize("affine", [True, False])
def test_instance_norm_running_statistics(affine):
    module = _randomized(nn.InstanceNorm2d(3, affine=affine, track_running_stats=True))
    program = assert_batch_dynamic_equivalent(module, _input(2, 3, 4, 5))
    assert op_histogram(program)["BatchNormalization"] == 1


# -- RMS norm ------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [20, 23])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(
    "module",
    [nn.RMSNorm(6), nn.RMSNorm([4, 6], eps=1e-3), nn.RMSNorm(6, elementwise_affine=False)],
    ids=["last_dim", "last_two_dims_eps", "no_weight"],
)
def test_rms_norm(module, dtype, opset):
    program = assert_batch_dynamic_equivalent(_randomized(module, dtype), _input(2, 4, 6, dtype=dtype), opset_version=opset)
    assert ("RMSNormalization" in op_histogram(program)) == (opset >= 23)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("opset", [18, 23])
def test_rms_norm_default_eps_dominates_tiny_inputs(opset):
    # eps=None means float32's machine epsilon for a float16 input, so it is visible here.
    x = torch.full((2, 3), 1e-4, dtype=torch.float16) * torch.tensor([1.0, -2.0, 3.0], dtype=torch.float16)
    weight = torch.tensor([0.5, 1.0, 2.0])
    assert_batch_dynamic_equivalent(
        lambda a: (nn.functional.rms_norm(a, [3]), nn.functional.rms_norm(a, [3], weight)), x, opset_version=opset
    )


@pytest.mark.parametrize("opset", range(18, 24))
def test_every_opset(opset):
    model = nn.Sequential(
        _randomized(nn.BatchNorm1d(4)),
        _randomized(nn.GroupNorm(2, 4)),
        _randomized(nn.InstanceNorm1d(4, affine=True)),
        _randomized(nn.LayerNorm(6)),
        _randomized(nn.RMSNorm(6)),
    )
    assert_batch_dynamic_equivalent(model, _input(2, 4, 6), opset_version=opset)


def test_batch_norm_batch_statistics_of_a_constant_channel_are_exact():
    # Centred statistics make a constant channel exactly 0. Eager float32 CPU folds the affine into
    # x * a + (b - mean * a) with a fused multiply-add, so it is off by a rounding of mean * a (3e-5
    # for 3 / sqrt(eps)); float64 eager is exact, and that is the reference here.
    def fn(x, weight, bias):
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, True, 0.1, 1e-5)[0]

    x = torch.tensor([[3.0, 1.0], [3.0, -2.0], [3.0, 4.0]])
    weight, bias = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0])
    program = dynexport.export(fn, (x, weight, bias))
    expected = fn(x.double(), weight.double(), bias.double()).float()
    torch.testing.assert_close(program(x, weight, bias), expected, rtol=1e-5, atol=1e-6)
    assert program(x, weight, bias)[:, 0].eq(0).all()
