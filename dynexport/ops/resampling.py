"""Resampling: upsampling (ONNX Resize, antialiased too), grid sampling (GridSample), pixel shuffle
(DepthToSpace) and sliding windows (Tensor.unfold, im2col).

Resize reproduces PyTorch's source coordinates exactly when told how PyTorch computes them:
nearest is ``floor(dst * in / out)`` ('asymmetric' + 'floor'), nearest-exact rounds half up from
pixel centres ('half_pixel' + 'round_prefer_ceil'), linear and cubic map pixel centres
('half_pixel') or corners ('align_corners'), and cubic uses a = -0.75. A scale factor given with
the sizes (``F.interpolate(scale_factor=...)``) replaces ``in / out`` by ``1 / scale``, which Resize
does when it receives scales instead of sizes.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import (
    argument,
    bfloat16_as_float,
    cast,
    ints,
    normalize_dim,
    rank,
    shape_tensor,
    size_of,
)
from dynexport.registry import translates

aten = torch.ops.aten

_INT64 = ir.DataType.INT64
_FLOAT = ir.DataType.FLOAT


def _spatial_rank(node: torch.fx.Node) -> int:
    return node.args[0].meta["val"].dim() - 2


def _scales(node: torch.fx.Node) -> list[float | None]:
    """The scale arguments of an upsample overload: a list for .vec, one per dim otherwise."""
    names = [a.name for a in node.target._schema.arguments]
    if "scale_factors" in names:
        scales = argument(node, "scale_factors")
        return [None] * _spatial_rank(node) if scales is None else list(scales)
    return [argument(node, name) for name in names if name.startswith("scales")]


def _resizable(node: torch.fx.Node) -> bool:
    """Whether one Resize computes the node: it takes scales for every dim or sizes for every dim,
    and derives the sizes from the scales (floor(in * scale)), as .vec overloads do."""
    scales = _scales(node)
    if all(s is None for s in scales):
        return True
    if any(s is None for s in scales):
        return False
    spatial = node.args[0].meta["val"].shape[-len(scales):]
    out = node.meta["val"].shape[-len(scales):]
    return all(
        not isinstance(i, int) or not isinstance(o, int) or o == int(i * s) for i, o, s in zip(spatial, out, scales)
    )


def _resize(ctx, self, output_size, align_corners: bool | None, *, only: int | None = None, **attributes) -> ir.Value:
    """One Resize over the node's spatial dims (or its spatial dim ``only``)."""
    scales = _scales(ctx.node)
    n = len(scales)
    # The node's rank: ``self`` may be an intermediate Resize whose shape is not inferred.
    rank_ = ctx.node.args[0].meta["val"].dim()
    axes = list(range(rank_ - n, rank_))
    if only is not None:
        axes, scales = [axes[only]], [scales[only]]
        output_size = None if output_size is None else [output_size[only]]
    # PyTorch maps aligned corners from the sizes alone, whatever the scale factor.
    use_scales = scales[0] is not None and not (align_corners and output_size is not None)
    if align_corners is not None:
        attributes["coordinate_transformation_mode"] = "align_corners" if align_corners else "half_pixel"
    if use_scales:
        return _onnx_resize(ctx, self, rank_, axes, scales=[float(s) for s in scales], **attributes)
    return _onnx_resize(ctx, self, rank_, axes, sizes=output_size, **attributes)


def _onnx_resize(ctx, x: ir.Value, rank_: int, axes: list[int], *, scales=None, sizes=None, **attributes) -> ir.Value:
    """ONNX Resize of ``x`` (of rank ``rank_``) along ``axes``, by ``scales`` or to ``sizes``.
    Resize takes ``axes`` from opset 18; before it the scales or sizes name every dim."""
    if ctx.opset >= 18:
        if scales is not None:
            return ctx.op.Resize(x, None, ctx.constant(scales, _FLOAT), axes=axes, **attributes)
        return ctx.op.Resize(x, None, None, shape_tensor(ctx, sizes), axes=axes, **attributes)
    if scales is not None:
        every_scale = [1.0] * rank_
        for axis, scale in zip(axes, scales):
            every_scale[axis] = scale
        return ctx.op.Resize(x, None, ctx.constant(every_scale, _FLOAT), **attributes)
    every_size = [sizes[axes.index(i)] if i in axes else ctx.sym_size(x, i) for i in range(rank_)]
    return ctx.op.Resize(x, None, None, shape_tensor(ctx, every_size), **attributes)


