"""ultralytics YOLO models exported with dynexport and compared with eager PyTorch in onnxruntime.

Models come from the yaml configs ultralytics ships (nano scale, random weights, nothing
downloaded), their BatchNorm statistics set from a batch of images first (``calibrated``: freshly
initialized networks let activations vanish). Two ways users export them:

- ``dynexport.export`` on the ``nn.Module`` (``YOLO(cfg).model``: a DetectionModel,
  SegmentationModel, PoseModel, ...) in eval mode, with ``dynamic_shapes`` or torch.onnx's
  ``dynamic_axes``;
- ultralytics' own ``YOLO.export(format="onnx")``, which calls ``torch.onnx.export(model, im, f,
  opset_version=..., input_names=["images"], output_names=[...], dynamic_axes=..., dynamo=False)``,
  with ``torch.onnx.export = dynexport.export``.

Outputs are compared with the model computed in float64, channel by channel (a detection output
holds box coordinates in pixels, class scores and angles side by side): onnxruntime's error in a
channel, relative to that channel's largest value, may be at most ``ROUNDING`` times eager
float32's worst such error in any output (and the float32 tolerance). Both only round:
onnxruntime's convolutions and the optimizer's BatchNorm folding (ultralytics' own ``fuse`` does
the same) round differently from eager's, up to 5 times its error here (obb's boxes, where
nearly equal numbers are subtracted and scaled by the stride). A translation error is of the
order of the values themselves.

ultralytics imports torchvision: the ``ultralytics`` fixture imports it after the ``torchvision``
fixture. It is told it is offline (``YOLO_OFFLINE``) and keeps its settings in a temporary
directory, and every test here refuses network connections, so that nothing waits on a network.
"""

from __future__ import annotations

import copy
import socket

import onnx
import onnxruntime
import pytest
import torch
import torch.utils._pytree as pytree

import dynexport
from dynexport.errors import CaptureError, DimSpecializedError, TracedSizesError
from dynexport.verification import tolerance
from tests.equivalence import assert_same_structure
from tests.models.test_torchvision import calibrated

Dim = torch.export.Dim
# Image sides are multiples of the largest stride, 32: the neck concatenates upsampled maps with
# the backbone's, which other sizes misalign (in eager PyTorch too).
EXAMPLE = (2, 3, 64, 64)
RESIZED = [(3, 3, 96, 128), (1, 3, 128, 64)]
ROUNDING = 8


