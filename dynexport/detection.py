"""torchvision's detection models made capturable, for the capture only.

torchvision's detectors (Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS, SSD, SSDlite) keep a
data-dependent number of boxes at each step: score thresholds, small-box removal and NMS give
tensors whose length torch.export knows only as an unbacked size. A few places in torchvision's
code then ask a question about that length that torch.export cannot answer (``if
boxes.numel() == 0``, ``len(rois)``), or torchvision tells torch.export too much about it. While
:func:`detection_code_capturable` is active, each such place is replaced by code that computes
the same result for every input without the question:

- ``batched_nms`` (``torchvision.ops.boxes`` and ``torchvision.ops``) runs NMS once over boxes
  offset by class, as torchvision does for up to 1000 boxes on CPU and whenever it is traced for
  ONNX; its ``if boxes.numel() == 0`` shortcut (``boxes.max()`` fails on no boxes) is replaced by
  a maximum that also holds -inf, which leaves the offsets of any boxes unchanged and gives no
  boxes no offsets. Above 1000 boxes eager torchvision runs one NMS per class instead: the kept
  boxes are the same but for IoU ties within float rounding of the threshold.
- ``_multiscale_roi_align`` (``torchvision.ops.poolers``) sizes its result by ``rois.shape[0]``
  instead of ``len(rois)``, which would fix the number of boxes at the example's.
- ``BoxCoder.decode`` drops its ``if box_sum > 0`` branches where the codes have a row per box
  (every caller in torchvision), giving [boxes, classes, 4] for no boxes too (torchvision's
  callers reshape or split it, which gives the same results either way).
- ``_resize_image_and_masks`` (``torchvision.models.detection.transform``) scales by the smaller
  of ``min_size / min(h, w)`` and ``max_size / max(h, w)`` with Python's ``min``, which
  torch.export answers for the example without a guard: a graph captured from an image of
  aspect ratio below ``max_size / min_size`` would resize wider images too little. The
  replacement computes the same size with ``torch.sym_min``.
- ``GeneralizedRCNNTransform.batch_images`` pads to a multiple of ``size_divisible`` in integer
  arithmetic: torch.export builds ``int(math.ceil(float(size) / stride) * stride)`` into the
  graph as the example's number, without a guard, so a graph with dynamic image sizes would be
  wrong at every other padded size.
- ``heatmaps_to_keypoints`` (``torchvision.models.detection.roi_heads``, Keypoint R-CNN) resizes
  each detection's keypoint heatmaps to its box's size (read from data) in a loop and takes
  their arg-max: it is computed for every detection at once on the largest box's size, each
  pixel by torch's bicubic formulas, the pixels outside a detection's own size masked.
- ``torchvision::nms`` gets a fake kernel whose number of kept boxes may be 0 or 1: torchvision's
  says at least 2 (``create_unbacked_symint()``'s default minimum), and torch.export would build
  that assumption into the graph.

Only torchvision modules already imported are patched (dynexport never imports torchvision), and
everything is put back when the capture ends, also on error.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable, Iterator

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["detection_code_capturable"]


def _batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """``torchvision.ops.batched_nms`` by torchvision's coordinate trick, with no branch on the
    number of boxes."""
    max_coordinate = torch.cat([boxes.reshape(-1), boxes.new_full((1,), float("-inf"))]).max()
    offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    return sys.modules["torchvision.ops.boxes"].nms(boxes + offsets[:, None], scores, iou_threshold)


def _multiscale_roi_align(
    x_filtered: list[torch.Tensor],
    boxes: list[torch.Tensor],
    output_size: list[int],
    sampling_ratio: int,
    scales: list[float] | None,
    mapper: Callable[[list[torch.Tensor]], torch.Tensor] | None,
) -> torch.Tensor:
    """``torchvision.ops.poolers._multiscale_roi_align`` with the number of boxes a size."""
    poolers = sys.modules["torchvision.ops.poolers"]
    if scales is None or mapper is None:
        raise ValueError("scales and mapper should not be None")
    rois = poolers._convert_to_roi_format(boxes)
    if len(x_filtered) == 1:
        return poolers.roi_align(
            x_filtered[0], rois, output_size=output_size, spatial_scale=scales[0], sampling_ratio=sampling_ratio
        )
    levels = mapper(boxes)
    first = x_filtered[0]
    result = first.new_zeros((rois.shape[0], first.shape[1], *output_size))
    for level, (per_level_feature, scale) in enumerate(zip(x_filtered, scales)):
        idx_in_level = torch.where(levels == level)[0]
        pooled = poolers.roi_align(
            per_level_feature,
            rois[idx_in_level],
            output_size=output_size,
            spatial_scale=scale,
            sampling_ratio=sampling_ratio,
        )
        result[idx_in_level] = pooled.to(result.dtype)
    return result


def _decode(self, rel_codes: torch.Tensor, boxes: list[torch.Tensor]) -> torch.Tensor:
    """``BoxCoder.decode`` with no branch on the number of boxes where the codes have a row per
    box (every caller in torchvision): the result is [boxes, classes, 4] even for no boxes, where
    torchvision's is [0, classes * 4], which its callers reshape to [-1, 4] or split by image."""
    box_sum = sum(box.size(0) for box in boxes)
    if rel_codes.dim() != 2 or not statically_known_true(rel_codes.size(0) == box_sum):
        return _ORIGINALS[_decode](self, rel_codes, boxes)
    pred_boxes = self.decode_single(rel_codes, torch.cat(boxes, dim=0))
    return pred_boxes.reshape(box_sum, pred_boxes.size(1) // 4, 4)


def _resize_image_and_masks(
    image: torch.Tensor,
    self_min_size: int,
    self_max_size: int,
    target: dict[str, torch.Tensor] | None = None,
    fixed_size: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """``_resize_image_and_masks`` (``torchvision.models.detection.transform``) with the resized
    size computed from ``torch.sym_min``/``torch.sym_max`` of the sides. torchvision takes
    Python's ``min`` of two ratios of sizes, which torch.export answers for the example (is the
    image's aspect ratio above max_size / min_size?) without a guard. Given as ``fixed_size``,
    the size is what ``interpolate`` computes from the scale with ``recompute_scale_factor``
    (``floor(side * scale)`` in double), so the image is resampled the same way."""
    if fixed_size is None:
        height, width = image.shape[-2:]
        scale = torch.sym_min(self_min_size / torch.sym_min(height, width), self_max_size / torch.sym_max(height, width))
        fixed_size = (math.floor(width * scale), math.floor(height * scale))
    return _ORIGINALS[_resize_image_and_masks](image, self_min_size, self_max_size, target, fixed_size)


def _batch_images(self, images: list[torch.Tensor], size_divisible: int = 32) -> torch.Tensor:
    """``GeneralizedRCNNTransform.batch_images`` with the padded size a SymInt: both round up to
    a multiple of the stride (torchvision's float form exactly so below 2**26 pixels)."""
    max_size = [functools.reduce(torch.sym_max, sizes) for sizes in zip(*(image.shape for image in images))]
    for dim in (1, 2):
        max_size[dim] = -(-max_size[dim] // size_divisible) * size_divisible
    batched = images[0].new_full([len(images), *max_size], 0)
    for i, image in enumerate(images):
        batched[i, : image.shape[0], : image.shape[1], : image.shape[2]].copy_(image)
    return batched


def _paste_masks_in_image(
    masks: torch.Tensor, boxes: torch.Tensor, img_shape: tuple[int, int], padding: int = 1
) -> torch.Tensor:
    """``paste_masks_in_image`` for every mask at once, where torchvision loops over the masks,
    resizing each to its box (a size read from data) and copying it into an empty image: here
    each pixel of the image inside a box takes the sample of its mask that ``F.interpolate``'s
    bilinear resize puts there."""
    roi_heads = sys.modules["torchvision.models.detection.roi_heads"]
    masks, scale = roi_heads.expand_masks(masks, padding=padding)
    boxes = roi_heads.expand_boxes(boxes, scale).to(dtype=torch.int64)
    masks = masks[:, 0]
    im_h, im_w = img_shape
    rows, row_weights, row_inside = _bilinear_taps(boxes[:, 1], boxes[:, 3], im_h, masks.shape[1], masks.dtype)
    cols, col_weights, col_inside = _bilinear_taps(boxes[:, 0], boxes[:, 2], im_w, masks.shape[2], masks.dtype)
    mask_index = torch.arange(masks.shape[0], device=masks.device)[:, None, None]
    pasted = sum(
        masks[mask_index, rows[..., i, None], cols[:, None, :, j]] * row_weights[..., i, None] * col_weights[:, None, :, j]
        for i in (0, 1)
        for j in (0, 1)
    )
    inside = row_inside[:, :, None] & col_inside[:, None, :]
    return torch.where(inside, pasted, torch.zeros((), dtype=masks.dtype, device=masks.device))[:, None]


def _bilinear_taps(
    start: torch.Tensor, end: torch.Tensor, size: int, source_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each box (``start``/``end``: its first and last pixel along one axis) and each of the
    image's ``size`` pixels along that axis: the two source pixels and the weights of torch's
    bilinear resize (``align_corners=False``) of ``source_size`` pixels to the box's length, and
    whether the pixel lies in the box."""
    pixel = torch.arange(size, device=start.device)
    length = (end - start + 1).clamp(min=1)
    offset = pixel[None, :] - start[:, None]
    inside = (offset >= 0) & (pixel[None, :] <= end[:, None])
    scale = torch.tensor(source_size, dtype=dtype, device=start.device) / length.to(dtype)
    source = (scale[:, None] * (offset.to(dtype) + 0.5) - 0.5).clamp(min=0)
    low = source.floor().to(torch.int64).clamp(max=source_size - 1)
    weight = (source - low.to(dtype)).clamp(0, 1)
    high = torch.where(low < source_size - 1, low + 1, low)
    return torch.stack([low, high], -1), torch.stack([1 - weight, weight], -1), inside


def _heatmaps_to_keypoints(maps: torch.Tensor, rois: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``heatmaps_to_keypoints`` (``torchvision.models.detection.roi_heads``) for every detection
    at once, where torchvision loops over the detections, resizing each one's keypoint heatmaps
    to its box's size (read from data) with ``F.interpolate``'s bicubic mode and taking the
    arg-max. Here every map is resized to the largest box's size, each pixel from torch's taps
    and weights summed in its kernel's order (the width first), the pixels outside the
    detection's own size masked, and the arg-max taken in the same row-major order (the first of
    equal maxima). torch's compiled kernel fuses some multiply-adds, so pixels agree within float
    rounding, not always to the bit: only where two pixels of a map are that close to its maximum
    may the keypoint differ."""
    offset_x, offset_y = rois[:, 0], rois[:, 1]
    widths = (rois[:, 2] - rois[:, 0]).clamp(min=1)
    heights = (rois[:, 3] - rois[:, 1]).clamp(min=1)
    widths_ceil, heights_ceil = widths.ceil(), heights.ceil()
    rows, row_weights, row_inside = _bicubic_taps(heights_ceil, maps.shape[2])
    cols, col_weights, col_inside = _bicubic_taps(widths_ceil, maps.shape[3])
    count, keypoints, map_height = maps.shape[:3]
    out_height, out_width = rows.shape[1], cols.shape[1]
    # torch resizes along the width first, then sums those rows along the height, term by term
    # (each added as it is made: the full-size maps are the memory this takes).
    resized_rows = functools.reduce(
        torch.add,
        (
            maps.gather(3, cols[:, None, None, :, j].expand(count, keypoints, map_height, out_width))
            * col_weights[:, None, None, :, j]
            for j in range(4)
        ),
    )
    resized = functools.reduce(
        torch.add,
        (
            resized_rows.gather(2, rows[:, None, :, i, None].expand(count, keypoints, out_height, out_width))
            * row_weights[:, None, :, i, None]
            for i in range(4)
        ),
    )
    inside = row_inside[:, None, :, None] & col_inside[:, None, None, :]
    resized = torch.where(inside, resized, torch.tensor(float("-inf"), dtype=resized.dtype, device=resized.device))
    flat = resized.flatten(2)
    position = flat.argmax(dim=2)
    x_int, y_int = position % out_width, position // out_width
    x = (x_int.float() + 0.5) * (widths / widths_ceil)[:, None] + offset_x[:, None]
    y = (y_int.float() + 0.5) * (heights / heights_ceil)[:, None] + offset_y[:, None]
    xy_preds = torch.stack([x, y, torch.ones_like(x)], dim=2)
    return xy_preds, flat.gather(2, position[..., None])[..., 0].float()


def _bicubic_taps(lengths: torch.Tensor, source_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each detection (``lengths``: its resized map's side, a whole number from 1) and each
    pixel up to the longest side: the four source pixels and the weights of torch's CPU bicubic
    resize (``align_corners=False``, A = -0.75) of ``source_size`` pixels to the detection's
    side, by the kernel's formulas in float32; and whether the pixel lies within that side."""
    longest = torch.cat([lengths, lengths.new_ones(1)]).max().to(torch.int64).item()
    torch._check(longest >= 1)
    pixel = torch.arange(longest, device=lengths.device)
    scale = torch.tensor(source_size, dtype=torch.float32, device=lengths.device) / lengths
    source = scale[:, None] * (pixel.float() + 0.5) - 0.5
    index = source.floor().to(torch.int64).clamp(max=source_size - 1)
    t = (source - index.float()).clamp(0, 1)
    weights = [_cubic_far(t + 1), _cubic_near(t), _cubic_near(1 - t), _cubic_far((1 - t) + 1)]
    taps = torch.stack([(index + (j - 1)).clamp(0, source_size - 1) for j in range(4)], -1)
    return taps, torch.stack(weights, -1), pixel[None, :].float() < lengths[:, None]


_CUBIC_A = -0.75  # torch's bicubic coefficient


def _cubic_near(x: torch.Tensor) -> torch.Tensor:
    """torch's ``cubic_convolution1``: the weight of a tap within one pixel."""
    return ((_CUBIC_A + 2) * x - (_CUBIC_A + 3)) * x * x + 1


def _cubic_far(x: torch.Tensor) -> torch.Tensor:
    """torch's ``cubic_convolution2``: the weight of a tap one to two pixels away."""
    return ((_CUBIC_A * x - 5 * _CUBIC_A) * x + 8 * _CUBIC_A) * x - 4 * _CUBIC_A


# (module, attribute path, replacement): torchvision's code that asks about a number of boxes.
_REPLACEMENTS = (
    ("torchvision.ops.boxes", "batched_nms", _batched_nms),
    ("torchvision.ops", "batched_nms", _batched_nms),
    ("torchvision.ops.poolers", "_multiscale_roi_align", _multiscale_roi_align),
    ("torchvision.models.detection._utils", "BoxCoder.decode", _decode),
    ("torchvision.models.detection.transform", "_resize_image_and_masks", _resize_image_and_masks),
    ("torchvision.models.detection.transform", "GeneralizedRCNNTransform.batch_images", _batch_images),
    ("torchvision.models.detection.transform", "paste_masks_in_image", _paste_masks_in_image),
    ("torchvision.models.detection.roi_heads", "paste_masks_in_image", _paste_masks_in_image),
    ("torchvision.models.detection.roi_heads", "heatmaps_to_keypoints", _heatmaps_to_keypoints),
)
# The replaced originals, while replaced (by replacement).
_ORIGINALS: dict[Callable, Callable] = {}


def _nms_kept(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """The indices NMS keeps: any number from none to every box."""
    torch._check(dets.dim() == 2 and dets.size(1) == 4, lambda: f"boxes should be [N, 4], got {list(dets.shape)}")
    torch._check(scores.dim() == 1 and scores.size(0) == dets.size(0), lambda: "scores should be [N] for N boxes")
    kept = torch.library.get_ctx().new_dynamic_size()
    torch._check(kept <= dets.size(0))
    return dets.new_empty((kept,), dtype=torch.long)


@contextlib.contextmanager
def detection_code_capturable() -> Iterator[None]:
    """Within the block, torchvision's detection code (those of its modules already imported)
    captures with data-dependent numbers of boxes (module doc)."""
    if "torchvision.ops.boxes" not in sys.modules:
        yield
        return
    replaced = []
    library = torch.library.Library("torchvision", "FRAGMENT")
    try:
        for module_name, path, replacement in _REPLACEMENTS:
            module = sys.modules.get(module_name)
            *owner_path, attribute = path.split(".")
            owner = functools.reduce(getattr, owner_path, module) if module is not None else None
            if owner is not None and attribute in vars(owner):
                original = vars(owner)[attribute]
                replaced.append((owner, attribute, original))
                _ORIGINALS[replacement] = original
                setattr(owner, attribute, replacement)
        if hasattr(torch.ops.torchvision, "nms"):
            torch.library.register_fake("torchvision::nms", _nms_kept, lib=library, allow_override=True)
        yield
    finally:
        library._destroy()
        for owner, attribute, original in reversed(replaced):
            setattr(owner, attribute, original)
        _ORIGINALS.clear()
