"""dynexport.export's arguments: conventions of torch.onnx.export, validation, naming, files."""

from __future__ import annotations

import gc
import io
import os

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import dynexport
from tests.equivalence import assert_close, assert_exports_equivalent

Dim = torch.export.Dim


class TwoLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.encoder(x))


class CountingModule(torch.nn.Module):
    """Counts forward calls, to prove validation happens before capture."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + 1


def test_export_returns_program_and_writes_file(tmp_path):
    path = tmp_path / "model.onnx"
    program = dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),), str(path))
    assert isinstance(program, dynexport.ONNXProgram)
    saved = onnx.load(str(path))
    onnx.checker.check_model(saved, full_check=True)
    assert saved.producer_name == "dynexport"
    assert saved.producer_version == dynexport.__version__
    assert [(o.domain, o.version) for o in saved.opset_import] == [("", dynexport.DEFAULT_OPSET)]
    assert sorted(i.name for i in saved.graph.initializer) == [
        "encoder.0.bias", "encoder.0.weight", "head.bias", "head.weight",
    ]


def test_export_to_binary_file_object_and_pathlike(tmp_path):
    buffer = io.BytesIO()
    dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),), buffer)
    onnx.checker.check_model(onnx.load_from_string(buffer.getvalue()))
    dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),), tmp_path / "p.onnx")
    assert (tmp_path / "p.onnx").stat().st_size > 0


def test_text_file_object_is_rejected_before_capture(tmp_path):
    model = CountingModule()
    with open(tmp_path / "t.txt", "w") as text, pytest.raises(TypeError, match="binary file object"):
        dynexport.export(model, (torch.randn(2),), text)
    assert model.calls == 0


def test_missing_directory_is_rejected_before_capture(tmp_path):
    model = CountingModule()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dynexport.export(model, (torch.randn(2),), tmp_path / "missing" / "m.onnx")
    assert model.calls == 0


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),), path)
    assert list(tmp_path.iterdir()) == []


def test_failed_export_does_not_touch_existing_file(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"previous model")
    with pytest.raises(TypeError):
        dynexport.export(CountingModule(), ("not a tensor",), path)
    assert path.read_bytes() == b"previous model"


def test_single_tensor_args_and_plain_function():
    x = torch.randn(3, 4)
    program = dynexport.export(torch.nn.ReLU(), x)
    assert_close(program(x), torch.relu(x))

    def scale_shift(a, b):
        return a * 2 + b

    program = dynexport.export(scale_shift, (x, x))
    assert [v.name for v in program.model.graph.inputs] == ["a", "b"]
    assert_close(program(x, x), scale_shift(x, x))


class WithOptions(torch.nn.Module):
    def forward(self, x, table=None, *, scale=1.0, shift=None):
        y = x * scale
        if table is not None:
            y = y + table["bias"]
        if shift is not None:
            y = y - shift
        return y


def test_trailing_dict_in_args_means_kwargs():
    x = torch.randn(2, 3)
    program = dynexport.export(WithOptions(), (x, {"shift": torch.randn(2, 3)}))
    assert [v.name for v in program.model.graph.inputs] == ["x", "shift"]
    assert_close(program(x, shift=x * 2), WithOptions()(x, shift=x * 2))


def test_empty_trailing_dict_lets_a_dict_be_positional():
    x = torch.randn(2, 3)
    table = {"bias": torch.randn(2, 3)}
    program = dynexport.export(WithOptions(), (x, table, {}))
    assert [v.name for v in program.model.graph.inputs] == ["x", "table_bias"]
    assert_close(program(x, table, {}), WithOptions()(x, table))


def test_kwargs_argument_and_python_scalars_are_baked_in():
    x = torch.randn(2, 3)
    program = dynexport.export(WithOptions(), (x,), kwargs={"scale": 3.0})
    assert [v.name for v in program.model.graph.inputs] == ["x"]
    assert_close(program(x, scale=3.0), x * 3.0)


def test_dynamic_shapes_dict_naming_some_arguments_leaves_the_others_static():
    # torch.export (and torch.onnx) want every argument passed named, `scale` too
    x, shift = torch.randn(2, 3), torch.randn(3)
    program = dynexport.export(
        WithOptions(), (x,), kwargs={"scale": 3.0, "shift": shift}, dynamic_shapes={"x": {0: Dim("batch")}}
    )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "3"]
    assert [d for d in program.model.graph.inputs[1].shape] == [3]
    resized = torch.randn(5, 3)
    assert_close(program(resized, scale=3.0, shift=shift), resized * 3.0 - shift)


def test_dynamic_shapes_dict_naming_an_unknown_argument_is_refused_with_the_names():
    with pytest.raises(dynexport.errors.CaptureError, match=r"arg names \['x', 'scale'\]"):
        dynexport.export(WithOptions(), (torch.randn(2, 3),), kwargs={"scale": 3.0}, dynamic_shapes={"X": {0: Dim("b")}})


def test_no_full_collection_runs_during_an_export_and_the_users_thresholds_come_back():
    seen = []
    previous = gc.get_threshold()
    gc.set_threshold(500, 7, 9)  # a process's own tuning
    try:
        dynexport.export(lambda x: seen.append(gc.get_threshold()) or x + 1, (torch.randn(2),))
        assert seen[0][:2] == (500, 7) and seen[0][2] > 10**6
        assert gc.get_threshold() == (500, 7, 9)
    finally:
        gc.set_threshold(*previous)


def test_string_argument_gets_an_error_naming_it():
    with pytest.raises(TypeError, match=r"argument args\[1\] is a str"):
        dynexport.export(WithOptions(), (torch.randn(2), "fast"))
    with pytest.raises(TypeError, match=r"argument kwargs\['shift'\]\['mode'\] is a str"):
        dynexport.export(WithOptions(), (torch.randn(2),), kwargs={"shift": {"mode": "x"}})


def test_input_and_output_names():
    program = dynexport.export(
        TwoLayer().eval(), (torch.randn(2, 4),), input_names=["features"], output_names=["scores"]
    )
    graph = program.model.graph
    assert [v.name for v in graph.inputs] == ["features"]
    assert [v.name for v in graph.outputs] == ["scores"]


def test_the_seed_alexnet_example_names_the_inputs_then_the_parameters(torchvision, tmp_path, capsys):
    # The first example of the torch.onnx docs, as written there (weights=None for
    # pretrained=True, the CPU for "cuda": tests/test_cuda.py runs it there).
    dummy_input = torch.randn(10, 3, 224, 224)
    model = torchvision.models.alexnet(weights=None)
    input_names = ["actual_input_1"] + ["learned_%d" % i for i in range(16)]
    output_names = ["output1"]
    path = tmp_path / "alexnet.onnx"
    dynexport.export(model, dummy_input, str(path), verbose=True, input_names=input_names, output_names=output_names)
    printed = capsys.readouterr().out
    assert "%actual_input_1 : float[10, 3, 224, 224]" in printed and "%learned_15 : float[1000]" in printed
    saved = onnx.load(str(path))
    assert [v.name for v in saved.graph.input] == ["actual_input_1"]
    assert [v.name for v in saved.graph.output] == ["output1"]
    weights = {t.name: list(t.dims) for t in saved.graph.initializer}
    # "the flat list of inputs followed by the flat list of parameters", in the model's order
    for name, parameter in zip(input_names[1:], model.parameters()):
        assert weights[name] == list(parameter.shape), name
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output1,) = session.run(None, {"actual_input_1": dummy_input.numpy()})
    with torch.no_grad():
        assert_close(torch.from_numpy(output1), model.eval()(dummy_input))


class _Normalized(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


def test_parameters_the_graph_folds_away_leave_their_names_unused_with_a_warning():
    model = _Normalized().eval()
    names = ["image", "w", "b", "gamma", "beta", "mean", "var"]  # state_dict order
    with pytest.warns(UserWarning, match=r"'gamma' \(the model's bn.weight\).*'var' \(the model's bn.running_var\).*goes unused"):
        program = assert_exports_equivalent(model, (torch.randn(2, 3, 8, 8),), input_names=names)
    assert [v.name for v in program.model.graph.inputs] == ["image"]
    # BatchNorm is folded into the convolution: its weights are new ones, under their own names.
    assert not {"gamma", "beta", "mean", "var"} & set(program.model.graph.initializers)


def test_a_parameter_name_taken_by_an_inner_value_moves_that_value_aside():
    model = TwoLayer().eval()
    program = assert_exports_equivalent(model, (torch.randn(2, 4),), input_names=["x", "relu", "b1"])
    weights = program.model.graph.initializers
    assert list(weights["relu"].const_value.numpy().shape) == [8, 4]  # encoder.0.weight


def test_parameter_names_also_name_weights_fed_as_graph_inputs():
    program = dynexport.export(
        TwoLayer().eval(), (torch.randn(2, 4),), input_names=["x", "w0", "b0", "w1", "b1"], export_params=False
    )
    assert sorted(v.name for v in program.model.graph.inputs) == ["b0", "b1", "w0", "w1", "x"]
    assert not program.model.graph.initializers


def test_names_beyond_the_inputs_of_an_exported_program_name_its_state_dict():
    model = TwoLayer().eval()
    x = torch.randn(2, 4)
    program = torch.export.export(model, (x,))
    exported = dynexport.export(program, (x,), input_names=["x", "w0", "b0", "w1", "b1"])
    assert_close(exported(x), model(x))
    weights = exported.model.graph.initializers
    assert sorted(weights) == ["b0", "b1", "w0", "w1"]
    torch.testing.assert_close(torch.from_numpy(weights["w1"].const_value.numpy()), model.head.weight.detach())
    with pytest.raises(ValueError, match="at most 5 names fit"):
        dynexport.export(program, (x,), input_names=["x", "w0", "b0", "w1", "b1", "extra"])


def test_more_names_than_inputs_and_parameters_fail_before_work():
    model = CountingModule()
    with pytest.raises(ValueError, match="at most 1 names fit"):
        dynexport.export(model, (torch.randn(2, 3),), input_names=["x", "extra"])
    assert model.calls == 0


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"input_names": ["a", "b"]}, ValueError, r"input_names has 2 names, but the model takes 1 tensor input\(s\) .* and holds 0 parameters"),
        ({"input_names": ["a", "a"]}, ValueError, "repeats"),
        ({"input_names": "x"}, TypeError, "list of non-empty strings"),
        ({"output_names": ["a", "b"]}, ValueError, "output_names has 2 names"),
        ({"opset_version": 9}, ValueError, "opset_version=9 is not supported"),
        ({"opset_version": 24}, ValueError, "13..23"),
        ({"opset_version": 12}, ValueError, "opset_version=12 is not supported; choose one of 13..23"),
        ({"dynamic_shapes": ({0: Dim("b")},), "dynamic_axes": {"x": [0]}}, ValueError, "not both"),
        ({"dynamic_axes": {"nope": {0: "batch"}}}, ValueError, "neither an input nor an output"),
        ({"dynamic_axes": {"x": {5: "batch"}}}, ValueError, "axis 5"),
        ({"dynamic_axes": {"x": "batch"}}, TypeError, "must be a dict"),
        ({"custom_translation_table": {torch.ops.aten.relu.default: 3}}, TypeError, "must be callable"),
        ({"dynamo": "no"}, TypeError, "dynamo must be True or False"),
    ],
)
def test_inconsistent_arguments_fail_before_work(options, error, match):
    model = CountingModule()
    with pytest.raises(error, match=match):
        dynexport.export(model, (torch.randn(2, 3),), **options)
    if "output_names" not in options:
        assert model.calls == 0


@pytest.mark.parametrize("opset", list(dynexport.SUPPORTED_OPSETS))
def test_every_supported_opset(opset):
    program = assert_exports_equivalent(TwoLayer().eval(), (torch.randn(2, 4),), opset_version=opset)
    assert program.model.opset_imports[""] == opset


def test_dynamic_axes_dict_form_names_dims():
    program = assert_exports_equivalent(
        TwoLayer().eval(),
        (torch.randn(2, 4),),
        input_names=["features"],
        output_names=["scores"],
        dynamic_axes={"features": {0: "batch"}, "scores": {0: "batch"}},
        resized=[(torch.randn(7, 4),)],
    )
    assert program.model.graph.inputs[0].shape[0] == "batch"
    assert program.model.graph.outputs[0].shape[0] == "batch"


def test_dynamic_axes_list_form():
    program = assert_exports_equivalent(
        lambda a, b: a @ b, (torch.randn(2, 3), torch.randn(3, 5)),
        dynamic_axes={"a": [0], "b": [1]}, resized=[(torch.randn(4, 3), torch.randn(3, 2))],
    )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["a_dim_0", "3"]
    assert [str(d) for d in program.model.graph.outputs[0].shape] == ["a_dim_0", "b_dim_1"]


def test_dim_names_come_from_dynamic_shapes():
    batch, seq = Dim("batch"), Dim("seq")
    program = assert_exports_equivalent(
        lambda x, m: (x * m).sum(-1), (torch.randn(2, 5), torch.randn(2, 5)),
        dynamic_shapes={"x": {0: batch, 1: seq}, "m": {0: batch, 1: seq}},
        resized=[(torch.randn(3, 9), torch.randn(3, 9))],
    )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "seq"]


@pytest.mark.parametrize("example_batch", [0, 1])
def test_batch_of_zero_or_one_stays_dynamic(example_batch):
    model = TwoLayer().eval()
    program = assert_exports_equivalent(
        model, (torch.randn(example_batch, 4),), dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.randn(4, 4),), (torch.randn(1, 4),)],
    )
    assert program.model.graph.inputs[0].shape[0] == "batch"


def test_exported_program_is_accepted_and_not_recaptured():
    ep = torch.export.export(TwoLayer().eval(), (torch.randn(2, 4),), dynamic_shapes=({0: Dim("n")},))
    program = dynexport.export(ep, ())
    assert program.capture_strategy == "given ExportedProgram"
    x = torch.randn(5, 4)
    assert_close(program(x), ep.module()(x))
    with pytest.raises(ValueError, match="already captured|fixed when it was captured"):
        dynexport.export(ep, (), dynamic_shapes=({0: Dim("n")},))


def test_a_decomposed_exported_program_with_effect_tokens_exports():
    # run_decompositions() threads an effect token through inv's error check
    # (with_effects(token, aten._linalg_check_errors, ...)): the check goes, the user's program stays.
    class Unproject(torch.nn.Module):
        def forward(self, intrinsics, pixels):
            return pixels @ torch.linalg.inv(intrinsics).transpose(-1, -2)

    intrinsics = torch.tensor([[500.0, 0, 32], [0, 500, 24], [0, 0, 1]]).repeat(2, 1, 1)
    pixels = torch.rand(2, 5, 3) * 64
    ep = torch.export.export(Unproject(), (intrinsics, pixels), dynamic_shapes=({0: Dim("batch")}, {0: Dim("batch")}))
    ep = ep.run_decompositions()
    effects = [n for n in ep.graph.nodes if n.target is torch.ops.higher_order.with_effects]
    assert effects
    program = dynexport.export(ep)
    assert [v.name for v in program.model.graph.inputs] == ["intrinsics", "pixels"]
    other = (torch.tensor([[300.0, 0, 16], [0, 320, 16], [0, 0, 1]]).repeat(3, 1, 1), torch.rand(3, 5, 3) * 32)
    assert_close(program(*other), Unproject()(*other))
    assert [n for n in ep.graph.nodes if n.target is torch.ops.higher_order.with_effects] == effects


def test_export_params_false_makes_weights_inputs():
    program = dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),), export_params=False)
    graph = program.model.graph
    assert len(graph.initializers) == 0
    # The user's inputs first, as both torch.onnx exporters list them: code that feeds
    # session.get_inputs()[0] must find the model's input there.
    assert [v.name for v in graph.inputs] == [
        "x", "encoder.0.weight", "encoder.0.bias", "head.weight", "head.bias",
    ]


@pytest.mark.parametrize("external_data", [False, True])
def test_save_keeps_initializers_as_inputs_as_torch_onnx_saves(tmp_path, external_data):
    model, x = TwoLayer().eval(), torch.randn(2, 4)
    program = dynexport.export(model, (x,))
    path = tmp_path / "model.onnx"
    program.save(path, keep_initializers_as_inputs=True, external_data=external_data)
    assert [v.name for v in program.model.graph.inputs] == ["x"]  # the program is unchanged
    saved = onnx.load(path)
    onnx.checker.check_model(saved, full_check=True)
    assert [v.name for v in saved.graph.input] == ["x", "encoder.0.weight", "encoder.0.bias", "head.weight", "head.bias"]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (result,) = session.run(None, {"x": x.numpy()})
    assert_close(torch.from_numpy(result), model(x))
    zeroed = {"head.weight": np.zeros((2, 8), np.float32), "head.bias": np.ones(2, np.float32)}
    (fed,) = session.run(None, {"x": x.numpy(), **zeroed})  # weights fed replace the stored ones
    assert_close(torch.from_numpy(fed), torch.ones(2, 2))


def test_keep_initializers_as_inputs():
    model = TwoLayer().eval()
    x = torch.randn(2, 4)
    program = dynexport.export(model, (x,), keep_initializers_as_inputs=True)
    graph = program.model.graph
    assert len(graph.initializers) == 4
    assert [v.name for v in graph.inputs] == ["x", "encoder.0.weight", "encoder.0.bias", "head.weight", "head.bias"]
    onnx.checker.check_model(program.model_proto, full_check=True)
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    first = session.get_inputs()[0].name
    (result,) = session.run(None, {first: x.numpy()})
    assert_close(torch.from_numpy(result), model(x))


class Structured(torch.nn.Module):
    def forward(self, x, pair, options=None):
        a, b = pair
        total = x + a * b
        return {"total": total, "parts": [a.sum(), b.mean()], "nothing": None}


def test_nested_inputs_and_outputs_are_flattened_and_named():
    x = torch.randn(2, 3)
    pair = (torch.randn(2, 3), torch.randn(2, 3))
    program = assert_exports_equivalent(Structured(), (x, pair))
    graph = program.model.graph
    assert [v.name for v in graph.inputs] == ["x", "pair_0", "pair_1"]
    assert [v.name for v in graph.outputs] == ["total", "parts.0", "parts.1"]
    result = program(x, pair)
    assert set(result) == {"total", "parts", "nothing"} and result["nothing"] is None


def test_output_that_is_an_input_gets_an_identity():
    program = assert_exports_equivalent(lambda a, b: (a, a, b * 2), (torch.randn(2), torch.randn(2)))
    assert [v.name for v in program.model.graph.outputs] == ["output_0", "output_1", "output_2"]


def test_nodes_carry_module_path_class_and_source_line():
    program = dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),))
    gemm_like = [n for n in program.model.graph if n.metadata_props.get("pkg.dynexport.module") == "head"]
    assert gemm_like
    props = gemm_like[0].metadata_props
    assert props["pkg.dynexport.module_class"].endswith("Linear")
    assert "test_api.py" in props["pkg.dynexport.source"]
    assert "self.head(" in props["pkg.dynexport.source"]


def test_verbose_prints_the_graph(capsys):
    dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),), verbose=True)
    assert "head.weight" in capsys.readouterr().out


def test_timings_cover_each_phase(tmp_path):
    program = dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),), tmp_path / "m.onnx")
    assert set(program.timings) == {"capture", "decompose", "translate", "optimize", "serialize"}


def test_program_call_checks_its_inputs():
    program = dynexport.export(TwoLayer().eval(), (torch.randn(2, 4),))
    with pytest.raises(TypeError, match="must be torch.float32"):
        program(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="leaves"):
        program(torch.randn(2, 4), torch.randn(2, 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.bool, torch.uint8, torch.int8])
def test_program_runs_every_dtype_through_onnxruntime(dtype):
    x = (torch.randn(2, 3) * 3).to(dtype)
    program = dynexport.export(lambda a: (a, a.to(torch.float32)), (x,))
    out, as_float = program(x)
    assert out.dtype == dtype and torch.equal(out, x)
    torch.testing.assert_close(as_float, x.float())


def test_none_argument_in_the_middle_is_skipped():
    x, pair = torch.randn(2, 3), (torch.randn(2, 3), torch.randn(2, 3))
    program = assert_exports_equivalent(Structured(), (x, pair, None))
    assert [v.name for v in program.model.graph.inputs] == ["x", "pair_0", "pair_1"]


def test_python_number_output_becomes_a_constant_output():
    program = assert_exports_equivalent(lambda a: (a * 2, a.shape[1], 0.5), (torch.randn(2, 3),))
    assert [v.name for v in program.model.graph.outputs] == ["output_0", "output_1", "output_2"]


class PrefillDecode(torch.nn.Module):
    """A cache-like model: the prefill call has a long sequence and an empty past, decode one token."""

    def forward(self, input_ids, past):
        embedded = input_ids.unsqueeze(-1).float()
        return torch.cat([past, embedded.expand(-1, -1, past.shape[-1])], dim=1)


def test_dynamic_shapes_auto_marks_dims_that_differ_between_examples():
    prefill = (torch.randint(0, 9, (2, 7)), torch.zeros(2, 0, 4))
    decode = (torch.randint(0, 9, (3, 1)), torch.randn(3, 7, 4))
    program = dynexport.export(PrefillDecode(), dynamic_shapes="auto", example_inputs=[prefill, decode])
    inputs = {v.name: [str(d) for d in v.shape] for v in program.model.graph.inputs}
    assert inputs == {"input_ids": ["batch", "sequence"], "past": ["batch", "past_dim_1", "4"]}
    for call in (prefill, decode):
        assert_close(program(*call), PrefillDecode()(*call))


class ScaledRows(torch.nn.Module):
    def forward(self, x, weight, rows: int):
        return (x @ weight)[:, :rows] * rows


def test_dynamic_shapes_as_a_shapes_collection_keyed_by_the_input_tensors():
    x, weight = torch.randn(2, 3, 4), torch.randn(4, 5)
    shapes = torch.export.ShapesCollection()
    shapes[x] = {0: Dim("batch"), 1: Dim("seq", min=2)}
    program = assert_exports_equivalent(
        ScaledRows(), (x, weight, 2), dynamic_shapes=shapes, resized=[(torch.randn(5, 7, 4), weight, 2)]
    )
    inputs = {v.name: [str(d) for d in v.shape] for v in program.model.graph.inputs}
    assert inputs == {"x": ["batch", "seq", "4"], "weight": ["4", "5"]}
    with pytest.raises(Exception, match="seq"):
        program(torch.randn(2, 1, 4), weight, 2)  # below the declared minimum
    foreign = torch.export.ShapesCollection()
    foreign[torch.randn(2, 3, 4)] = {0: Dim("batch")}  # a copy of x, not x
    with pytest.raises(ValueError, match="not found in args"):
        dynexport.export(ScaledRows(), (x, weight, 2), dynamic_shapes=foreign)


def test_dynamic_shapes_as_additional_inputs_marks_what_differs_ints_included(tmp_path):
    x, weight = torch.randn(2, 3, 4), torch.randn(4, 5)
    additional = torch.export.AdditionalInputs()
    additional.add((torch.randn(6, 3, 4), weight, 3))
    program = dynexport.export(ScaledRows(), (x, weight, 2), dynamic_shapes=additional)
    inputs = {v.name: [str(d) for d in v.shape] for v in program.model.graph.inputs}
    assert inputs == {"x": ["batch", "3", "4"], "weight": ["4", "5"], "rows": []}
    for call in ((x, weight, 2), (torch.randn(6, 3, 4), weight, 3), (torch.randn(1, 3, 4), weight, 1)):
        assert_close(program(*call), ScaledRows()(*call))
    # the slice bounds rows by x's 3 rows: a call past them is refused, and no file is written
    additional.add((torch.randn(6, 3, 4), weight, 4))
    path = tmp_path / "rows.onnx"
    with pytest.raises(dynexport.errors.ExampleCallRefusedError, match=r"Additional input 1 .*'rows' is 4, outside"):
        dynexport.export(ScaledRows(), (x, weight, 2), str(path), dynamic_shapes=additional)
    assert not path.exists()


def test_additional_inputs_the_model_cannot_run_are_refused():
    class FixedBatch(torch.nn.Module):
        def forward(self, x):
            return x.reshape(2, -1).sum(0)

    additional = torch.export.AdditionalInputs()
    additional.add((torch.randn(4, 3),))
    with pytest.raises(dynexport.errors.DimSpecializedError, match=r"batch \(x.shape\[0\]\) = 2"):
        dynexport.export(FixedBatch(), (torch.randn(2, 3),), dynamic_shapes=additional)
    with pytest.raises(ValueError, match="holds no call"):
        dynexport.export(FixedBatch(), (torch.randn(2, 3),), dynamic_shapes=torch.export.AdditionalInputs())
    with pytest.raises(ValueError, match="not both"):
        dynexport.export(
            FixedBatch(), (torch.randn(2, 3),), dynamic_shapes=additional, example_inputs=[(torch.randn(4, 3),)]
        )


def test_example_calls_may_differ_in_ints_only_among_python_values():
    class Scaled(torch.nn.Module):
        def forward(self, x, scale: float):
            return x * scale

    model = CountingModule()
    with pytest.raises(ValueError, match=r"'scale' is 3.0 in the export call and 5.0"):
        dynexport.export(Scaled(), (torch.randn(2), 3.0), dynamic_shapes="auto", example_inputs=[(torch.randn(4), 5.0)])
    program = dynexport.export(Scaled(), (torch.randn(2), 3.0), dynamic_shapes="auto", example_inputs=[(torch.randn(4), 3.0)])
    assert [v.name for v in program.model.graph.inputs] == ["x"]
    assert model.calls == 0


def test_dynamic_shapes_auto_arguments_are_checked_before_capture():
    model = CountingModule()
    with pytest.raises(ValueError, match="example_inputs"):
        dynexport.export(model, (torch.randn(2),), dynamic_shapes="auto")
    with pytest.raises(ValueError, match="only used with"):
        dynexport.export(model, (torch.randn(2),), example_inputs=[(torch.randn(3),)])
    with pytest.raises(ValueError, match="ranks must agree"):
        dynexport.export(model, (torch.randn(2),), dynamic_shapes="auto", example_inputs=[(torch.randn(3, 1),)])
    assert model.calls == 0
