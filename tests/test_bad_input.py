"""Bad input gets a clear error before work is wasted: arguments of the wrong type or out of
range, names that collide, a model with no output, a destination that cannot be written, custom
rules returning the wrong thing, a forward that raises, calls with the wrong kind of input, and
CLI factories that are not functions."""

from __future__ import annotations

import functools
import inspect
import os

import pytest
import torch
from torch.export import Dim

import dynexport
from dynexport import capture as capture_stage
from dynexport import cli
from dynexport.errors import CaptureError, ExportError, TranslationError
from tests.equivalence import assert_exports_equivalent

aten = torch.ops.aten


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


@pytest.fixture
def no_capture(monkeypatch):
    """Fails a test whose export gets as far as capturing the model."""

    def capture(*args, **kwargs):
        raise AssertionError("the model was captured before the bad argument was refused")

    monkeypatch.setattr(capture_stage, "capture", capture)


@pytest.mark.parametrize("argument", ["input_names", "output_names", "kwargs", "dynamic_shapes", "dynamic_axes"])
def test_an_argument_of_the_wrong_type_is_named(argument, no_capture):
    with pytest.raises(TypeError, match=argument):
        dynexport.export(_Linear().eval(), (torch.randn(2, 4),), **{argument: 5})


@pytest.mark.parametrize("argument", ["export_params", "optimize", "verify", "do_constant_folding"])
def test_a_flag_that_is_no_bool_is_named(argument, no_capture):
    with pytest.raises(TypeError, match=argument):
        dynexport.export(_Linear().eval(), (torch.randn(2, 4),), **{argument: "yes"})


@pytest.mark.parametrize("axis", [5, -7, 2])
def test_a_dynamic_axis_out_of_range_names_the_input_and_the_axis(axis, no_capture):
    with pytest.raises(ValueError, match=rf"axis {axis} of input 'x'.*rank 2"):
        dynexport.export(_Linear().eval(), (torch.randn(2, 4),), dynamic_shapes=({axis: Dim("batch")},))


def test_a_dynamic_axis_in_range_still_exports_a_dynamic_model():
    assert_exports_equivalent(
        _Linear().eval(), (torch.randn(2, 4),), dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.randn(5, 4),), (torch.randn(1, 4),)],
    )


@pytest.mark.parametrize(
    "names, match",
    [
        ({"input_names": ["z"], "output_names": ["z"]}, "share"),
        ({"input_names": ["fc.weight"]}, "parameter"),
    ],
)
def test_names_that_collide_are_refused(names, match):
    with pytest.raises(ValueError, match=match):
        dynexport.export(_Linear().eval(), (torch.randn(2, 4),), **names)


class _ReturnsNone(torch.nn.Module):
    def forward(self, x):
        x.add(1)
        return None


class _ReturnsNoneBesideATensor(torch.nn.Module):
    def forward(self, x):
        return None, x * 2


def test_a_model_with_no_tensor_output_is_refused():
    with pytest.raises(ExportError, match="_ReturnsNone returns no tensor"):
        dynexport.export(_ReturnsNone(), (torch.randn(2, 4),))


def test_a_none_beside_a_tensor_output_still_exports():
    assert_exports_equivalent(
        _ReturnsNoneBesideATensor(), (torch.randn(2, 4),), dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.randn(6, 4),)],
    )


def test_a_file_object_opened_for_reading_is_refused_before_capture(tmp_path, no_capture):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    with open(path, "rb") as f, pytest.raises(ValueError, match=r"not open for writing \(mode 'rb'\)"):
        dynexport.export(_Linear().eval(), (torch.randn(2, 4),), f)


def test_a_closed_file_object_is_refused_before_capture(tmp_path, no_capture):
    with open(tmp_path / "m.onnx", "wb") as f:
        pass
    with pytest.raises(ValueError, match="is closed"):
        dynexport.export(_Linear().eval(), (torch.randn(2, 4),), f)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write to any directory")
def test_a_read_only_directory_is_refused_before_capture(tmp_path, no_capture):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="is not writable"):
            dynexport.export(_Linear().eval(), (torch.randn(2, 4),), folder / "m.onnx")
    finally:
        folder.chmod(0o700)


def test_a_directory_without_write_permission_is_refused(tmp_path, monkeypatch, no_capture):
    """The same check, where the tests run as root: the directory's permission as os.access says."""
    monkeypatch.setattr(os, "access", lambda path, mode: os.path.abspath(path) != str(tmp_path))
    with pytest.raises(PermissionError, match="is not writable"):
        dynexport.export(_Linear().eval(), (torch.randn(2, 4),), tmp_path / "m.onnx")


def _relu_returning(result):
    def relu_rule(ctx, self):
        return result(ctx, self)

    return relu_rule


@pytest.mark.parametrize(
    "result, match",
    [
        (lambda ctx, x: None, "returned None for its result"),
        (lambda ctx, x: (ctx.op.Relu(x), ctx.op.Relu(x)), "returned a tuple of 2"),
        (lambda ctx, x: 3, "returned the int 3"),
        (lambda ctx, x: ctx.op.Cast(x, to=7), "returned a INT64 value"),
        (lambda ctx, x: ctx.constant([1.0, 2.0], x.dtype), "returned a 1-d value .* 3-d"),
    ],
    ids=["None", "tuple", "int", "dtype", "rank"],
)
def test_a_custom_rule_returning_the_wrong_thing_is_named_with_its_op(result, match):
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    with pytest.raises(TranslationError, match=rf"aten.relu.default: the custom rule \S*relu_rule {match}"):
        dynexport.export(
            model, (torch.randn(2, 3, 4),), custom_translation_table={aten.relu.default: _relu_returning(result)}
        )


def test_a_custom_rule_returning_the_right_thing_exports():
    rule = _relu_returning(lambda ctx, x: ctx.op.Relu(x))
    assert_exports_equivalent(
        torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()), (torch.randn(2, 3, 4),),
        custom_translation_table={aten.relu.default: rule}, dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.randn(5, 3, 4),)],
    )


class _Raises(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("the model refuses")


def test_a_forward_that_raises_has_its_frame_in_the_capture_error():
    line = inspect.getsourcelines(_Raises.forward)[1] + 1
    with pytest.raises(CaptureError) as caught:
        dynexport.export(_Raises(), (torch.randn(2, 4),))
    message = str(caught.value)
    assert f'File "{__file__}", line {line}, in forward: raise RuntimeError("the model refuses")' in message


@pytest.mark.parametrize(
    "value, error, match",
    [
        (torch.randn(2, 4, device="meta"), ValueError, "input 'x' is on the meta device"),
        (3, TypeError, r"input 'x' must be a torch.float32 tensor of shape \[2, 4\], got the int 3"),
    ],
    ids=["meta", "int"],
)
def test_a_call_with_no_tensor_data_names_the_input(value, error, match):
    program = dynexport.export(_Linear().eval(), (torch.randn(2, 4),))
    with pytest.raises(error, match=match):
        program(value)


class _CallableFactory:
    def __call__(self):
        return _Linear(), (torch.randn(2, 4),)


callable_instance = _CallableFactory()
partial_factory = functools.partial(lambda: (_Linear(), (torch.randn(2, 4),)))


def test_the_cli_factory_must_be_a_function_or_a_class(tmp_path, capsys):
    for name in ("callable_instance", "partial_factory"):
        code = cli.main(["export", f"tests.test_bad_input:{name}", "-o", str(tmp_path / "m.onnx")])
        assert code != 0
        assert "a factory is a function or a class" in capsys.readouterr().err
        assert not (tmp_path / "m.onnx").exists()
