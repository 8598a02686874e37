"""torchvision models (random weights, nothing downloaded) exported with dynamic dims and compared
with eager PyTorch in onnxruntime at the export size and at others.

torchvision comes from the ``torchvision`` fixture (tests/torchvision_ops.py: its operators with
CPU kernels in torch ops when its compiled library does not load). Freshly initialized networks
let activations vanish through their BatchNorms (mobilenet_v3_small's logits are about 1e-10, which
any graph would match); :func:`calibrated` sets each BatchNorm's statistics from a batch first.
"""

from __future__ import annotations

import onnx
import pytest
import torch

import dynexport
from dynexport.errors import CaptureError
from tests.equivalence import BATCH, assert_close

CLASSIFIERS = [
    "resnet18",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "squeezenet1_1",
    "shufflenet_v2_x0_5",
    "regnet_y_400mf",
]
SLOW_CLASSIFIERS = ["mobilenet_v2", "mnasnet0_5", "densenet121"]


def calibrated(model: torch.nn.Module, *batch) -> torch.nn.Module:
    """``model`` in eval mode, its BatchNorm statistics those of ``model(*batch)``."""
    model.eval()
    for norm in model.modules():
        if isinstance(norm, torch.nn.modules.batchnorm._BatchNorm):
            norm.reset_running_stats()
            norm.momentum = None  # the running statistics become the batch's own
            norm.train()
    with torch.no_grad():
        model(*batch)
    return model.eval()


@pytest.mark.parametrize(
    "name", CLASSIFIERS + [pytest.param(name, marks=pytest.mark.slow) for name in SLOW_CLASSIFIERS]
)
def test_classifier_with_dynamic_batch_and_image_size(torchvision, name):
    torch.manual_seed(0)
    model = calibrated(getattr(torchvision.models, name)(weights=None), torch.rand(4, 3, 64, 64))
    # 64 pixels or more: smaller images end in a 1x1 feature map in some of these (32 or less in
    # most), and torch specializes size-1 dims. Sides are multiples of 16: torch.export narrows
    # squeezenet's (ceil-mode pooling) to those, with a warning.
    height, width = torch.export.Dim("height", min=64, max=512), torch.export.Dim("width", min=64, max=512)
    images = [torch.rand(2, 3, 64, 64), torch.rand(3, 3, 96, 80), torch.rand(1, 3, 80, 112)]
    program = dynexport.export(model, (images[0],), dynamic_shapes=({0: BATCH, 2: height, 3: width},))
    onnx.checker.check_model(program.model_proto, full_check=True)
    for x in images:
        with torch.no_grad():
            expected = model(x)
        # Deep float32 networks round differently in onnxruntime (its own convolution algorithms):
        # differences are measured against the largest logit (efficientnet_b0's reach 900 here).
        scale = float(expected.abs().max())
        assert_close(program(x), expected, atol=1e-3 * scale, where=f"images {tuple(x.shape)}")


def best_score(detector: torch.nn.Module, image: torch.Tensor) -> float:
    with torch.no_grad():
        return float(detector([image])[0]["scores"].max())


@pytest.mark.slow
def test_ssdlite_nms_branch_is_refused_or_exported_soundly(torchvision):
    """Issue 13: ssdlite's NMS branches on whether any box is left (``boxes.numel() == 0``);
    a graph with that branch pinned to one answer (draft_export's: none left) must not come out."""
    torch.manual_seed(0)
    detector = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    calibrated(detector, [torch.rand(3, 64, 64) for _ in range(4)])
    with_boxes, without_boxes = torch.rand(3, 64, 64), torch.zeros(3, 64, 64)
    # A score threshold between the two images' best scores: eager finds boxes in one only.
    detector.score_thresh = (best_score(detector, with_boxes) + best_score(detector, without_boxes)) / 2
    with torch.no_grad():
        assert len(detector([with_boxes])[0]["boxes"]) > 0 and len(detector([without_boxes])[0]["boxes"]) == 0
    try:
        program = dynexport.export(detector, ([with_boxes],))
    except CaptureError as error:
        message = str(error)
        assert "depends on input data" in message
        assert "torchvision/ops/boxes.py" in message and "if boxes.numel()" in message
        return
    for image in (with_boxes, without_boxes):
        with torch.no_grad():
            expected = detector([image])
        assert_close(program([image]), expected)
