"""Resampling rules (upsampling, grid sampling, pixel shuffle, unfold, im2col) against onnxruntime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dynexport
from tests.equivalence import (
    assert_as_accurate,
    assert_exports_equivalent,
    assert_spatial_dynamic_equivalent,
    op_histogram,
)
from tests.opset_parametrization import refused_below_its_opset

aten = torch.ops.aten
B = torch.export.Dim("batch")
SPATIAL = {1: (7,), 2: (7, 6), 3: (6, 7, 6)}
MODES = {1: ["nearest", "nearest-exact", "linear"], 2: ["nearest", "nearest-exact", "bilinear", "bicubic"], 3: ["nearest", "nearest-exact", "trilinear"]}
SIZES = {"up": (13, 17, 11), "mixed": (3, 14, 6), "one": (1, 1, 1)}
SCALES = {"1.5": 1.5, "per_dim": (2.0, 0.75, 3.0), "1/3": 1 / 3}


def _cases(options):
    return [
        pytest.param(n, mode, name, value, id=f"{n}d-{mode}-{name}")
        for n, modes in MODES.items()
        for mode in modes
        for name, value in options.items()
    ]


def _align_corners(mode):
    return [None] if "nearest" in mode else [False, True]


@pytest.mark.parametrize(("n", "mode", "name", "size"), _cases(SIZES))
def test_interpolate_to_size(n, mode, name, size):
    x = torch.randn(2, 3, *SPATIAL[n])
    for align_corners in _align_corners(mode):
        program = assert_spatial_dynamic_equivalent(
            lambda x: F.interpolate(x, size=size[:n], mode=mode, align_corners=align_corners), x
        )
        assert op_histogram(program)["Resize"] == 1


@pytest.mark.parametrize(("n", "mode", "name", "scale"), _cases(SCALES))
def test_interpolate_by_scale_factor(n, mode, name, scale):
    x = torch.randn(2, 3, *SPATIAL[n])
    scale = scale[:n] if isinstance(scale, tuple) else scale
    for align_corners in _align_corners(mode):
        # torch.export cannot keep a spatial dim dynamic through floor(size * scale).
        assert_spatial_dynamic_equivalent(
            lambda x: F.interpolate(x, scale_factor=scale, mode=mode, align_corners=align_corners), x, spatial=False
        )


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_interpolate_with_recomputed_scale(mode):
    # recompute_scale_factor=True maps coordinates from the sizes, not from the scale.
    assert_spatial_dynamic_equivalent(
        lambda x: F.interpolate(x, scale_factor=1.7, mode=mode, recompute_scale_factor=True), torch.randn(2, 3, 7, 9), spatial=False
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_interpolate_dtypes(mode, dtype):
    x = torch.randn(2, 3, 6, 7, dtype=dtype)
    if dtype == torch.bfloat16 and mode == "bicubic":
        pytest.skip("PyTorch's CPU bicubic has no bfloat16 kernel")
    # onnxruntime has no float64 Resize; onnx's reference evaluator's cubic weights are not
    # exact to double precision.
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float64 else {}
    assert_spatial_dynamic_equivalent(lambda x: F.interpolate(x, size=(9, 5), mode=mode), x, **tolerance)


def test_interpolate_nearest_uint8():
    x = torch.randint(0, 255, (2, 3, 6, 7), dtype=torch.uint8)
    assert_spatial_dynamic_equivalent(lambda x: F.interpolate(x, scale_factor=(2.0, 1.5), mode="nearest"), x, spatial=False)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolate_uint8_rounds_like_pytorch(mode):
    # Computed in float32 and rounded; PyTorch's uint8 kernels interpolate in fixed point, so
    # an element may differ by one.
    x = torch.randint(0, 256, (2, 3, 6, 7), dtype=torch.uint8)
    program = assert_exports_equivalent(
        lambda x: F.interpolate(x, size=(9, 5), mode=mode), (x,), runtime="onnxruntime", atol=1, rtol=0
    )
    assert op_histogram(program)["Round"] == 2


def test_bfloat16_resampling_runs_in_onnxruntime_in_float32():
    x, grid = torch.randn(2, 3, 6, 7, dtype=torch.bfloat16), (torch.rand(2, 5, 4, 2) * 2 - 1).to(torch.bfloat16)
    assert_exports_equivalent(
        lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=True), (x,), runtime="onnxruntime"
    )
    # PyTorch's bfloat16 grid_sample computes sample positions in bfloat16: compared with the
    # float64 result, ours is at least as accurate.
    program = dynexport.export(F.grid_sample, (x, grid))
    assert_as_accurate(program(x, grid), F.grid_sample(x, grid), F.grid_sample(x.double(), grid.double()))


def test_interpolate_to_a_size_read_from_another_input():
    def model(x, like):
        return F.interpolate(x, size=like.shape[-2:], mode="bilinear")

    dims = ({0: B, 2: torch.export.Dim("h", min=6), 3: torch.export.Dim("w", min=6)}, {2: torch.export.Dim("h2"), 3: torch.export.Dim("w2")})
    assert_exports_equivalent(
        model, (torch.randn(2, 3, 6, 7), torch.randn(1, 1, 12, 9)), dynamic_shapes=dims,
        resized=[(torch.randn(3, 3, 9, 6), torch.randn(1, 1, 5, 20))],
    )


UPSAMPLE_DEFAULTS = {
    "nearest1d": lambda x: aten.upsample_nearest1d(x.flatten(2), [105], 2.5),
    "nearest2d": lambda x: aten.upsample_nearest2d(x, [14, 9]),
    "nearest2d_scales": lambda x: aten.upsample_nearest2d(x, [14, 9], 2.0, 1.5),
    "nearest_exact2d": lambda x: aten._upsample_nearest_exact2d(x, [10, 13]),
    "nearest3d": lambda x: aten.upsample_nearest3d(x[:, None], [2, 10, 9]),
    "linear1d": lambda x: aten.upsample_linear1d(x.flatten(2), [50], False, 1.2),
    "bilinear2d": lambda x: aten.upsample_bilinear2d(x, [14, 9], False, 2.0, 1.5),
    "bilinear2d_aligned": lambda x: aten.upsample_bilinear2d(x, [14, 9], True, 2.0, 1.5),
    "trilinear3d": lambda x: aten.upsample_trilinear3d(x[:, None], [5, 4, 9], False),
    "bicubic2d": lambda x: aten.upsample_bicubic2d(x, [14, 9], False, 2.0, 1.5),
}


@pytest.mark.parametrize("fn", UPSAMPLE_DEFAULTS.values(), ids=UPSAMPLE_DEFAULTS.keys())
def test_upsample_default_overloads(fn):
    program = assert_spatial_dynamic_equivalent(fn, torch.randn(2, 3, 7, 6), spatial=False)
    assert op_histogram(program)["Resize"] == 1


@pytest.mark.parametrize(
    "fn",
    [lambda x: aten.upsample_nearest2d(x, [14, 9], 2.0, None), lambda x: aten.upsample_bilinear2d(x, [10, 9], False, 2.0, 1.5)],
    ids=["scales_for_some_dims", "sizes_other_than_scaled"],
)
def test_upsample_that_resize_cannot_express_decomposes(fn):
    # Resize takes scales for every dim or sizes, and derives the sizes from the scales.
    program = assert_spatial_dynamic_equivalent(fn, torch.randn(2, 3, 7, 6), spatial=False)
    assert "Resize" not in op_histogram(program)


GRID_MODES = ["bilinear", "nearest", "bicubic"]
GRID_PADDINGS = ["zeros", "border", "reflection"]


def _grid_cases():
    # Every combination at opset 20, and each mode at the opsets around GridSample's renaming.
    cases = [(m, p, a, 20) for m in GRID_MODES for p in GRID_PADDINGS for a in (False, True)]
    cases += [(m, "reflection", True, opset) for m in GRID_MODES for opset in (18, 22)]
    return [pytest.param(*case, id="-".join(map(str, case))) for case in cases]


@pytest.mark.parametrize(("mode", "padding_mode", "align_corners", "opset"), _grid_cases())
def test_grid_sample(mode, padding_mode, align_corners, opset):
    # Points outside [-1, 1] exercise the padding modes; nearest avoids ties at .5 exactly.
    def model(x, grid):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)

    def inputs(batch):
        return torch.randn(batch, 3, 6, 7), torch.rand(batch, 5, 4, 2) * 2.6 - 1.3

    program = assert_exports_equivalent(
        model, inputs(2), dynamic_shapes=({0: B}, {0: B}), resized=[inputs(4)], opset_version=opset, rtol=1e-4, atol=1e-4
    )
    assert op_histogram(program)["GridSample"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.uint8, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("factor", [2, 3])
def test_pixel_shuffle_and_unshuffle(factor, dtype):
    # In onnxruntime itself: it has no DepthToSpace for wider integers or bools, which reshape
    # and permute instead.
    x = (torch.randn(2, 2 * factor**2, 6, 6) * 10).to(dtype)
    program = assert_spatial_dynamic_equivalent(
        lambda x: (F.pixel_shuffle(x, factor), F.pixel_unshuffle(x, factor)), x, spatial=False, runtime="onnxruntime"
    )
    assert op_histogram(program)["DepthToSpace"] == (dtype in (torch.float32, torch.float16, torch.float64, torch.uint8))


def test_pixel_shuffle_of_other_ranks_decomposes():
    assert_exports_equivalent(lambda x, y: (F.pixel_shuffle(x, 2), F.pixel_shuffle(y, 2)), (torch.randn(8, 3, 5), torch.randn(2, 2, 4, 3, 2)))


@pytest.mark.parametrize(
    ("dim", "size", "step"), [(0, 2, 1), (1, 3, 2), (-1, 4, 3), (2, 1, 1), (1, 7, 1)], ids=["batch", "stride2", "last", "size1", "whole"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_tensor_unfold(dim, size, step, dtype):
    x = (torch.randn(4, 7, 9) * 10).to(dtype)
    program = assert_exports_equivalent(
        lambda x: x.unfold(dim, size, step), (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=2)},),
        resized=[((torch.randn(6, 7, 9) * 10).to(dtype),)],
    )
    assert op_histogram(program)["Gather"] == 1


def test_tensor_unfold_along_a_dynamic_dim():
    assert_exports_equivalent(
        lambda x: x.unfold(1, 3, 2), (torch.randn(2, 9),), dynamic_shapes=({1: torch.export.Dim("n", min=5)},),
        resized=[(torch.randn(2, 14),)],
    )


IM2COL = {
    "kernel3": dict(kernel_size=3),
    "stride_pad": dict(kernel_size=(2, 3), stride=2, padding=1),
    "dilation": dict(kernel_size=2, dilation=(2, 3), padding=(0, 1), stride=(1, 2)),
}


@pytest.mark.parametrize("case", IM2COL.values(), ids=IM2COL.keys())
def test_im2col(case):
    program = assert_spatial_dynamic_equivalent(lambda x: F.unfold(x, **case), torch.randn(2, 3, 8, 9))
    assert "Gather" not in op_histogram(program)


def test_im2col_unbatched_and_dtypes():
    assert_exports_equivalent(
        lambda x, y: (F.unfold(x, 2, stride=2), F.unfold(y, 3, padding=1)),
        (torch.randn(3, 6, 8, dtype=torch.float16), torch.randn(2, 2, 5, 5, dtype=torch.float64)),
    )


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", GRID_PADDINGS)
def test_grid_sample_of_volumes(mode, padding_mode):
    def model(x, grid):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=False)

    def inputs(batch):
        return torch.randn(batch, 3, 4, 5, 6), torch.rand(batch, 3, 4, 5, 3) * 2.4 - 1.2

    with refused_below_its_opset(aten.grid_sampler_3d.default):
        program = assert_exports_equivalent(
            model, inputs(2), dynamic_shapes=({0: B}, {0: B}), resized=[inputs(3)], atol=1e-5
        )
        assert op_histogram(program)["GridSample"] == 1


class SpatialTransformer(torch.nn.Module):
    """A spatial transformer's sampling (PyTorch's STN tutorial): the grid sized by the image."""

    def __init__(self, align_corners: bool = False):
        super().__init__()
        self.align_corners = align_corners

    def forward(self, theta, image):
        grid = F.affine_grid(theta, image.size(), align_corners=self.align_corners)
        return F.grid_sample(image, grid, align_corners=self.align_corners)


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_over_dynamic_sides(align_corners):
    # torch's affine_grid spaces the coordinates with linspace over endpoints computed from the
    # sides, which torch.export can trace only at the example's sides; captured from arange.
    model = SpatialTransformer(align_corners)
    shapes = ({0: B}, {0: B, 2: torch.export.Dim("h"), 3: torch.export.Dim("w")})
    program = assert_exports_equivalent(
        model, (torch.randn(2, 2, 3), torch.randn(2, 3, 8, 8)), dynamic_shapes=shapes,
        resized=[(torch.randn(3, 2, 3), torch.randn(3, 3, 5, 11)), (torch.randn(1, 2, 3), torch.randn(1, 3, 2, 3))],
        atol=1e-5,
    )
    dims = [str(d) for d in program.model.graph.inputs[1].shape]
    assert dims == ["batch", "3", "h", "w"]


def test_affine_grid_of_volumes_over_a_dynamic_depth():
    def model(theta, volume):
        return F.grid_sample(volume, F.affine_grid(theta, volume.shape, align_corners=False), align_corners=False)

    with refused_below_its_opset(aten.grid_sampler_3d.default):
        assert_exports_equivalent(
            model, (torch.randn(2, 3, 4), torch.randn(2, 2, 4, 5, 6)),
            dynamic_shapes=({0: B}, {0: B, 2: torch.export.Dim("d")}),
            resized=[(torch.randn(1, 3, 4), torch.randn(1, 2, 7, 5, 6))], atol=1e-5,
        )


def test_affine_grid_of_static_sides_is_torch_s_own():
    program = assert_exports_equivalent(
        SpatialTransformer(), (torch.randn(2, 2, 3), torch.randn(2, 3, 8, 8)),
        dynamic_shapes=({0: B}, {0: B}), resized=[(torch.randn(3, 2, 3), torch.randn(3, 3, 8, 8))],
    )
    assert "Range" not in op_histogram(program)  # the base grid is a folded constant