_NEAREST = [
    aten.upsample_nearest1d.vec, aten.upsample_nearest2d.vec, aten.upsample_nearest3d.vec,
    aten.upsample_nearest1d.default, aten.upsample_nearest2d.default, aten.upsample_nearest3d.default,
]
_NEAREST_EXACT = [
    aten._upsample_nearest_exact1d.vec, aten._upsample_nearest_exact2d.vec, aten._upsample_nearest_exact3d.vec,
    aten._upsample_nearest_exact1d.default, aten._upsample_nearest_exact2d.default,
    aten._upsample_nearest_exact3d.default,
]
_LINEAR = [
    aten.upsample_linear1d.vec, aten.upsample_bilinear2d.vec, aten.upsample_trilinear3d.vec,
    aten.upsample_linear1d.default, aten.upsample_bilinear2d.default, aten.upsample_trilinear3d.default,
]


@translates(*_NEAREST, checker=_resizable)
def upsample_nearest(ctx, input, output_size, *scales):
    return _resize(
        ctx, input, output_size, None, mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"
    )


@translates(*_NEAREST_EXACT, checker=_resizable)
def upsample_nearest_exact(ctx, input, output_size, *scales):
    return _resize(
        ctx, input, output_size, None, mode="nearest", coordinate_transformation_mode="half_pixel",
        nearest_mode="round_prefer_ceil",
    )


def _interpolate(ctx, input, output_size, align_corners, **attributes) -> ir.Value:
    """A linear or cubic Resize; uint8 images interpolate in float32 and round back
    (onnxruntime's uint8 Resize truncates, and has no uint8 cubic kernel), bfloat16 in float32
    (onnxruntime has no bfloat16 Resize)."""
    if input.dtype == ir.DataType.BFLOAT16:
        return cast(ctx, _resize(ctx, cast(ctx, input, _FLOAT), output_size, align_corners, **attributes), input.dtype)
    if input.dtype != ir.DataType.UINT8:
        return _resize(ctx, input, output_size, align_corners, **attributes)
    # PyTorch resizes uint8 one dim at a time, last first, rounding and clamping in between
    # (a cubic's overshoot is clamped before the next dim sees it).
    result = cast(ctx, input, _FLOAT)
    for i in reversed(range(len(_scales(ctx.node)))):
        result = _resize(ctx, result, output_size, align_corners, only=i, **attributes)
        result = ctx.op.Clip(ctx.op.Round(result), ctx.constant(0.0, _FLOAT), ctx.constant(255.0, _FLOAT))
    return cast(ctx, result, ir.DataType.UINT8)


@translates(*_LINEAR, checker=_resizable)
def upsample_linear(ctx, input, output_size, align_corners, *scales):
    return _interpolate(ctx, input, output_size, align_corners, mode="linear")


@translates(aten.upsample_bicubic2d.vec, aten.upsample_bicubic2d.default, checker=_resizable)
def upsample_bicubic2d(ctx, input, output_size, align_corners, *scales):
    return _interpolate(ctx, input, output_size, align_corners, mode="cubic", cubic_coeff_a=-0.75)


# Antialiased resampling (``F.interpolate(..., antialias=True)``; timm's ViT and DeiT resize their
# position embeddings with the bicubic one under ``dynamic_img_size``) is PIL's: when downscaling
# the filter is stretched by the scale, only the taps inside the image count (their weights
# normalized), and the cubic filter uses a = -0.5. Resize does the same from opset 18 with
# ``antialias=1``, ``exclude_outside=1``, from pixel centres.


def _antialiasable(node: torch.fx.Node) -> bool:
    """One Resize computes the node: floating point, pixel centres (PyTorch's aligned corners
    place the filter otherwise) and sizes or scales Resize can take."""
    return node.args[0].meta["val"].dtype.is_floating_point and not argument(node, "align_corners") and _resizable(node)


@translates(aten._upsample_bilinear2d_aa.default, aten._upsample_bilinear2d_aa.vec, checker=_antialiasable, min_opset=18)
def upsample_bilinear2d_aa(ctx, input, output_size, align_corners, *scales):
    return _interpolate(ctx, input, output_size, align_corners, mode="linear", antialias=1, exclude_outside=1)


@translates(aten._upsample_bicubic2d_aa.default, aten._upsample_bicubic2d_aa.vec, checker=_antialiasable, min_opset=18)
def upsample_bicubic2d_aa(ctx, input, output_size, align_corners, *scales):
    return _interpolate(
        ctx, input, output_size, align_corners, mode="cubic", cubic_coeff_a=-0.5, antialias=1, exclude_outside=1
    )


# grid_sampler's interpolation_mode and padding_mode enums, named as GridSample names them; opset
# 20 renamed bilinear and bicubic.
_GRID_MODES = {16: ["bilinear", "nearest", "bicubic"], 20: ["linear", "nearest", "cubic"]}
_GRID_PADDINGS = ["zeros", "border", "reflection"]


