"""Training modes, is_in_onnx_export() and shape_as_tensor(), as model code sees them."""

from __future__ import annotations

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
