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
- ``GeneralizedRCNNTransform.batch_images`` pads to a multiple of ``size_divisible`` in integer
  arithmetic: torch.export builds ``int(math.ceil(float(size) / stride) * stride)`` into the
  graph as the example's number, without a guard, so a graph with dynamic image sizes would be
  wrong at every other padded size.
- ``torchvision::nms`` gets a fake kernel whose number of kept boxes may be 0 or 1: torchvision's
  says at least 2 (``create_unbacked_symint()``'s default minimum), and torch.export would build
  that assumption into the graph.

Only torchvision modules already imported are patched (dynexport never imports torchvision), and
everything is put back when the capture ends, also on error.
"""

from __future__ import annotations

import contextlib
import functools
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


# (module, attribute path, replacement): torchvision's code that asks about a number of boxes.
_REPLACEMENTS = (
    ("torchvision.ops.boxes", "batched_nms", _batched_nms),
    ("torchvision.ops", "batched_nms", _batched_nms),
    ("torchvision.ops.poolers", "_multiscale_roi_align", _multiscale_roi_align),
    ("torchvision.models.detection._utils", "BoxCoder.decode", _decode),
    ("torchvision.models.detection.transform", "GeneralizedRCNNTransform.batch_images", _batch_images),
    ("torchvision.models.detection.transform", "paste_masks_in_image", _paste_masks_in_image),
    ("torchvision.models.detection.roi_heads", "paste_masks_in_image", _paste_masks_in_image),
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
