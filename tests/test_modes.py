"""Training modes, is_in_onnx_export() and shape_as_tensor(), as model code sees them."""

from __future__ import annotations

import copy

import pytest
import torch

import dynexport
from dynexport import TrainingMode
from tests.equivalence import assert_close, assert_exports_equivalent


class ChecksExport(torch.nn.Module):
    def forward(self, x):
        if torch.onnx.is_in_onnx_export() and dynexport.is_in_onnx_export():
            return x * 2
        return x


def test_is_in_onnx_export_is_true_only_during_export():
    x = torch.randn(3)
    program = dynexport.export(ChecksExport(), (x,))
    assert_close(program(x), x * 2)
    assert not dynexport.is_in_onnx_export() and not torch.onnx.is_in_onnx_export()
    assert_close(ChecksExport()(x), x)


def test_is_in_onnx_export_is_reset_when_export_fails():
    with pytest.raises(TypeError):
        dynexport.export(ChecksExport(), ("bad",))
    assert not torch.onnx.is_in_onnx_export()


def _bn_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.0))
    model[1].running_mean.fill_(3.0)
    return model


def test_eval_is_the_default_and_the_model_mode_is_restored():
    model = _bn_model().train()
    x = torch.randn(8, 4)
    program = dynexport.export(model, (x,))
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    assert_close(program(x), model(x))


def test_preserve_exports_train_mode_batch_norm_with_batch_statistics():
    model = _bn_model().train()
    x = torch.randn(8, 4)
    program = dynexport.export(model, (x,), training=TrainingMode.PRESERVE)
    with torch.no_grad():
        expected = model(x)
    assert_close(program(x), expected)


def test_training_mode_puts_the_model_in_train_mode_for_the_export():
    model = _bn_model().eval()
    x = torch.randn(8, 4)
    program = dynexport.export(model, (x,), training=TrainingMode.TRAINING)
    assert not model.training
    model.train()
    with torch.no_grad():
        expected = model(x)
    assert_close(program(x), expected)


def test_training_mode_batch_norm_updates_its_running_statistics():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    reference = copy.deepcopy(model)
    calls = [torch.randn(2, 3, 8, 8), torch.randn(5, 3, 8, 8) * 3 + 1, torch.randn(3, 3, 8, 8)]
    program = dynexport.export(
        model, (calls[0],), training=TrainingMode.TRAINING, dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    assert program.buffer_updates == {
        f"1.{name}": f"1.{name}.updated" for name in ("running_mean", "running_var", "num_batches_tracked")
    }
    inputs = [v.name for v in program.model_proto.graph.input]
    assert inputs == ["input", "1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert model[1].num_batches_tracked == 0  # exporting runs nothing
    for x in calls:
        with torch.no_grad():
            expected = reference(x)
        # Each call feeds the statistics the previous one left, as eager's module keeps them.
        assert_close(program(x), expected, atol=1e-5)
        for name, value in program.buffers.items():
            assert_close(value, getattr(reference[1], name.split(".")[1]), atol=1e-6)
    assert program.buffers["1.num_batches_tracked"] == 3 and not torch.allclose(reference[1].running_var, torch.ones(4))


def test_eval_mode_adds_no_buffer_outputs():
    program = dynexport.export(torch.nn.BatchNorm1d(4).train(), (torch.randn(8, 4),))
    assert program.buffer_updates == {} and len(program.model_proto.graph.output) == 1


def test_select_model_mode_for_export_restores_each_submodule():
    model = _bn_model().train()
    model[1].eval()
    with dynexport.select_model_mode_for_export(model, TrainingMode.EVAL):
        assert not any(m.training for m in model.modules())
    assert model.training and model[0].training and not model[1].training
    with pytest.raises(TypeError, match="TrainingMode"):
        dynexport.export(model, (torch.randn(2, 4),), training="eval")


class ReshapesByShapeTensor(torch.nn.Module):
    def forward(self, x):
        shape = dynexport.shape_as_tensor(x)
        return x.flatten() * shape[0], shape


def test_shape_as_tensor_stays_symbolic():
    program = assert_exports_equivalent(
        ReshapesByShapeTensor(), (torch.randn(2, 3),), dynamic_shapes=({0: torch.export.Dim("batch")},),
        resized=[(torch.randn(5, 3),)],
    )
    assert program.model.graph.outputs[1].dtype.name == "INT64"
    assert dynexport.shape_as_tensor(torch.tensor(1.0)).shape == (0,)
