"""torchvision's operators: ``torchvision::nms`` as NonMaxSuppression, ``roi_align`` and
``ps_roi_align`` as RoiAlign, ``roi_pool`` and ``ps_roi_pool`` written out, ``deform_conv2d`` as
DeformConv (opset 19).

torchvision's compiled library defines them when torchvision loads, and dynexport never imports
torchvision: the rules are keyed by the operators' qualified names.

onnxruntime's NonMaxSuppression computes the IoU of two boxes with torchvision's float arithmetic
and suppresses a box whose IoU with a kept one is above the threshold, as torchvision does. Where
the two differ, the rule makes them agree:

- it visits the boxes through a heap that orders equal scores arbitrarily, where torchvision
  sorts stably: the boxes go in in torchvision's order, ranked by position (exact up to 2**24
  boxes, where float ranks stop being distinct);
- it reorders a box's corners, where torchvision gives a box with x1 > x2 or y1 > y2 no overlap
  with anything: such a box becomes one of zero area, which overlaps nothing in either;
- it compares the IoU with a float threshold, torchvision with a double: the threshold becomes
  the largest float not above it, which puts every float IoU on the same side of both;
- it takes thresholds in [0, 1]: above 1 neither suppresses anything (an IoU is at most 1);
  below 0 torchvision suppresses disjoint boxes too, which is refused.

RoiAlign samples as torchvision's roi_align: ``coordinate_transformation_mode`` ``half_pixel``
(opset 16) is ``aligned=True``, ``output_half_pixel`` (RoiAlign-10's only mode) ``aligned=False``,
and both clamp a ROI to at least one pixel only in the latter. It computes in float or double.
ps_roi_align samples as ``aligned=True``: RoiAlign over every channel, each output channel keeping
the bin it reads (float32 and float64 only: which ROIs it pools to 0 / 0 depends on the dtype).

roi_pool and ps_roi_pool bin whole pixels, from the ROI's corners rounded half away from zero;
each bin's maximum (roi_pool) or mean (ps_roi_pool) is a masked reduction, one ROI per Loop
iteration. Their bins are computed in the input's dtype, so float16 input is refused. Their
second result and ps_roi_align's (the argmax, or the channel read) only feed backward and have
no rule.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import torch

from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import (
    argument,
    cast,
    ints,
    only_first_output_used,
    reduce,
    reshape,
    shape_of,
    size_of,
    split_equally,
)
from dynexport.ops.sorting import sort
from dynexport.registry import target_name, translates

_FLOAT = ir.DataType.FLOAT
_INT64 = ir.DataType.INT64
# onnxruntime's RoiAlign and DeformConv kernels take float and double; half precision computes in
# float.
_FLOAT_OR_DOUBLE = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _refuse(ctx, reason: str, hint: str) -> TranslationError:
    return TranslationError(target_name(ctx.node.target), source_line(ctx.node), reason, hint)


def _threshold_as_float(iou_threshold: float) -> float:
    """The largest float32 not above ``iou_threshold``: a float IoU is above one exactly where
    it is above the other."""
    threshold = np.float32(iou_threshold)
    if float(threshold) > iou_threshold:  # compared as doubles
        threshold = np.nextafter(threshold, np.float32(-np.inf))
    return float(threshold)


@translates("torchvision::nms")
def nms(ctx, dets, scores, iou_threshold):
    if dets.dtype != _FLOAT or scores.dtype != _FLOAT:
        raise _refuse(
            ctx,
            f"NonMaxSuppression computes IoUs in float32, the boxes are {ctx.node.args[0].meta['val'].dtype}",
            "cast the boxes and scores to float32 before nms",
        )
    if not iou_threshold >= 0:
        raise _refuse(
            ctx,
            f"iou_threshold={iou_threshold}: torchvision suppresses even disjoint boxes below 0, "
            "NonMaxSuppression takes thresholds in [0, 1]",
            "pass an iou_threshold >= 0",
        )
    _, order = sort(ctx, scores, 0, descending=True, stable=True)
    boxes = ctx.op.Gather(dets, order, axis=0)
    # x1 > x2 or y1 > y2 becomes x1 == x2 or y1 == y2.
    corners = ctx.op.Slice(boxes, ints(ctx, [0]), ints(ctx, [2]), ints(ctx, [1]))
    far_corners = ctx.op.Slice(boxes, ints(ctx, [2]), ints(ctx, [4]), ints(ctx, [1]))
    boxes = ctx.op.Concat(corners, ctx.op.Max(far_corners, corners), axis=1)
    count = shape_of(ctx, scores)
    ranks = cast(ctx, ctx.op.Range(ctx.op.Squeeze(count), ctx.constant(0, _INT64), ctx.constant(-1, _INT64)), _FLOAT)
    selected = ctx.op.NonMaxSuppression(
        ctx.op.Unsqueeze(boxes, ints(ctx, [0])),
        ctx.op.Reshape(ranks, ints(ctx, [1, 1, -1])),
        count,
        ctx.constant([_threshold_as_float(min(iou_threshold, 1.0))], _FLOAT),
        center_point_box=0,
    )
    positions = ctx.op.Reshape(ctx.op.Slice(selected, ints(ctx, [2]), ints(ctx, [3]), ints(ctx, [1])), ints(ctx, [-1]))
    return ctx.op.Gather(order, positions, axis=0)


def _static_bins(node: torch.fx.Node) -> bool:
    # The schemas' SymInt pooled sizes are attributes of RoiAlign and sizes of the rules' bins.
    return all(isinstance(argument(node, name), int) for name in ("pooled_height", "pooled_width"))


def _static_bins_not_aligned(node: torch.fx.Node) -> bool:
    return _static_bins(node) and not argument(node, "aligned")


def _static_bins_first_output(node: torch.fx.Node) -> bool:
    return _static_bins(node) and only_first_output_used(node)


@translates("torchvision::roi_align", min_opset=16, checker=_static_bins)
@translates("torchvision::roi_align", checker=_static_bins_not_aligned)
def roi_align(ctx, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    compute_type = input.dtype if input.dtype in _FLOAT_OR_DOUBLE else _FLOAT
    boxes = ctx.op.Slice(cast(ctx, rois, compute_type), ints(ctx, [1]), ints(ctx, [5]), ints(ctx, [1]))
    batch_indices = cast(ctx, ctx.op.Gather(rois, ctx.constant(0, _INT64), axis=1), _INT64)
    attributes = {
        "mode": "avg",
        "output_height": pooled_height,
        "output_width": pooled_width,
        "sampling_ratio": max(sampling_ratio, 0),  # both adaptive at <= 0
        "spatial_scale": float(spatial_scale),
    }
    if ctx.opset >= 16:
        attributes["coordinate_transformation_mode"] = "half_pixel" if aligned else "output_half_pixel"
    pooled = ctx.op.RoiAlign(cast(ctx, input, compute_type), boxes, batch_indices, **attributes)
    return cast(ctx, pooled, input.dtype)


def _check_float(ctx, input: ir.Value) -> None:
    if input.dtype not in _FLOAT_OR_DOUBLE:
        raise _refuse(
            ctx,
            f"torchvision computes it in the input's dtype, {ctx.node.args[0].meta['val'].dtype}, which the "
            "graph reproduces for float32 and float64 only",
            "pool float32 features",
        )


def _position_sensitive(ctx, pooled: ir.Value, input: ir.Value, rois: ir.Value, pooled_height: int, pooled_width: int):
    """[K, C_out, PH, PW] from ``pooled``, [K, C_out * PH * PW, PH, PW]: bin (ph, pw) of output
    channel c from input channel (c * PH + ph) * PW + pw, as torchvision's ps_roi_align and
    ps_roi_pool."""
    bins = pooled_height * pooled_width
    count, channels = size_of(ctx, rois, 0), size_of(ctx, input, 1)
    outputs = channels // bins if isinstance(channels, int) else ctx.op.Div(channels, ctx.constant(bins, _INT64))
    flat = reshape(ctx, pooled, [count, outputs, bins * bins])
    diagonal = ctx.op.Gather(flat, ints(ctx, [i * bins + i for i in range(bins)]), axis=2)
    return reshape(ctx, diagonal, [count, outputs, pooled_height, pooled_width])


@translates("torchvision::ps_roi_align", min_opset=16, checker=_static_bins_first_output)
def ps_roi_align(ctx, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    # RoiAlign with half_pixel samples every channel as ps_roi_align samples one; each output
    # channel keeps the bin it reads.
    _check_float(ctx, input)
    pooled = roi_align(ctx, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, True)
    pooled = _position_sensitive(ctx, pooled, input, rois, pooled_height, pooled_width)
    if sampling_ratio > 0:
        return [pooled, None]
    # torchvision divides each bin's sum by the adaptive grid's sample count, ceil(side / bins)
    # per side, unclamped: a ROI with a side in (-bins, 0] pools to 0 / 0.
    corners = ctx.op.Sub(
        ctx.op.Mul(ctx.op.Slice(rois, ints(ctx, [1]), ints(ctx, [5]), ints(ctx, [1])), ctx.constant(spatial_scale, input.dtype)),
        ctx.constant(0.5, input.dtype),
    )
    start_w, start_h, end_w, end_h = split_equally(ctx, corners, 1, 4)
    no_grid = [
        ctx.op.Equal(ctx.op.Ceil(ctx.op.Div(ctx.op.Sub(end, start), ctx.constant(bins, input.dtype))), ctx.constant(0, input.dtype))
        for start, end, bins in ((start_h, end_h, pooled_height), (start_w, end_w, pooled_width))
    ]
    undefined = ctx.op.Unsqueeze(ctx.op.Or(*no_grid), ints(ctx, [2, 3]))  # [K, 1, 1, 1]
    return [ctx.op.Where(undefined, ctx.constant(np.nan, input.dtype), pooled), None]


def _round_half_away_from_zero(ctx, x: ir.Value) -> ir.Value:
    """C's ``round``; ONNX's Round goes to even. The fraction ``|x| - floor(|x|)`` is exact."""
    magnitude = ctx.op.Abs(x)
    whole = ctx.op.Floor(magnitude)
    one, half = ctx.constant(1, x.dtype), ctx.constant(0.5, x.dtype)
    rounded = ctx.op.Where(ctx.op.GreaterOrEqual(ctx.op.Sub(magnitude, whole), half), ctx.op.Add(whole, one), whole)
    return ctx.op.Where(ctx.op.Less(x, ctx.constant(0, x.dtype)), ctx.op.Neg(rounded), rounded)


def _whole_pixel_bins(ctx, input, rois, spatial_scale, pooled_height, pooled_width, *, roi_pool: bool):
    """roi_pool's (or ps_roi_pool's) bins of whole pixels: per ROI and bin, the first and
    past-the-last row ([K, PH] each) and column ([K, PW] each). The ROI's corners are scaled and
    rounded; it is ``end - start + 1`` pixels for roi_pool, ``end - start`` for ps_roi_pool (at
    least 1); the bins are clipped to [0, size] for roi_pool, [0, size - 1] for ps_roi_pool."""
    dtype = input.dtype
    corners = ctx.op.Mul(ctx.op.Slice(rois, ints(ctx, [1]), ints(ctx, [5]), ints(ctx, [1])), ctx.constant(spatial_scale, dtype))
    start_w, start_h, end_w, end_h = split_equally(ctx, cast(ctx, _round_half_away_from_zero(ctx, corners), _INT64), 1, 4)
    one = ctx.constant(1, _INT64)
    edges = []
    for start, end, bins, axis in ((start_h, end_h, pooled_height, 2), (start_w, end_w, pooled_width, 3)):
        length = ctx.op.Sub(end, start)
        length = ctx.op.Max(ctx.op.Add(length, one) if roi_pool else length, one)
        bin_size = ctx.op.Div(cast(ctx, length, dtype), ctx.constant(bins, dtype))
        index = ctx.constant(list(range(bins)), dtype)
        first = cast(ctx, ctx.op.Floor(ctx.op.Mul(index, bin_size)), _INT64)
        last = cast(ctx, ctx.op.Ceil(ctx.op.Mul(ctx.op.Add(index, ctx.constant(1, dtype)), bin_size)), _INT64)
        limit = ctx.sym_size(input, axis) if roi_pool else ctx.op.Sub(ctx.sym_size(input, axis), one)
        zero = ctx.constant(0, _INT64)
        edges.append(tuple(ctx.op.Min(ctx.op.Max(ctx.op.Add(edge, start), zero), limit) for edge in (first, last)))
    return edges


def _bin_masks(ctx, first: ir.Value, last: ir.Value, size: ir.Value) -> ir.Value:
    """[bins, size]: whether each pixel lies in each bin's [first, last)."""
    pixels = ctx.op.Unsqueeze(ctx.op.Range(ctx.constant(0, _INT64), size, ctx.constant(1, _INT64)), ints(ctx, [0]))
    first, last = (ctx.op.Unsqueeze(edge, ints(ctx, [1])) for edge in (first, last))
    return ctx.op.And(ctx.op.GreaterOrEqual(pixels, first), ctx.op.Less(pixels, last))


