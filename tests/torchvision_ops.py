"""torchvision for the tests, with its operators whether or not its compiled library loads.

The torchvision wheel on the package registry is a CUDA build: with the CPU torch the tests run,
its ``_C`` library does not load and ``import torchvision`` fails ("operator torchvision::nms does
not exist"). :func:`load_torchvision` then defines the ``torchvision`` operator library itself,
with the schemas of torchvision's C++ sources, gives ``nms``, ``roi_align``, ``roi_pool``,
``ps_roi_align``, ``ps_roi_pool`` and ``deform_conv2d`` CPU kernels written in torch ops that
follow torchvision's CPU kernels step by step, and registers torchvision's own meta functions, so
that eager models compute torchvision's results and torch.export sees the ops torchvision's
compiled library would have given it. ``qnms`` is defined (so a model using it exports) but has no
CPU kernel: running it eagerly fails with torch's "Could not run ... with arguments from the 'CPU'
backend". No autograd is registered: the tests run in eval.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import pathlib
import sys
from types import ModuleType

import torch

# torchvision 0.28's schemas (torchvision/csrc/ops/*.cpp, TORCH_LIBRARY_FRAGMENT(torchvision, m)).
SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": (
        "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
        "int sampling_ratio, bool aligned) -> Tensor"
    ),
    "roi_pool": (
        "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
        "-> (Tensor, Tensor)"
    ),
    "ps_roi_align": (
        "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
        "int sampling_ratio) -> (Tensor, Tensor)"
    ),
    "ps_roi_pool": (
        "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
        "-> (Tensor, Tensor)"
    ),
    "deform_conv2d": (
        "(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, "
        "SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, "
        "bool use_mask) -> Tensor"
    ),
}


def nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS as torchvision's CPU kernel: boxes in descending score order (a stable sort), each
    box kept unless a kept box overlaps it with IoU > ``iou_threshold``; returns the kept indices."""
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    remaining = scores.sort(stable=True, descending=True).indices
    keep = []
    # One step per kept box: a suppressed box suppresses nothing, so it leaves the queue at once.
    while remaining.numel():
        i, rest = remaining[0], remaining[1:]
        keep.append(i)
        width = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        height = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = width * height
        iou = inter / (areas[i] + areas[rest] - inter)
        # The kernel compares the box dtype's IoU with the threshold as a double.
        remaining = rest[~(iou.double() > iou_threshold)]
    return torch.stack(keep)


def roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    """RoIAlign as torchvision's CPU kernel: per ROI and bin, the mean of a grid of bilinear samples
    (``sampling_ratio`` per side, or ceil(ROI side / bins) when it is <= 0); samples more than one
    pixel outside the map count as 0, others are clamped to the map."""
    num_rois, channels = rois.shape[0], input.shape[1]
    output = input.new_zeros(num_rois, channels, pooled_height, pooled_width)
    for n in range(num_rois):
        output[n] = _roi_align_one(input, rois[n], spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    return output


def _roi_align_one(input, roi, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    sums, samples = _bin_sample_sums(input, roi, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    return sums / max(samples, 1)


def _bin_sample_sums(input, roi, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """Per channel and bin, the sum of the bin's bilinear samples ([C, PH, PW]); and the number of
    samples per bin as the kernels count it: the product of the grid's sides, which are 0 or
    negative for an adaptive grid over an empty or inverted ROI (the ROI then has no sample)."""
    dtype = input.dtype
    height, width = input.shape[-2:]
    offset = 0.5 if aligned else 0.0
    scale = torch.tensor(spatial_scale, dtype=dtype)
    start_w, start_h, end_w, end_h = (roi[1:] * scale - offset).unbind()
    roi_width, roi_height = end_w - start_w, end_h - start_h
    if not aligned:
        roi_width, roi_height = roi_width.clamp(min=1.0), roi_height.clamp(min=1.0)
    bin_h, bin_w = roi_height / pooled_height, roi_width / pooled_width
    grid_h = sampling_ratio if sampling_ratio > 0 else int(torch.ceil(roi_height / pooled_height))
    grid_w = sampling_ratio if sampling_ratio > 0 else int(torch.ceil(roi_width / pooled_width))
    count = grid_h * grid_w
    grid_h, grid_w = max(grid_h, 0), max(grid_w, 0)  # an inverted ROI (aligned) has no samples
    y = _sample_points(start_h, bin_h, pooled_height, grid_h, dtype)  # [PH * IY]
    x = _sample_points(start_w, bin_w, pooled_width, grid_w, dtype)  # [PW * IX]
    y_low, y_high, ly, y_inside = _interpolation_taps(y, height)
    x_low, x_high, lx, x_inside = _interpolation_taps(x, width)
    image = input[int(roi[0])]  # [C, H, W]
    hy, hx = 1 - ly, 1 - lx
    samples = (
        image[:, y_low[:, None], x_low] * (hy[:, None] * hx)
        + image[:, y_low[:, None], x_high] * (hy[:, None] * lx)
        + image[:, y_high[:, None], x_low] * (ly[:, None] * hx)
        + image[:, y_high[:, None], x_high] * (ly[:, None] * lx)
    )  # [C, PH * IY, PW * IX]
    samples = torch.where(y_inside[:, None] & x_inside, samples, 0)
    samples = samples.reshape(image.shape[0], pooled_height, grid_h, pooled_width, grid_w)
    return samples.sum((2, 4)), count


def _sample_points(start, bin_size, bins, grid, dtype):
    bin_index = torch.arange(bins, dtype=dtype).repeat_interleave(grid)
    in_bin = (torch.arange(grid, dtype=dtype) + 0.5).repeat(bins)
    return start + bin_index * bin_size + in_bin * bin_size / grid


def _interpolation_taps(coordinate, size):
    """Lower and upper pixel, weight of the upper one, and whether the sample counts at all."""
    inside = (coordinate >= -1.0) & (coordinate <= size)
    coordinate = coordinate.clamp(min=0)
    low = coordinate.long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, size - 1, low + 1)
    coordinate = torch.where(at_edge, low.to(coordinate.dtype), coordinate)
    return low, high, coordinate - low, inside


def roi_pool(
    input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int, pooled_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoIPool as torchvision's CPU kernel: ROI corners scaled and rounded half away from zero,
    the ROI split into bins of whole pixels (floor and ceil of the bin's edges, clipped to the
    map); per bin, the largest value from -FLT_MAX up (NaN never counts), 0 for a bin of no
    pixel; and the flat index of that value (-1 if none), which only backward reads."""
    num_rois, channels = rois.shape[0], input.shape[1]
    height, width = input.shape[-2:]
    output = input.new_zeros(num_rois, channels, pooled_height, pooled_width)
    argmax = torch.full(output.shape, -1, dtype=torch.int32)
    scale = torch.tensor(spatial_scale, dtype=input.dtype)
    lowest = torch.tensor(-3.4028234663852886e38, dtype=input.dtype)  # -FLT_MAX, for double too
    for n in range(num_rois):
        start_w, start_h, end_w, end_h = (_round_half_away_from_zero(float(c * scale)) for c in rois[n, 1:])
        bin_h = torch.tensor(max(end_h - start_h + 1, 1), dtype=input.dtype) / pooled_height
        bin_w = torch.tensor(max(end_w - start_w + 1, 1), dtype=input.dtype) / pooled_width
        image = input[int(rois[n, 0])]
        for ph in range(pooled_height):
            hstart, hend = _pixel_range(ph, bin_h, start_h, height)
            for pw in range(pooled_width):
                wstart, wend = _pixel_range(pw, bin_w, start_w, width)
                if hend <= hstart or wend <= wstart:
                    continue
                region = image[:, hstart:hend, wstart:wend].reshape(channels, -1)
                region = torch.where(region.isnan(), -torch.inf, region)
                largest = torch.maximum(region.amax(1), lowest)
                first = (region == largest[:, None]).int().argmax(1)  # the first larger than all before it
                rows, columns = hstart + first // (wend - wstart), wstart + first % (wend - wstart)
                output[n, :, ph, pw] = largest
                argmax[n, :, ph, pw] = torch.where(largest > lowest, rows * width + columns, -1).int()
    return output, argmax


def _round_half_away_from_zero(value: float) -> int:
    """C's round(), exactly: ``floor(abs(value) + 0.5)`` would round the sum."""
    whole = math.floor(abs(value))
    rounded = whole + 1 if abs(value) - whole >= 0.5 else whole
    return int(math.copysign(rounded, value))


def _pixel_range(index: int, bin_size: torch.Tensor, start: int, size: int) -> tuple[int, int]:
    """Bin ``index``'s first and past-the-last pixel, clipped to [0, size]."""
    first = int(torch.floor(index * bin_size)) + start
    last = int(torch.ceil((index + 1) * bin_size)) + start
    return min(max(first, 0), size), min(max(last, 0), size)


def ps_roi_align(
    input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position-sensitive RoIAlign as torchvision's CPU kernel: bin (ph, pw) of output channel c
    averages the samples of input channel (c * PH + ph) * PW + pw, sampled as roi_align with
    ``aligned=True``, except that the sum is divided by the grid's raw sample count (an adaptive
    grid with a side of 0 gives 0 / 0); and the input channel of each output, for backward."""
    channels = _position_sensitive_channels(input, pooled_height, pooled_width)
    output = input.new_zeros(rois.shape[0], *channels.shape)
    for n in range(rois.shape[0]):
        sums, samples = _bin_sample_sums(input, rois[n], spatial_scale, pooled_height, pooled_width, sampling_ratio, True)
        output[n] = (sums / samples).gather(0, channels)
    return output, channels.int().expand(output.shape).contiguous()


def ps_roi_pool(
    input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int, pooled_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position-sensitive RoIPool as torchvision's CPU kernel: bins of whole pixels as roi_pool's,
    but the ROI is ``max(end - start, 1)`` pixels (not ``+ 1``) and bins are clipped to
    [0, size - 1], so that the last row and column never count; bin (ph, pw) of output channel
    c averages input channel (c * PH + ph) * PW + pw, 0 for a bin of no pixel; and the input
    channel of each output, for backward."""
    channels = _position_sensitive_channels(input, pooled_height, pooled_width)
    height, width = input.shape[-2:]
    output = input.new_zeros(rois.shape[0], *channels.shape)
    scale = torch.tensor(spatial_scale, dtype=input.dtype)
    for n in range(rois.shape[0]):
        start_w, start_h, end_w, end_h = (_round_half_away_from_zero(float(c * scale)) for c in rois[n, 1:])
        bin_h = torch.tensor(max(end_h - start_h, 1), dtype=input.dtype) / pooled_height
        bin_w = torch.tensor(max(end_w - start_w, 1), dtype=input.dtype) / pooled_width
        image = input[int(rois[n, 0])]
        for ph in range(pooled_height):
            hstart, hend = _pixel_range(ph, bin_h, start_h, height - 1)
            for pw in range(pooled_width):
                wstart, wend = _pixel_range(pw, bin_w, start_w, width - 1)
                if hend <= hstart or wend <= wstart:
                    continue
                region = image[channels[:, ph, pw], hstart:hend, wstart:wend]
                area = torch.tensor((hend - hstart) * (wend - wstart), dtype=input.dtype)
                output[n, :, ph, pw] = region.sum((1, 2)) / area
    return output, channels.int().expand(output.shape).contiguous()


def _position_sensitive_channels(input: torch.Tensor, pooled_height: int, pooled_width: int) -> torch.Tensor:
    """[C_out, PH, PW]: the input channel each output channel's bin reads."""
    bins = pooled_height * pooled_width
    if input.shape[1] % bins:
        raise RuntimeError("input channels must be a multiple of pooling height * pooling width")
    return torch.arange(input.shape[1]).reshape(-1, pooled_height, pooled_width)


def deform_conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> torch.Tensor:
    """Deformable convolution as torchvision's CPU kernel: tap (i, j) of output (y, x) samples
    its offset group's channels bilinearly at (y * stride_h - pad_h + i * dilation_h + offset_h,
    x * stride_w - pad_w + j * dilation_w + offset_w), the offsets in (h, w) pairs per tap;
    corners outside the map count 0 and a sample a pixel or more outside it is 0; times the
    mask with ``use_mask``; then the grouped convolution's sums of products, plus bias."""
    batch, channels, height, width = input.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_h, out_w = offset.shape[-2:]
    offset = offset.reshape(batch, offset_groups, kernel_h, kernel_w, 2, out_h, out_w)
    rows = (torch.arange(out_h) * stride_h - pad_h).reshape(out_h, 1) + (torch.arange(kernel_h) * dilation_h).reshape(
        kernel_h, 1, 1, 1
    )  # [kh, 1, oh, 1]
    columns = (torch.arange(out_w) * stride_w - pad_w) + (torch.arange(kernel_w) * dilation_w).reshape(kernel_w, 1, 1)
    y = rows.to(input.dtype) + offset[:, :, :, :, 0]  # [B, G, kh, kw, oh, ow]
    x = columns.to(input.dtype) + offset[:, :, :, :, 1]
    image = input.reshape(batch, offset_groups, channels // offset_groups, height, width)
    samples = _bilinear_zero_outside(image, y, x)  # [B, G, C / G, kh, kw, oh, ow]
    if use_mask:
        samples = mask.reshape(batch, offset_groups, 1, kernel_h, kernel_w, out_h, out_w) * samples
    samples = samples.reshape(batch, groups, channels // groups * kernel_h * kernel_w, out_h * out_w)
    output = weight.reshape(groups, out_channels // groups, -1) @ samples  # [B, groups, out / groups, oh * ow]
    return output.reshape(batch, out_channels, out_h, out_w) + bias.reshape(out_channels, 1, 1)


def _bilinear_zero_outside(image: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``image`` [B, G, C, H, W] sampled at ``y``, ``x`` [B, G, *points]: [B, G, C, *points]."""
    height, width = image.shape[-2:]
    points = y.shape[2:]
    y_low, x_low = y.floor().long(), x.floor().long()
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    flat = image.flatten(3)  # [B, G, C, H * W]

    def pixel(row, column):
        valid = (row >= 0) & (row <= height - 1) & (column >= 0) & (column <= width - 1)
        index = (row.clamp(0, height - 1) * width + column.clamp(0, width - 1)).flatten(2)
        values = flat.gather(3, index[:, :, None].expand(-1, -1, flat.shape[2], -1)).reshape(*flat.shape[:3], *points)
        return torch.where(valid[:, :, None], values, 0)

    value = (
        (hy * hx)[:, :, None] * pixel(y_low, x_low)
        + (hy * lx)[:, :, None] * pixel(y_low, x_low + 1)
        + (ly * hx)[:, :, None] * pixel(y_low + 1, x_low)
        + (ly * lx)[:, :, None] * pixel(y_low + 1, x_low + 1)
    )
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    return torch.where(inside[:, :, None], value, 0)


KERNELS = {
    "nms": nms,
    "roi_align": roi_align,
    "roi_pool": roi_pool,
    "ps_roi_align": ps_roi_align,
    "ps_roi_pool": ps_roi_pool,
    "deform_conv2d": deform_conv2d,
}


def _compiled_ops_load() -> bool:
    """Whether torchvision's own ``_C`` library loads (a CPU build, or CUDA with its libraries)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    for library in pathlib.Path(spec.origin).parent.glob("_C.*"):
        try:
            torch.ops.load_library(str(library))
            return True
        except (ImportError, OSError):
            continue
    return False


@functools.cache
def load_torchvision() -> ModuleType:
    """Import torchvision, first defining its operators with CPU kernels in torch ops if its
    compiled library does not load."""
    if "torchvision" not in sys.modules and not _compiled_ops_load():
        _define_operators()
        import torchvision

        _register_meta_functions(torchvision)
    import torchvision

    return torchvision


def load_torchvision_if_installed() -> ModuleType | None:
    """:func:`load_torchvision` where torchvision is installed: transformers and timm import it
    as they load, and fail with the registry's CUDA build until its operators are defined."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    return load_torchvision()


_LIBRARIES: list[torch.library.Library] = []  # a Library's definitions live as long as the object


def _define_operators() -> None:
    library = torch.library.Library("torchvision", "DEF")
    for name, schema in SCHEMAS.items():
        library.define(name + schema)
        if name in KERNELS:
            library.impl(name, KERNELS[name], "CPU")
    _LIBRARIES.append(library)


def _register_meta_functions(torchvision: ModuleType) -> None:
    """torchvision registers its meta functions and takes its ops only when its library loaded
    (``torchvision.extension._has_ops()``); now that the ops exist, do both."""
    meta = torchvision._meta_registrations
    library = torch.library.Library("torchvision", "IMPL", "Meta")
    for name in ("roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool", "deform_conv2d"):
        library.impl(name, getattr(meta, f"meta_{name}"))
    _LIBRARIES.append(library)

    def has_ops() -> bool:
        return True

    torchvision.extension._has_ops = has_ops
    sys.modules["torchvision.ops.roi_align"]._has_ops = has_ops  # took its own reference at import