def _grid_sample_16_fits(node: torch.fx.Node) -> bool:
    """GridSample-16 samples images (4-D), and onnxruntime has no float64 kernel for it."""
    image = node.args[0].meta["val"]
    return image.dim() == 4 and image.dtype != torch.float64


# GridSample exists from opset 16 and samples volumes (5-D inputs) from opset 20; where it does
# not fit, the node decomposes.
@translates(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default, aten.grid_sampler.default, min_opset=20)
@translates(aten.grid_sampler_2d.default, aten.grid_sampler.default, checker=_grid_sample_16_fits, min_opset=16)
@bfloat16_as_float
def grid_sampler_2d(ctx, input, grid, interpolation_mode, padding_mode, align_corners):
    modes = _GRID_MODES[20 if ctx.opset >= 20 else 16]
    return ctx.op.GridSample(
        input, grid, mode=modes[interpolation_mode], padding_mode=_GRID_PADDINGS[padding_mode],
        align_corners=int(align_corners),
    )


# onnxruntime's DepthToSpace kernels; other dtypes (and ranks) take torch's decomposition, a
# reshape and a permute.
_DEPTH_TO_SPACE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8)


def _depth_to_space_fits(node) -> bool:
    x = node.args[0].meta["val"]
    return x.dim() == 4 and x.dtype in _DEPTH_TO_SPACE_DTYPES


@translates(aten.pixel_shuffle.default, checker=_depth_to_space_fits)
def pixel_shuffle(ctx, self, upscale_factor):
    # PyTorch orders the input channels (channel, row offset, column offset): DepthToSpace's CRD.
    return ctx.op.DepthToSpace(self, blocksize=upscale_factor, mode="CRD")


def _windows(ctx, length: int | ir.Value, size: int, step: int) -> ir.Value:
    """The (windows, size) positions of every full window along a dim of ``length``."""
    if isinstance(length, int):
        starts = torch.arange(0, length - size + 1, step)
        return ctx.constant(starts[:, None] + torch.arange(size), _INT64)
    count = ctx.op.Add(ctx.op.Div(ctx.op.Sub(length, size), step), 1)
    starts = ctx.op.Mul(ctx.op.Range(0, count, 1), step)
    return ctx.op.Add(ctx.op.Unsqueeze(starts, ints(ctx, [1])), ints(ctx, list(range(size))))


@translates(aten.unfold.default)
def unfold(ctx, self, dimension, size, step):
    r = rank(self)
    if r == 0:
        return ctx.op.Reshape(self, ints(ctx, [size]))
    axis = normalize_dim(dimension, r)
    windows = ctx.op.Gather(self, _windows(ctx, size_of(ctx, self, axis), size, step), axis=axis)
    if axis == r - 1:
        return windows
    # Gather puts (windows, size) where the dim was; PyTorch puts size last.
    perm = [*range(axis + 1), *range(axis + 2, r + 1), axis + 1]
    return ctx.op.Transpose(windows, perm=perm)


@translates(aten.im2col.default)
def im2col(ctx, self, kernel_size, dilation, padding, stride):
    """F.unfold: every (kernel row, kernel column) offset is a strided slice of the padded
    input; stacked after the channels they give PyTorch's (C * kh * kw, windows) layout."""
    batched = rank(self) == 4
    x = self if batched else ctx.op.Unsqueeze(self, ints(ctx, [0]))
    if any(padding):
        pads = [0, 0, padding[0], padding[1]] * 2
        x = ctx.op.Pad(x, ints(ctx, pads), mode="constant")
    kh, kw = kernel_size
    last = 2**63 - 1
    slices = []
    for i in range(kh):
        for j in range(kw):
            # Window starts run while the kernel's far edge stays inside the input.
            starts = [i * dilation[0], j * dilation[1]]
            ends = [-(kh - 1 - i) * dilation[0] or last, -(kw - 1 - j) * dilation[1] or last]
            piece = ctx.op.Slice(x, ints(ctx, starts), ints(ctx, ends), ints(ctx, [2, 3]), ints(ctx, list(stride)))
            slices.append(ctx.op.Unsqueeze(piece, ints(ctx, [2])))
    stacked = ctx.op.Concat(*slices, axis=2)
    channels = size_of(ctx, self, rank(self) - 3)
    rows = channels * kh * kw if isinstance(channels, int) else ctx.op.Mul(channels, kh * kw)
    columns = ctx.out.shape[-1]
    y = ctx.op.Reshape(stacked, shape_tensor(ctx, [0, rows, columns if isinstance(columns, int) else -1]))
    return y if batched else ctx.op.Squeeze(y, ints(ctx, [0]))