def _empty_bins(ctx, rows, columns) -> ir.Value:
    """[K, 1, PH, PW]: whether a bin holds no pixel."""
    empty_rows, empty_columns = (ctx.op.LessOrEqual(last, first) for first, last in (rows, columns))
    return ctx.op.Or(ctx.op.Unsqueeze(empty_rows, ints(ctx, [1, 3])), ctx.op.Unsqueeze(empty_columns, ints(ctx, [1, 2])))


def _reduce_bins(ctx, op_type: str, fill: float, features, rois, rows, columns, bins: tuple[int, int]) -> ir.Value:
    """[K, C, PH, PW]: per ROI and bin, ``op_type`` (ReduceMax, ReduceSum) over the bin's pixels
    of the ROI's image, the other pixels counting as ``fill``; one ROI per Loop iteration, the
    bin's columns reduced first, then its rows."""
    images = cast(ctx, ctx.op.Gather(rois, ctx.constant(0, _INT64), axis=1), _INT64)
    height, width = (ctx.sym_size(features, axis) for axis in (2, 3))
    filler = ctx.constant(fill, features.dtype)
    iteration, condition = ctx.value("roi", 0), ctx.value("condition", True)

    def one_roi():
        image = ctx.op.Gather(features, ctx.op.Gather(images, iteration), axis=0)  # [C, H, W]
        in_rows = _bin_masks(ctx, *(ctx.op.Gather(edge, iteration) for edge in rows), height)  # [PH, H]
        in_columns = _bin_masks(ctx, *(ctx.op.Gather(edge, iteration) for edge in columns), width)  # [PW, W]
        by_column = ctx.op.Where(in_columns, ctx.op.Unsqueeze(image, ints(ctx, [2])), filler)  # [C, H, PW, W]
        by_column = reduce(ctx, op_type, by_column, [3], keepdims=False)
        by_bin = ctx.op.Where(ctx.op.Unsqueeze(in_rows, ints(ctx, [2])), ctx.op.Unsqueeze(by_column, ints(ctx, [1])), filler)
        return [condition, reduce(ctx, op_type, by_bin, [2], keepdims=False)]  # [C, PH, PW]

    count = ctx.sym_size(rois, 0)
    keep_going = ctx.constant(True, ir.DataType.BOOL)
    reduced = ctx.op.Loop(count, keep_going, body=ctx.subgraph("roi", [iteration, condition], one_roi))
    reduced.dtype = features.dtype  # the builder cannot tell a Loop's output types from its inputs
    # With no ROI, the Loop's output may lack the dims after the first.
    return reshape(ctx, reduced, [count, ctx.sym_size(features, 1), *bins])


