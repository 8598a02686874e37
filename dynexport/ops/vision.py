"""torchvision's operators: ``torchvision::nms`` as NonMaxSuppression, ``roi_align`` as RoiAlign.

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
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import torch

from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import argument, cast, ints, shape_of
from dynexport.ops.sorting import sort
from dynexport.registry import target_name, translates

_FLOAT = ir.DataType.FLOAT
_INT64 = ir.DataType.INT64
# RoiAlign's kernels in onnxruntime: float and double; half precision computes in float.
_ROI_ALIGN_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


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


def _not_aligned(node: torch.fx.Node) -> bool:
    return not argument(node, "aligned")


@translates("torchvision::roi_align", min_opset=16)
@translates("torchvision::roi_align", checker=_not_aligned)
def roi_align(ctx, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    compute_type = input.dtype if input.dtype in _ROI_ALIGN_TYPES else _FLOAT
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
