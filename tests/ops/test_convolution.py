"""Convolution and transposed-convolution rules against onnxruntime."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dynexport.errors import UnsupportedOperatorError
from tests.equivalence import (
    assert_exports_equivalent,
    assert_spatial_dynamic_equivalent,
    op_histogram,
)

aten = torch.ops.aten
B = torch.export.Dim("batch")
CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CONV_TRANSPOSE = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
SPATIAL = {1: (16,), 2: (12, 10), 3: (7, 6, 6)}


def _per_dim(values, n):
    return tuple(values[:n]) if isinstance(values, tuple) else values


CONV_CASES = {
    "plain": dict(),
    "stride2_pad1_no_bias": dict(stride=2, padding=1, bias=False),
    "dilation2_pad2": dict(dilation=2, padding=2),
    "same": dict(padding="same"),
    # An even kernel pads one more element at the end than at the start.
    "same_even_kernel": dict(padding="same", kernel_size=4),
    "same_dilated": dict(padding="same", dilation=2),
    "valid": dict(padding="valid", stride=2),
    "groups3": dict(groups=3),
    "depthwise": dict(groups=6, padding=1),
    "per_dim": dict(kernel_size=(3, 2, 1), stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1)),
}


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel lengths")
@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
@pytest.mark.parametrize("n", [1, 2, 3])
def test_conv(n, case):
    options = {"kernel_size": 3, **{k: _per_dim(v, n) for k, v in case.items()}}
    model = CONV[n](6, 12, **options).eval()
    program = assert_spatial_dynamic_equivalent(model, torch.randn(2, 6, *SPATIAL[n]))
    assert op_histogram(program) == {"Conv": 1}


CONV_TRANSPOSE_CASES = {
    "plain": dict(),
    "stride2_pad1_output_padding1": dict(stride=2, padding=1, output_padding=1),
    "dilation2_no_bias": dict(dilation=2, bias=False),
    "groups3_stride3_output_padding2": dict(groups=3, stride=3, padding=2, output_padding=2),
    "depthwise": dict(groups=6, stride=2),
    "per_dim": dict(kernel_size=(3, 2, 1), stride=(2, 3, 1), padding=(1, 0, 0), output_padding=(1, 2, 0)),
}


@pytest.mark.parametrize("case", CONV_TRANSPOSE_CASES.values(), ids=CONV_TRANSPOSE_CASES.keys())
@pytest.mark.parametrize("n", [1, 2, 3])
def test_conv_transpose(n, case):
    options = {"kernel_size": 3, **{k: _per_dim(v, n) for k, v in case.items()}}
    model = CONV_TRANSPOSE[n](6, 12, **options).eval()
    program = assert_spatial_dynamic_equivalent(model, torch.randn(2, 6, *SPATIAL[n]))
    assert op_histogram(program) == {"ConvTranspose": 1}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv_transpose"])
def test_conv_dtypes(transposed, dtype):
    module = nn.ConvTranspose2d if transposed else nn.Conv2d
    # onnxruntime has no double ConvTranspose, and onnx's reference evaluator none with groups.
    groups = 1 if transposed and dtype == torch.float64 else 2
    model = module(4, 6, 3, stride=2, padding=1, groups=groups).to(dtype).eval()
    assert_spatial_dynamic_equivalent(model, torch.randn(2, 4, 9, 8, dtype=dtype))


@pytest.mark.parametrize("opset", [20, 22])
@pytest.mark.parametrize(
    "module", [nn.Conv2d(3, 4, 3), nn.ConvTranspose2d(3, 4, 3, stride=2)], ids=["conv", "conv_transpose"]
)
def test_conv_bfloat16(module, opset):
    x = torch.randn(2, 3, 6, 6, dtype=torch.bfloat16)
    program = assert_spatial_dynamic_equivalent(module.to(torch.bfloat16).eval(), x, spatial=False, opset_version=opset)
    # Before opset 22 Conv has no bfloat16: it computes in float32.
    assert ("Cast" in op_histogram(program)) == (opset < 22)


@pytest.mark.parametrize(
    "model",
    [
        nn.Conv1d(3, 4, 3, padding=1),
        nn.Conv2d(3, 4, 3, stride=2),
        nn.Conv3d(3, 4, 2),
        nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1),
    ],
    ids=["conv1d", "conv2d", "conv3d", "conv_transpose2d"],
)
def test_unbatched_input(model):
    x = torch.randn(3, *[6] * (model.weight.dim() - 2))
    last = torch.export.Dim("last", min=6)
    resized = torch.randn(*x.shape[:-1], 9)
    assert_exports_equivalent(model.eval(), (x,), dynamic_shapes=({x.dim() - 1: last},), resized=[(resized,)])


# (stride, padding, dilation, transposed, output_padding, groups) as aten.convolution takes them.
CORE_CASES = {
    "conv_short_lists": ([2], [1], [1], False, [0], 1),
    "conv_groups": ([1, 2], [0, 1], [2, 1], False, [0, 0], 2),
    "transposed": ([2, 2], [1, 0], [1, 1], True, [1, 0], 1),
    "transposed_groups_dilated": ([3, 1], [1, 1], [2, 2], True, [2, 0], 2),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("op", [aten.convolution.default, aten._convolution.default], ids=str)
@pytest.mark.parametrize("case", CORE_CASES.values(), ids=CORE_CASES.keys())
def test_core_convolution(case, op, bias):
    transposed, groups = case[3], case[5]
    weight = torch.randn((4, 6 // groups, 3, 2) if transposed else (6, 4 // groups, 3, 2))
    bias = torch.randn(6) if bias else None
    backend_flags = (False, False, True, True) if op is aten._convolution.default else ()

    def convolve(x):
        return op(x, weight, bias, *case, *backend_flags)

    assert_spatial_dynamic_equivalent(convolve, torch.randn(2, 4, 8, 7))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding="same", groups=16),
            nn.ConvTranspose2d(16, 8, 2, stride=2),
            nn.Conv2d(8, 4, 1),
        )

    def forward(self, x):
        return self.features(x)


CNN_DYNAMIC_SHAPES = ({0: B, 2: torch.export.Dim("height", min=8), 3: torch.export.Dim("width", min=8)},)


def _cnn_check(model, **options):
    """Export at 32x32 and run at 48x40 too."""
    x, resized = torch.randn(2, 3, 32, 32), torch.randn(3, 3, 48, 40)
    return assert_exports_equivalent(
        model, (x,), dynamic_shapes=CNN_DYNAMIC_SHAPES, resized=[(resized,)], **options
    )


@pytest.mark.parametrize("opset", range(18, 24))
def test_cnn_at_every_opset(opset):
    program = _cnn_check(SmallCNN().eval(), opset_version=opset)
    assert op_histogram(program)["Conv"] == 4


def test_cnn_after_core_decompositions():
    x = torch.randn(2, 3, 32, 32)
    exported = torch.export.export(SmallCNN().eval(), (x,), dynamic_shapes=CNN_DYNAMIC_SHAPES)
    decomposed = exported.run_decompositions()
    assert {n.target for n in decomposed.graph.nodes} >= {aten.convolution.default}
    program = _cnn_check(decomposed.module())
    assert op_histogram(program)["ConvTranspose"] == 1


def test_integer_convolution_is_reported_unsupported():
    weight = torch.ones(2, 3, 3, 3, dtype=torch.int64)
    x = torch.ones(1, 3, 5, 5, dtype=torch.int64)
    with pytest.raises(UnsupportedOperatorError, match="convolution"):
        assert_exports_equivalent(lambda x: nn.functional.conv2d(x, weight), (x,))


@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_output_padding_below_dilation_not_stride(padding, bias):
    # Regression (property tests): PyTorch allows output_padding < dilation with stride 1;
    # onnxruntime's ConvTranspose rejects output_padding >= stride.
    module = nn.ConvTranspose2d(2, 3, (1, 3), stride=1, padding=(0, padding), dilation=2, output_padding=1, bias=bias).eval()
    assert_exports_equivalent(module, (torch.randn(1, 2, 3, 5),))


@pytest.mark.parametrize(
    "case, empty_height",
    [
        (dict(kernel_size=1, padding=(1, 0)), 2),
        (dict(kernel_size=1, padding=(1, 0), stride=(2, 1), output_padding=(1, 0), bias=False), 1),
    ],
    ids=["plain", "output_padding"],
)
def test_conv_transpose_with_empty_output(case, empty_height):
    # Regression (property tests): padding may remove every output position. Grouped, PyTorch
    # returns an empty tensor (ungrouped, it refuses); onnxruntime's ConvTranspose rejects a
    # size-0 output. A dynamic height could be that small, so it takes the same path.
    module = nn.ConvTranspose2d(2, 2, groups=2, **case).eval()
    empty = torch.randn(1, 2, empty_height, 3)
    assert module(empty).shape[2] == 0
    assert_exports_equivalent(module, (empty,))
    height = torch.export.Dim("height", min=2)
    x, resized = torch.randn(1, 2, 3, 3), torch.randn(2, 2, 5, 3)
    assert_exports_equivalent(module, (x,), dynamic_shapes=({0: B, 2: height},), resized=[(resized,)])