@translates("torchvision::roi_pool", checker=_static_bins_first_output)
def roi_pool(ctx, input, rois, spatial_scale, pooled_height, pooled_width):
    # MaxRoiPool would give torchvision's bins, but onnxruntime's kernel starts each bin's
    # maximum at the smallest positive float instead of -FLT_MAX: a bin of negative values
    # pools to 1e-38. Written out instead.
    _check_float(ctx, input)
    rows, columns = _whole_pixel_bins(ctx, input, rois, spatial_scale, pooled_height, pooled_width, roi_pool=True)
    # torchvision's maximum ignores NaN (no comparison with it holds) and starts at -FLT_MAX.
    features = ctx.op.Where(ctx.op.IsNaN(input), ctx.constant(-np.inf, input.dtype), input)
    largest = _reduce_bins(ctx, "ReduceMax", -np.inf, features, rois, rows, columns, (pooled_height, pooled_width))
    largest = ctx.op.Max(largest, ctx.constant(-3.4028234663852886e38, input.dtype))
    return [ctx.op.Where(_empty_bins(ctx, rows, columns), ctx.constant(0, input.dtype), largest), None]


@translates("torchvision::ps_roi_pool", checker=_static_bins_first_output)
def ps_roi_pool(ctx, input, rois, spatial_scale, pooled_height, pooled_width):
    _check_float(ctx, input)
    rows, columns = _whole_pixel_bins(ctx, input, rois, spatial_scale, pooled_height, pooled_width, roi_pool=False)
    sums = _reduce_bins(ctx, "ReduceSum", 0.0, input, rois, rows, columns, (pooled_height, pooled_width))
    sums = _position_sensitive(ctx, sums, input, rois, pooled_height, pooled_width)
    heights, widths = (ctx.op.Sub(last, first) for first, last in (rows, columns))
    area = ctx.op.Mul(ctx.op.Unsqueeze(heights, ints(ctx, [1, 3])), ctx.op.Unsqueeze(widths, ints(ctx, [1, 2])))
    mean = ctx.op.Div(sums, cast(ctx, area, input.dtype))
    return [ctx.op.Where(_empty_bins(ctx, rows, columns), ctx.constant(0, input.dtype), mean), None]


_CONVOLUTION_SIZES = ("stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "groups", "offset_groups")


def _static_convolution(node: torch.fx.Node) -> bool:
    return all(isinstance(argument(node, name), int) for name in _CONVOLUTION_SIZES)


@translates("torchvision::deform_conv2d", min_opset=19, checker=_static_convolution)
def deform_conv2d(
    ctx, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups,
    offset_groups, use_mask,
):
    # ONNX's DeformConv is torchvision's: offsets in (h, w) pairs per kernel tap, corners outside
    # the map count 0, the mask multiplies each sample.
    compute_type = input.dtype if input.dtype in _FLOAT_OR_DOUBLE else _FLOAT
    operands = [cast(ctx, x, compute_type) for x in (input, weight, offset, bias)]
    if use_mask:
        operands.append(cast(ctx, mask, compute_type))
    convolved = ctx.op.DeformConv(
        *operands,
        dilations=[dilation_h, dilation_w],
        group=groups,
        offset_group=offset_groups,
        pads=[pad_h, pad_w, pad_h, pad_w],
        strides=[stride_h, stride_w],
    )
    return cast(ctx, convolved, input.dtype)
