"""torchvision's operators (dynexport/ops/vision.py) against eager torchvision: NMS with a dynamic
number of boxes (none included), at IoUs exactly at the threshold, equal scores and boxes with
corners swapped; batched NMS; RoIAlign both aligned and not, fixed and adaptive sampling, with a
dynamic number of ROIs and feature size. The operators' CPU kernels come from
tests/torchvision_ops.py (the ``torchvision`` fixture)."""

from __future__ import annotations

import contextlib

import onnx
import pytest
import torch

import dynexport
from dynexport.errors import OpsetTooLowError, TranslationError
from tests.equivalence import TESTED_OPSET, assert_as_accurate, assert_exports_equivalent

BOXES = torch.export.Dim("boxes")
ROIS = torch.export.Dim("rois")


def refused_below(opset: int, op: str):
    """A context for an export using torchvision's ``op``, whose ONNX form needs ``opset``:
    below it (the tested opset may be as low as 13), the export raises OpsetTooLowError."""
    if (TESTED_OPSET.get() or dynexport.options.DEFAULT_OPSET) >= opset:
        return contextlib.nullcontext()
    return pytest.raises(OpsetTooLowError, match=f"torchvision.{op}.default.*from opset {opset}")


def random_boxes(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` boxes (x1, y1, x2, y2) with positive sides and their scores."""
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(count, 2, generator=generator) * 40
    sides = 1 + torch.rand(count, 2, generator=generator) * 20
    return torch.cat([corners, corners + sides], 1), torch.rand(count, generator=generator)


def grid_boxes(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes on an integer grid, whose IoUs are often exactly 1/2, 1/3, 1/4..., some with x1 > x2
    or y1 > y2, scored in quarters (so many scores are equal)."""
    generator = torch.Generator().manual_seed(seed)
    corners = torch.randint(0, 8, (count, 2), generator=generator).float()
    sides = torch.randint(-2, 6, (count, 2), generator=generator).float()
    scores = torch.randint(0, 5, (count,), generator=generator).float() / 4
    return torch.cat([corners, corners + sides], 1), scores


class NMS(torch.nn.Module):
    def __init__(self, torchvision, iou_threshold: float):
        super().__init__()
        self.nms, self.iou_threshold = torchvision.ops.nms, iou_threshold

    def forward(self, boxes, scores):
        return self.nms(boxes, scores, self.iou_threshold)


def test_nms_with_any_number_of_boxes(torchvision):
    program = assert_exports_equivalent(
        NMS(torchvision, 0.5),
        random_boxes(30, 0),
        dynamic_shapes=({0: BOXES}, {0: BOXES}),
        resized=[random_boxes(200, 1), random_boxes(1, 2), random_boxes(0, 3)],
    )
    assert [node.op_type for node in program.model.graph].count("NonMaxSuppression") == 1


@pytest.mark.parametrize("iou_threshold", [0.0, 0.25, 0.3, 1 / 3, 0.5, 1.0, 1.5])
def test_nms_at_ious_on_the_threshold_with_equal_scores(torchvision, iou_threshold):
    # Thresholds 1/3 and 0.3 are not floats: a float IoU must fall on the side the double puts it.
    exactly_0_3 = (torch.tensor([[0.0, 0, 10, 1], [0, 0, 3, 1]]), torch.tensor([0.9, 0.8]))  # IoU float32(0.3)
    assert_exports_equivalent(
        NMS(torchvision, iou_threshold),
        grid_boxes(20, 0),
        dynamic_shapes=({0: BOXES}, {0: BOXES}),
        resized=[grid_boxes(count, seed) for seed, count in enumerate([40, 40, 40, 3, 0], start=1)] + [exactly_0_3],
    )


def test_nms_keeps_torchvisions_order_among_equal_scores(torchvision):
    boxes = torch.tensor([[0.0, 0, 3, 1], [1, 0, 4, 1], [10, 10, 11, 11], [20, 20, 21, 21], [1, 0, 4, 1]])
    program = dynexport.export(NMS(torchvision, 0.49), (boxes, torch.rand(5)), dynamic_shapes=({0: BOXES}, {0: BOXES}))
    assert program(boxes, torch.full((5,), 0.5)).tolist() == [0, 2, 3]
    assert program(boxes.flip(0), torch.full((5,), 0.5)).tolist() == [0, 1, 2]


def test_nms_orders_nan_and_infinite_scores_as_torch_sorts_them(torchvision):
    # torch's sort puts NaN above +inf; NonMaxSuppression gets the boxes already in that order.
    def scored(seed):
        boxes, scores = grid_boxes(30, seed)
        generator = torch.Generator().manual_seed(seed)
        scores[torch.rand(30, generator=generator) < 0.2] = torch.nan
        scores[torch.rand(30, generator=generator) < 0.1] = torch.inf
        return boxes, scores

    assert_exports_equivalent(
        NMS(torchvision, 0.3), scored(0), dynamic_shapes=({0: BOXES}, {0: BOXES}), resized=[scored(1), scored(2)]
    )


def test_nms_refuses_what_nonmaxsuppression_cannot_match(torchvision):
    boxes, scores = random_boxes(6, 0)
    with pytest.raises(TranslationError, match="nms.*float32.*float64"):
        dynexport.export(NMS(torchvision, 0.5), (boxes.double(), scores.double()))
    with pytest.raises(TranslationError, match="iou_threshold=-0.1.*disjoint"):
        dynexport.export(NMS(torchvision, -0.1), (boxes, scores))


def test_batched_nms_by_coordinate_offsets(torchvision):
    # Up to 1000 boxes on CPU, batched_nms offsets each class's boxes apart and runs one NMS;
    # torch.export holds the number of boxes to that range.
    def classified(count, seed):
        boxes, scores = random_boxes(count, seed)
        return boxes, scores, torch.randint(0, 3, (count,), generator=torch.Generator().manual_seed(seed))

    boxes = torch.export.Dim("boxes", max=1000)
    assert_exports_equivalent(
        lambda b, s, c: torchvision.ops.batched_nms(b, s, c, 0.5),
        classified(40, 0),
        dynamic_shapes=({0: boxes}, {0: boxes}, {0: boxes}),
        resized=[classified(1000, 1), classified(2, 2)],
    )


def random_rois(count: int, seed: int, images: int = 2) -> torch.Tensor:
    """``count`` ROIs (image index, x1, y1, x2, y2) in image coordinates, some of them past the
    feature map, some smaller than a pixel at scale 1/4, some with corners swapped."""
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(count, 2, generator=generator) * 60 - 5
    sides = torch.rand(count, 2, generator=generator) * 40 - 3
    index = torch.randint(0, images, (count, 1), generator=generator).float()
    return torch.cat([index, corners, corners + sides], 1)


class RoIAlign(torch.nn.Module):
    def __init__(self, torchvision, sampling_ratio: int, aligned: bool):
        super().__init__()
        self.roi_align, self.sampling_ratio, self.aligned = torchvision.ops.roi_align, sampling_ratio, aligned

    def forward(self, features, rois):
        return self.roi_align(features, rois, (3, 2), 0.25, self.sampling_ratio, self.aligned)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align_with_any_number_of_rois_and_feature_size(torchvision, aligned, sampling_ratio):
    height, width = torch.export.Dim("height"), torch.export.Dim("width")
    with refused_below(16 if aligned else 13, "roi_align"):
        program = assert_exports_equivalent(
            RoIAlign(torchvision, sampling_ratio, aligned),
            (torch.randn(2, 3, 12, 14), random_rois(7, 0)),
            dynamic_shapes=({2: height, 3: width}, {0: ROIS}),
            resized=[(torch.randn(2, 3, 20, 9), random_rois(40, 1)), (torch.randn(2, 3, 5, 6), random_rois(0, 2))],
        )
        assert [node.op_type for node in program.model.graph].count("RoiAlign") == 1


def test_roi_align_in_half_precision(torchvision):
    # onnxruntime's RoiAlign computes in float or double: float16 goes through float, which
    # rounds less often than eager's float16 kernel.
    model = RoIAlign(torchvision, 2, False)
    features, rois = torch.randn(1, 3, 12, 14).half(), random_rois(5, 0, images=1).half()
    program = dynexport.export(model, (features, rois))
    onnx.checker.check_model(program.model_proto, full_check=True)
    assert_as_accurate(program(features, rois), model(features, rois), model(features.double(), rois.double()))


def test_roi_align_below_opset_16(torchvision):
    # RoiAlign-10 samples as aligned=False only; aligned=True needs opset 16's half_pixel.
    features, rois = torch.randn(2, 3, 12, 14), random_rois(7, 0)
    assert_exports_equivalent(RoIAlign(torchvision, 2, False), (features, rois), opset_version=15)
    with pytest.raises(OpsetTooLowError, match="torchvision.roi_align.default.*from opset 16"):
        dynexport.export(RoIAlign(torchvision, 2, True), (features, rois), opset_version=15)


class RoIPool(torch.nn.Module):
    """roi_pool at scale 1/2 or ps_roi_pool: ROIs with whole coordinates put corners exactly
    half-way between pixels, where torchvision rounds away from zero."""

    def __init__(self, pool):
        super().__init__()
        self.pool = pool

    def forward(self, features, rois):
        return self.pool(features, rois, (3, 2), 0.5)


def pooled_features(channels: int, height: int, width: int, seed: int) -> torch.Tensor:
    """Features whose first rows are all negative (onnxruntime's MaxRoiPool pools a bin of them
    to 1e-38), with a NaN (never the maximum in torchvision's roi_pool)."""
    features = torch.randn(2, channels, height, width, generator=torch.Generator().manual_seed(seed))
    features[:, :, : height // 2] -= 10
    features[1, 0, 1, 1] = torch.nan
    return features


@pytest.mark.parametrize("op", ["roi_pool", "ps_roi_pool"])
def test_roi_pools_with_any_number_of_rois_and_feature_size(torchvision, op):
    height, width = torch.export.Dim("height"), torch.export.Dim("width")
    program = assert_exports_equivalent(
        RoIPool(getattr(torchvision.ops, op)),
        (pooled_features(12, 12, 14, 0), random_rois(7, 0).round()),
        dynamic_shapes=({2: height, 3: width}, {0: ROIS}),
        resized=[
            (pooled_features(12, 20, 9, 1), random_rois(40, 1).round()),
            (pooled_features(12, 5, 6, 2), random_rois(0, 2)),
        ],
    )
    assert "MaxRoiPool" not in {node.op_type for node in program.model.graph}


@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_ps_roi_align_with_any_number_of_rois_and_feature_size(torchvision, sampling_ratio):
    # Adaptive sampling over a ROI with a side in (-bins, 0] pools to 0 / 0 in torchvision.
    height, width = torch.export.Dim("height"), torch.export.Dim("width")
    model = lambda features, rois: torchvision.ops.ps_roi_align(features, rois, (3, 2), 0.25, sampling_ratio)
    assert model(torch.randn(2, 12, 20, 9), random_rois(40, 1)).isnan().any() == (sampling_ratio == 0)
    with refused_below(16, "ps_roi_align"):
        assert_exports_equivalent(
            model,
            (torch.randn(2, 12, 12, 14), random_rois(7, 0)),
            dynamic_shapes=({2: height, 3: width}, {0: ROIS}),
            resized=[(torch.randn(2, 12, 20, 9), random_rois(40, 1)), (torch.randn(2, 12, 5, 6), random_rois(0, 2))],
        )


def test_roi_pools_refuse_what_they_cannot_match(torchvision):
    features, rois = torch.randn(1, 12, 8, 8), random_rois(3, 0, images=1)
    with pytest.raises(TranslationError, match="roi_pool.*float16.*float32 and float64"):
        dynexport.export(RoIPool(torchvision.ops.roi_pool), (features.half(), rois.half()))
    # The second result, the argmax, only feeds backward.
    with pytest.raises(dynexport.errors.UnsupportedOperatorError, match="torchvision.roi_pool.default"):
        dynexport.export(lambda f, r: torch.ops.torchvision.roi_pool(f, r, 1.0, 2, 2)[1], (features, rois))
    with pytest.raises(OpsetTooLowError, match="torchvision.ps_roi_align.default.*from opset 16"):
        dynexport.export(lambda f, r: torchvision.ops.ps_roi_align(f, r, 2), (features, rois), opset_version=15)


def test_roi_align_needs_an_output_size_known_at_export(torchvision):
    height = torch.export.Dim("height", min=4)
    with pytest.raises(dynexport.errors.UnsupportedOperatorError, match="torchvision.roi_align.default"):
        dynexport.export(
            lambda f, r: torch.ops.torchvision.roi_align(f, r, 1.0, f.shape[2] // 2, 2, 2, False),
            (torch.randn(1, 3, 8, 8), random_rois(3, 0, images=1)),
            dynamic_shapes=({2: height}, None),
        )


class DeformConv(torch.nn.Module):
    def __init__(self, torchvision, use_mask: bool):
        super().__init__()
        self.conv = torchvision.ops.DeformConv2d(8, 4, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
        self.use_mask = use_mask

    def forward(self, features, offset, mask):
        return self.conv(features, offset, mask if self.use_mask else None)


def deform_conv_inputs(batch: int, height: int, width: int, seed: int, offset_groups: int = 1) -> tuple:
    """Features, offsets of up to a few pixels (many samples land past the map) and a mask, for
    DeformConv: a 3x2 kernel, stride (2, 1), padding (1, 0), dilation (1, 2)."""
    generator = torch.Generator().manual_seed(seed)
    out_h, out_w = (height - 1) // 2 + 1, width - 2
    return (
        torch.randn(batch, 8, height, width, generator=generator),
        torch.randn(batch, 2 * offset_groups * 6, out_h, out_w, generator=generator) * 3,
        torch.rand(batch, offset_groups * 6, out_h, out_w, generator=generator),
    )


@pytest.mark.parametrize(("use_mask", "offset_groups", "dtype"), [(False, 1, torch.float32), (True, 2, torch.float64)])
def test_deform_conv2d_with_dynamic_batch_and_size(torchvision, use_mask, offset_groups, dtype):
    model = DeformConv(torchvision, use_mask).eval().to(dtype)

    def inputs(batch, height, width, seed):
        return tuple(t.to(dtype) for t in deform_conv_inputs(batch, height, width, seed, offset_groups))

    batch, rows, columns = torch.export.Dim("batch"), torch.export.Dim("rows", min=3), torch.export.Dim("columns", min=2)
    per_output = {0: batch, 2: rows, 3: columns}  # the features are 2 * rows - 1 high, columns + 2 wide
    dynamic_shapes = ({0: batch, 2: 2 * rows - 1, 3: columns + 2}, per_output, per_output)
    with refused_below(19, "deform_conv2d"):
        program = assert_exports_equivalent(
            model,
            inputs(2, 9, 10, 0),
            resized=[inputs(3, 13, 7, 1), inputs(1, 5, 4, 2)],
            dynamic_shapes=dynamic_shapes,
        )
        assert [node.op_type for node in program.model.graph].count("DeformConv") == 1
