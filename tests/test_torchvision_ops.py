"""The torchvision operators of tests/torchvision_ops.py give torchvision's results: NMS on boxes
whose answer is worked out by hand, RoIAlign against values computed by hand on a ramp image and
against torchvision's own pure-Python RoIAlign, RoIPool by hand and against onnxruntime's
MaxRoiPool, the position-sensitive pair by hand and against RoIAlign, deformable convolution
against ordinary convolutions of shifted and averaged features. And dynexport translates them
when torchvision loads after it."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys
import textwrap

import onnx
import onnxruntime
import pytest
import torch


def test_nms_keeps_a_box_whose_only_overlap_was_suppressed(torchvision):
    # IoU(a, b) = IoU(b, c) = 1/3 > 0.3, IoU(a, c) = 0: b goes, so c stays.
    boxes = torch.tensor([[0.0, 0, 10, 10], [5, 0, 15, 10], [10, 0, 20, 10]])
    assert torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.3).tolist() == [0, 2]
    assert torchvision.ops.nms(boxes, torch.tensor([0.8, 0.9, 0.7]), 0.3).tolist() == [1]


def test_nms_suppresses_only_above_the_threshold_and_orders_by_score(torchvision):
    boxes = torch.tensor([[0.0, 0, 3, 1], [1, 0, 4, 1], [10, 10, 11, 11]])  # IoU of the first two: 2/4
    scores = torch.tensor([0.5, 0.6, 0.7])
    assert torchvision.ops.nms(boxes, scores, 0.5).tolist() == [2, 1, 0]
    assert torchvision.ops.nms(boxes, scores, 0.49).tolist() == [2, 1]
    same = torch.tensor([0.5, 0.5, 0.5])  # equal scores keep their order (a stable sort)
    assert torchvision.ops.nms(boxes, same, 0.49).tolist() == [0, 2]
    assert torchvision.ops.nms(boxes[:0], scores[:0], 0.5).tolist() == []


def test_batched_nms_paths_agree(torchvision):
    torch.manual_seed(0)
    corners = torch.rand(400, 2) * 50
    boxes = torch.cat([corners, corners + 1 + torch.rand(400, 2) * 20], dim=1)
    scores, classes = torch.rand(400), torch.randint(0, 3, (400,))
    vanilla = torchvision.ops.boxes._batched_nms_vanilla(boxes, scores, classes, 0.5)
    offsets = torchvision.ops.boxes._batched_nms_coordinate_trick(boxes, scores, classes, 0.5)
    assert 0 < len(vanilla) < 400
    assert vanilla.tolist() == offsets.tolist()


def ramp(height: int, width: int) -> torch.Tensor:
    """A 1x1 image whose pixel (y, x) holds x: bilinear sampling at column x gives x."""
    return torch.arange(width, dtype=torch.float32).expand(1, 1, height, width).contiguous()


@pytest.mark.parametrize(
    ("roi", "options", "expected"),
    [
        # Bins [0.5, 2.5] and [2.5, 4.5] (aligned shifts by half a pixel): their centres.
        ([0, 1, 1, 5, 5], {"output_size": 2, "aligned": True}, [1.5, 3.5]),
        ([0, 1, 1, 5, 5], {"output_size": 2, "aligned": False}, [2.0, 4.0]),
        # Four samples per side at 4.5, 5.5, 6.5 and 7.5; the last is clamped to the last column.
        ([0, 4, 0, 8, 2], {"output_size": 1, "sampling_ratio": 4}, [(4.5 + 5.5 + 6.5 + 7) / 4]),
        # Adaptive sampling: ceil(4 / 1) = 4 samples per side, as above.
        ([0, 4, 0, 8, 2], {"output_size": 1, "sampling_ratio": 0}, [(4.5 + 5.5 + 6.5 + 7) / 4]),
        # Half of the ROI in box coordinates (spatial_scale 0.5): columns 2 to 4, centre 3.
        ([0, 4, 0, 8, 4], {"output_size": 1, "spatial_scale": 0.5, "sampling_ratio": 2}, [3.0]),
        # Samples more than a pixel outside the map count as 0.
        ([0, 20, 20, 30, 30], {"output_size": 1, "sampling_ratio": 2}, [0.0]),
    ],
)
def test_roi_align_on_a_ramp(torchvision, roi, options, expected):
    pooled = torchvision.ops.roi_align(ramp(8, 8), torch.tensor([roi], dtype=torch.float32), **options)
    torch.testing.assert_close(pooled[0, 0, 0], torch.tensor(expected))


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_roi_align_matches_torchvisions_python_roi_align(torchvision, aligned, sampling_ratio):
    torch.manual_seed(0)
    features = torch.randn(2, 3, 10, 12)
    # ROIs within the map: torchvision's Python version does not zero samples outside it.
    rois = torch.tensor([[0, 1, 1, 5, 5], [1, 0.3, 2.2, 9.5, 7.1], [1, 2, 2, 3, 3], [0, 0, 0, 11, 9]])
    pooled = torch.ops.torchvision.roi_align(features, rois, 0.9, 3, 2, sampling_ratio, aligned)
    assert torch.equal(torchvision.ops.roi_align(features, rois, (3, 2), 0.9, sampling_ratio, aligned), pooled)
    # The function torchvision compiles on first use, uncompiled.
    reference = importlib.import_module("torchvision.ops.roi_align")._roi_align.__wrapped__
    torch.testing.assert_close(pooled, reference(features, rois, 0.9, 3, 2, sampling_ratio, aligned))


@pytest.mark.parametrize(
    ("roi", "options", "expected", "negated"),
    [
        # Pixels 1 to 5 in two bins 2.5 wide: columns 1 + floor(0) to 1 + ceil(2.5) and 1 +
        # floor(2.5) to 1 + ceil(5), past the last. Of -1 - x, the largest is at the first column.
        ([0, 1, 1, 5, 5], {"output_size": (1, 2)}, [3.0, 5.0], [-2.0, -4.0]),
        # Corners 0.5 and 2.5 round away from zero, to 1 and 3 (to even, 0 and 2).
        ([0, 1, 0, 5, 0], {"output_size": 1, "spatial_scale": 0.5}, [3.0], [-2.0]),
        # Past the map: no pixel, 0.
        ([0, 20, 20, 30, 30], {"output_size": 1}, [0.0], [0.0]),
    ],
)
def test_roi_pool_on_a_ramp(torchvision, roi, options, expected, negated):
    rois = torch.tensor([roi], dtype=torch.float32)
    torch.testing.assert_close(torchvision.ops.roi_pool(ramp(8, 8), rois, **options)[0, 0, 0], torch.tensor(expected))
    torch.testing.assert_close(torchvision.ops.roi_pool(-1 - ramp(8, 8), rois, **options)[0, 0, 0], torch.tensor(negated))


def test_roi_pool_matches_onnxruntimes_max_roi_pool_on_positive_features(torchvision):
    # onnxruntime's MaxRoiPool bins the ROIs as torchvision does (it starts each maximum at the
    # smallest positive float, which positive features never reach).
    generator = torch.Generator().manual_seed(0)
    features = torch.rand(2, 3, 11, 13, generator=generator) + 0.1
    corners = torch.randint(-10, 60, (40, 2), generator=generator) / 2
    sides = torch.randint(-6, 40, (40, 2), generator=generator) / 2
    rois = torch.cat([torch.randint(0, 2, (40, 1), generator=generator), corners, corners + sides], 1).float()
    node = onnx.helper.make_node("MaxRoiPool", ["X", "R"], ["Y"], pooled_shape=[3, 2], spatial_scale=0.5)
    graph = onnx.helper.make_graph(
        [node], "roi_pool",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in ("X", "R")],
        [onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 20)])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"X": features.numpy(), "R": rois.numpy()})
    assert torch.equal(torchvision.ops.roi_pool(features, rois, (3, 2), 0.5), torch.from_numpy(expected))


def test_ps_roi_align_reads_one_channel_per_bin(torchvision):
    torch.manual_seed(0)
    features = torch.randn(2, 12, 10, 12)
    rois = torch.tensor([[0, 1, 1, 5, 5], [1, 0.3, 2.2, 9.5, 7.1], [1, 2, 2, 3, 3.0]])
    pooled = torchvision.ops.ps_roi_align(features, rois, (3, 2), 0.9, 2)
    everything = torchvision.ops.roi_align(features, rois, (3, 2), 0.9, 2, aligned=True)  # [3, 12, 3, 2]
    for channel in range(2):
        for row in range(3):
            for column in range(2):
                read = (channel * 3 + row) * 2 + column
                torch.testing.assert_close(pooled[:, channel, row, column], everything[:, read, row, column])
    # An adaptive grid over a ROI of no height has no sample: 0 / 0.
    assert torchvision.ops.ps_roi_align(features, torch.tensor([[0, 1, 1, 5, 1.0]]), 2, 0.9, 0).isnan().all()


@pytest.mark.parametrize(
    ("roi", "output_size", "expected"),
    [
        # Columns 4 to 8, clipped to 7: the last column never counts. Mean of 4, 5, 6.
        ([0, 4, 0, 8, 2], (1, 1), [5.0]),
        # Two bins 2 pixels wide; the second reads channel 1, the ramp plus 100.
        ([0, 0, 0, 4, 2], (1, 2), [0.5, 102.5]),
    ],
)
def test_ps_roi_pool_on_a_ramp(torchvision, roi, output_size, expected):
    features = torch.cat([ramp(8, 8), ramp(8, 8) + 100], 1)[:, : output_size[0] * output_size[1]]
    pooled = torchvision.ops.ps_roi_pool(features, torch.tensor([roi], dtype=torch.float32), output_size, 1.0)
    torch.testing.assert_close(pooled[0, 0].flatten(), torch.tensor(expected))


def test_deform_conv2d_on_whole_and_half_pixel_offsets(torchvision):
    torch.manual_seed(0)
    features, weight, bias = torch.randn(2, 4, 9, 10), torch.randn(6, 2, 3, 3), torch.randn(6)
    offset = torch.zeros(2, 2 * 9, 9, 10)
    convolved = torch.nn.functional.conv2d(features, weight, bias, padding=1, groups=2)
    torch.testing.assert_close(torchvision.ops.deform_conv2d(features, offset, weight, bias, padding=1), convolved)
    # Every tap one column right: the convolution one column on (the last column has no neighbour).
    right = offset.index_fill(1, torch.arange(1, 18, 2), 1.0)
    shifted = torchvision.ops.deform_conv2d(features, right, weight, bias, padding=1)
    torch.testing.assert_close(shifted[..., :-1], convolved[..., 1:])
    # Half a row down: the convolution of the rows' means, away from the top and bottom rows.
    down = offset.index_fill(1, torch.arange(0, 18, 2), 0.5)
    means = torch.nn.functional.conv2d((features[:, :, :-1] + features[:, :, 1:]) / 2, weight, bias, padding=1, groups=2)
    halfway = torchvision.ops.deform_conv2d(features, down, weight, bias, padding=1)
    torch.testing.assert_close(halfway[:, :, 1:7], means[:, :, 1:7])
    # A mask scales each tap's sample: a mask of 1/2 halves the convolution without its bias.
    masked = torchvision.ops.deform_conv2d(features, offset, weight, bias, padding=1, mask=torch.full((2, 9, 9, 10), 0.5))
    torch.testing.assert_close(masked - bias[:, None, None], (convolved - bias[:, None, None]) / 2)


def test_torchvision_reports_its_operators(torchvision):
    assert torchvision.extension._has_ops()
    assert importlib.import_module("torchvision.ops.roi_align")._has_ops()  # no fallback to its Python version
    for name in ("nms", "roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool", "deform_conv2d"):
        assert hasattr(torch.ops.torchvision, name)


def test_torch_export_records_the_operators(torchvision):
    class PoolAndSuppress(torch.nn.Module):
        def forward(self, features, rois, scores):
            return torchvision.ops.roi_align(features, rois, 2), torchvision.ops.nms(rois[:, 1:], scores, 0.5)

    rois = torch.tensor([[0, 1, 1, 5, 5], [0, 2, 2, 6, 6.0]])
    program = torch.export.export(PoolAndSuppress(), (torch.rand(1, 2, 8, 8), rois, torch.tensor([0.9, 0.8])))
    targets = {node.target for node in program.graph.nodes}
    assert {torch.ops.torchvision.roi_align.default, torch.ops.torchvision.nms.default} <= targets


_EXPORT_AFTER_DYNEXPORT_LOADED = textwrap.dedent("""
    import sys
    import torch
    import dynexport
    assert "torchvision" not in sys.modules and not hasattr(torch.ops.torchvision, "nms")
    from tests.torchvision_ops import load_torchvision
    torchvision = load_torchvision()
    boxes, scores = torch.tensor([[0.0, 0, 3, 1], [1, 0, 4, 1], [10, 10, 11, 11]]), torch.tensor([0.5, 0.6, 0.7])
    program = dynexport.export(lambda b, s: torchvision.ops.nms(b, s, 0.49), (boxes, scores))
    assert program(boxes, scores).tolist() == [2, 1], program(boxes, scores)
""")


def test_dynexport_translates_operators_defined_after_it_loaded():
    # dynexport's torchvision rules are keyed by name: torchvision defines its operators later.
    root = pathlib.Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", _EXPORT_AFTER_DYNEXPORT_LOADED], cwd=root, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