@pytest.fixture(scope="module")
def ultralytics(torchvision, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("YOLO_OFFLINE", "1")
        patch.setenv("YOLO_CONFIG_DIR", str(tmp_path_factory.mktemp("ultralytics")))
        import ultralytics

        yield ultralytics


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refused(*args, **kwargs):
        raise OSError("tests/models/test_yolo.py runs without a network")

    monkeypatch.setattr(socket, "getaddrinfo", refused)
    monkeypatch.setattr(socket.socket, "connect", refused)


def yolo(ultralytics, config: str):
    """``YOLO(config)`` with random weights and calibrated BatchNorm statistics."""
    torch.manual_seed(0)
    model = ultralytics.YOLO(config, verbose=False)
    calibrated(model.model, torch.rand(4, 3, 64, 64))
    return model


def assert_matches_eager(
    actual, model: torch.nn.Module, images: torch.Tensor, *, where: str, outputs=lambda result: result
) -> None:
    """``actual`` (onnxruntime's) about as close to the float64 model as ``outputs(model(images))``,
    channel by channel (see above)."""
    with torch.no_grad():
        expected = outputs(model(images))
        precise = outputs(copy.deepcopy(model).double()(images.double()))
    assert_same_structure(actual, expected, where=where)
    rtol, atol = tolerance(torch.float32)
    leaves = list(zip(*map(pytree.tree_leaves, (actual, expected, precise))))
    eager_relative_error = max(
        float((channel_maxima(eager - exact) / (channel_maxima(exact) + atol)).max()) for _, eager, exact in leaves
    )
    for i, (ours, _, exact) in enumerate(leaves):
        ours_error, scale = channel_maxima(ours - exact), channel_maxima(exact)
        allowed = atol + max(rtol, ROUNDING * eager_relative_error) * scale
        worse = (ours_error > allowed).nonzero().flatten().tolist()
        assert not worse, (
            f"{where} output {i}: channels {worse} further from the float64 model than {ROUNDING} times eager's "
            f"float32 error ({ours_error[worse].tolist()} > {allowed[worse].tolist()})"
        )


def channel_maxima(values: torch.Tensor) -> torch.Tensor:
    """The largest ``|value|`` of each channel (dim 1) of an output."""
    return values.detach().double().abs().transpose(0, 1).flatten(1).amax(1)


def assert_dynamic_export_matches_eager(model: torch.nn.Module, **export_options) -> dynexport.ONNXProgram:
    program = dynexport.export(model, (torch.rand(EXAMPLE),), **export_options)
    onnx.checker.check_model(program.model_proto, full_check=True)
    for shape in [EXAMPLE, *RESIZED]:
        images = torch.rand(shape)
        assert_matches_eager(program(images), model, images, where=f"images {shape}")
    return program


def test_detection_model_with_torch_onnx_dynamic_axes(ultralytics):
    model = yolo(ultralytics, "yolov8n.yaml").model
    images = torch.rand(EXAMPLE)
    with torch.no_grad():
        model(images)
    # The head keeps the anchors of the last input size (``if self.dynamic or self.shape !=
    # shape``): a graph captured through that cache would hold the example's anchors, which
    # dynexport refuses. ultralytics' exporter sets ``dynamic`` for dynamic exports; so does a user.
    axes = {"images": {0: "batch", 2: "height", 3: "width"}}
    with pytest.raises(DimSpecializedError, match=r"batch \(x.shape\[0\]\) = 2") as error:
        dynexport.export(model, (images,), input_names=["images"], dynamic_axes=axes)
    assert "self.shape != shape" in error.value.source
    model.model[-1].dynamic = True
    program = assert_dynamic_export_matches_eager(model, input_names=["images"], dynamic_axes=axes)
    assert [str(dim) for dim in program.model.graph.inputs[0].shape] == ["batch", "3", "height", "width"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", ["yolo11n.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml", "yolo11n-obb.yaml", "yolo26n.yaml"]
)
def test_models_with_dynamic_batch_and_image_size(ultralytics, config):
    model = yolo(ultralytics, config).model
    model.model[-1].dynamic = True
    dims = {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}
    assert_dynamic_export_matches_eager(model, dynamic_shapes=(dims,))


@pytest.mark.slow
def test_classifier_with_dynamic_batch_and_image_size(ultralytics):
    model = yolo(ultralytics, "yolo11n-cls.yaml").model
    dims = {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}
    assert_dynamic_export_matches_eager(model, dynamic_shapes=(dims,))


@pytest.mark.slow
@pytest.mark.parametrize("config", ["yolo11n.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml"])
def test_models_with_static_shapes(ultralytics, config):
    model = yolo(ultralytics, config).model
    images = torch.rand(EXAMPLE)
    program = dynexport.export(model, (images,))
    onnx.checker.check_model(program.model_proto, full_check=True)
    assert [int(dim) for dim in program.model.graph.inputs[0].shape] == list(EXAMPLE)
    assert_matches_eager(program(images), model, images, where="example images")


@pytest.mark.parametrize(
    "config, dynamic",
    [
        ("yolov8n.yaml", True),
        ("yolov8n.yaml", False),
        ("yolo11n-seg.yaml", True),
        ("yolo11n-pose.yaml", True),
        pytest.param("yolo11n-seg.yaml", False, marks=pytest.mark.slow),
        pytest.param("yolo11n-pose.yaml", False, marks=pytest.mark.slow),
    ],
)
def test_ultralytics_export_with_dynexport_as_torch_onnx_export(ultralytics, monkeypatch, tmp_path, config, dynamic):
    model = yolo(ultralytics, config)
    monkeypatch.setattr(torch.onnx, "export", dynexport.export)
    monkeypatch.chdir(tmp_path)  # the file is written to the working directory
    path = model.export(format="onnx", imgsz=64, dynamic=dynamic, simplify=False)
    onnx.checker.check_model(path, full_check=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    [images_input], output0 = session.get_inputs(), session.get_outputs()[0]
    if dynamic:
        assert images_input.shape == ["batch", 3, "height", "width"]
        assert output0.shape == ["batch", output0.shape[1], "anchors"]
        shapes = [(1, 3, 64, 64), *RESIZED]
    else:
        assert images_input.shape == [1, 3, 64, 64] and output0.shape == [1, output0.shape[1], 84]
        shapes = [(1, 3, 64, 64)]
    for shape in shapes:
        images = torch.rand(shape)
        actual = tuple(torch.from_numpy(output) for output in session.run(None, {"images": images.numpy()}))
        # ultralytics exports the head's first result only (its ``export`` flag): segmentation's
        # is the detections and the mask prototypes.
        assert_matches_eager(
            actual, model.model, images, where=f"images {shape}",
            outputs=lambda result: tuple(pytree.tree_leaves(result[0])),
        )


def test_ultralytics_static_export_with_nms(ultralytics, monkeypatch, tmp_path):
    """``nms=True`` wraps the model in ultralytics' NMSModel (its batch loop, boolean masks,
    torchvision's ``nms``, ``torch._shape_as_tensor``), traced at the example's batch: with
    ``dynamic=False`` the file equals the wrapper ultralytics handed to ``torch.onnx.export``."""
    model = yolo(ultralytics, "yolov8n.yaml")
    # Random weights saturate the class scores at 1.0, where NMS's order among equal scores and
    # the arg-max among equal classes are arbitrary: smaller class logits give distinct scores.
    with torch.no_grad():
        for branch in model.model.model[-1].cv3:
            branch[-1].weight.mul_(0.02)
            branch[-1].bias.zero_()
    exported = []

    def export(module, args, *rest, **options):
        exported.append((module, args))
        return dynexport.export(module, args, *rest, **options)

    monkeypatch.setattr(torch.onnx, "export", export)
    monkeypatch.chdir(tmp_path)
    path = model.export(format="onnx", imgsz=64, dynamic=False, simplify=False, nms=True)
    onnx.checker.check_model(path, full_check=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (wrapper, _), = exported
    assert type(wrapper).__name__ == "NMSModel"
    torch.manual_seed(1)
    for images in (torch.rand(1, 3, 64, 64), torch.zeros(1, 3, 64, 64)):
        (actual,) = session.run(None, {"images": images.numpy()})
        with torch.no_grad():
            expected = wrapper(images)
        # Rows: x1, y1, x2, y2 (pixels, up to a few hundred), score, class; zeros past the
        # detections in both.
        assert int((expected[..., 4] > 0).sum()) > 10
        torch.testing.assert_close(torch.from_numpy(actual), expected, atol=1e-2, rtol=1e-5)


def test_ultralytics_dynamic_export_with_nms_is_refused(ultralytics, monkeypatch, tmp_path):
    """With ``dynamic=True`` the trace unrolls NMSModel's loop over the batch to the example's
    (ultralytics pads inputs up to its ``batch`` argument, so the graph is wrong for larger
    batches): the retrace at a doubled batch differs, and the export is refused, naming the dim
    and the loop's line."""
    model = yolo(ultralytics, "yolov8n.yaml")
    monkeypatch.setattr(torch.onnx, "export", dynexport.export)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TracedSizesError, match="when batch is 2 instead of 1") as error:
        model.export(format="onnx", imgsz=64, dynamic=True, simplify=False, nms=True)
    assert error.value.dims == ["batch"] and "exporter.py" in error.value.source
