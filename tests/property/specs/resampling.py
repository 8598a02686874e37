"""Property specs: upsampling, grid sampling, pixel shuffle and im2col (dynexport/ops/resampling.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tests.property.specs.common import F32, SPECIALS, OpSpec, aten, composite
from tests.property.strategies import ALL, FLOATS, Domain, tensors


@composite
def _upsample(draw, dtype):
    x = draw(
        tensors([1, draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 4))], dtype, Domain(-5, 5))
    )
    if draw(st.booleans()):
        return (x,), {"output_size": [draw(st.integers(1, 7)), draw(st.integers(1, 7))], "scale_factors": None}
    return (x,), {"output_size": None, "scale_factors": [draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for _ in range(2)]}


def _resample(rank: int, align: bool):
    @composite
    def sample(draw, dtype):
        x = draw(
            tensors([1, draw(st.integers(1, 2)), *[draw(st.integers(1, 4)) for _ in range(rank)]], dtype, Domain(-5, 5))
        )
        args = {"output_size": [draw(st.integers(1, 7)) for _ in range(rank)]}
        if align:
            args["align_corners"] = draw(st.booleans())
        return (x,), args

    return sample


@composite
def _grid_sample(draw, dtype):
    n, c, h, w = 1, draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    x = draw(tensors([n, c, h, w], dtype, Domain(-5, 5)))
    grid = draw(tensors([n, draw(st.integers(1, 3)), draw(st.integers(1, 3)), 2], dtype, Domain(-1.2, 1.2)))
    return (x, grid), {
        "mode": draw(st.sampled_from(["bilinear", "nearest", "bicubic"])),
        "padding_mode": draw(st.sampled_from(["zeros", "border", "reflection"])),
        "align_corners": draw(st.booleans()),
    }


@composite
def _pixel_shuffle(draw, dtype):
    r = draw(st.integers(1, 3))
    x = draw(
        tensors(
            [
                draw(st.integers(1, 2)),
                draw(st.integers(1, 2)) * r * r,
                draw(st.integers(1, 3)),
                draw(st.integers(1, 3)),
            ],
            dtype,
            SPECIALS,
        )
    )
    return (x,), {"upscale_factor": r}


@composite
def _im2col(draw, dtype):
    kernel = [draw(st.integers(1, 3)) for _ in range(2)]
    x = draw(
        tensors([1, draw(st.integers(1, 2)), draw(st.integers(3, 5)), draw(st.integers(3, 5))], dtype, Domain(-5, 5))
    )
    return (x,), {
        "kernel_size": kernel,
        "dilation": [1, draw(st.integers(1, 2))],
        "padding": [draw(st.integers(0, 1)), 0],
        "stride": [draw(st.integers(1, 2)), 1],
    }


SPECS: list[OpSpec] = [
    OpSpec("upsample_nearest2d.vec", aten.upsample_nearest2d.vec, _upsample, FLOATS, dynamic=False),
    OpSpec(
        "upsample_bilinear2d.vec",
        lambda x, **a: aten.upsample_bilinear2d.vec(x, a["output_size"], False, a["scale_factors"]),
        _upsample,
        FLOATS,
        dynamic=False,
    ),
    OpSpec(
        "upsample_bilinear2d.vec(align_corners)",
        lambda x, **a: aten.upsample_bilinear2d.vec(x, a["output_size"], True, a["scale_factors"]),
        _upsample,
        FLOATS,
        dynamic=False,
    ),
    OpSpec(
        "upsample_nearest1d.vec",
        lambda x, output_size: aten.upsample_nearest1d.vec(x, output_size, None),
        _resample(1, False),
        FLOATS,
        dynamic=False,
    ),
    OpSpec(
        "upsample_nearest3d.vec",
        lambda x, output_size: aten.upsample_nearest3d.vec(x, output_size, None),
        _resample(3, False),
        F32,
        dynamic=False,
    ),
    OpSpec(
        "_upsample_nearest_exact2d.vec",
        lambda x, output_size: aten._upsample_nearest_exact2d.vec(x, output_size, None),
        _resample(2, False),
        F32,
        dynamic=False,
    ),
    OpSpec(
        "upsample_linear1d.vec",
        lambda x, output_size, align_corners: aten.upsample_linear1d.vec(x, output_size, align_corners, None),
        _resample(1, True),
        FLOATS,
        dynamic=False,
    ),
    OpSpec(
        "upsample_trilinear3d.vec",
        lambda x, output_size, align_corners: aten.upsample_trilinear3d.vec(x, output_size, align_corners, None),
        _resample(3, True),
        F32,
        dynamic=False,
    ),
    OpSpec(
        "upsample_bicubic2d.vec",
        lambda x, output_size, align_corners: aten.upsample_bicubic2d.vec(x, output_size, align_corners, None),
        _resample(2, True),
        F32 + (torch.float64,),
        dynamic=False,
        tolerances={torch.float64: (1e-5, 1e-5)},
    ),
    OpSpec(
        "grid_sampler_2d.default",
        lambda x, g, mode, padding_mode, align_corners: F.grid_sample(x, g, mode, padding_mode, align_corners),
        _grid_sample,
        F32 + (torch.float64,),
        dynamic=False,
    ),
    OpSpec("pixel_shuffle.default", aten.pixel_shuffle.default, _pixel_shuffle, ALL, dynamic=False),
    OpSpec("im2col.default", aten.im2col.default, _im2col, F32 + (torch.float64,), dynamic=False),
]
