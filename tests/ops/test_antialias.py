"""Antialiased interpolation (``F.interpolate(..., antialias=True)``: bilinear and bicubic) against
onnxruntime: ONNX Resize with ``antialias`` from opset 18, refused below it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.equivalence import assert_exports_equivalent
from tests.opset_parametrization import refused_below_its_opset

Dim = torch.export.Dim


aten = torch.ops.aten
_RESIZE_OPS = {"bilinear": aten._upsample_bilinear2d_aa.default, "bicubic": aten._upsample_bicubic2d_aa.default}


class ResizeTo(torch.nn.Module):
    """Resizes ``x`` to the spatial size of ``like`` (the size is dynamic)."""

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode

    def forward(self, x, like):
        return F.interpolate(x, size=like.shape[-2:], mode=self.mode, antialias=True, align_corners=False)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize(
    ("size", "target", "other_target"),
    [((2, 3, 24, 20), (7, 9), (5, 13)), ((2, 3, 6, 5), (11, 17), (13, 8))],
    ids=["down", "up"],
)
def test_resize_to_a_dynamic_size(mode, size, target, other_target):
    x = torch.randn(size)
    h, w = Dim("h", min=2, max=64), Dim("w", min=2, max=64)
    with refused_below_its_opset(_RESIZE_OPS[mode]):
        assert_exports_equivalent(
            ResizeTo(mode), (x, torch.zeros(target)), dynamic_shapes=({}, {0: h, 1: w}),
            resized=[(x, torch.zeros(other_target))], atol=1e-5,
        )


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_scale_factor_with_dynamic_input(mode):
    def shrink(x):
        return F.interpolate(x, scale_factor=0.5, mode=mode, antialias=True)

    with refused_below_its_opset(_RESIZE_OPS[mode]):
        assert_exports_equivalent(
            shrink, (torch.randn(1, 2, 16, 12),), dynamic_shapes=({0: Dim("n"), 2: Dim("h", min=4), 3: Dim("w", min=4)},),
            resized=[(torch.randn(3, 2, 22, 30),)], atol=1e-5,
        )
