"""ONNXProgram: saving (external data, atomic, deterministic), weights filled later, text form."""

from __future__ import annotations

import os

import onnx
import pytest
import torch

import dynexport
import dynexport.files as files_module
from dynexport.examples import TinyGPT
from tests.equivalence import assert_close


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(8, 64)
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))


@pytest.fixture
def small():
    torch.manual_seed(0)
    return Small().eval(), torch.randn(3, 8)  # weights of 2 KB and 1 KB: external when asked


@pytest.fixture
def tiny_threshold(monkeypatch):
    monkeypatch.setattr(files_module, "EXTERNAL_DATA_THRESHOLD", 1)


def test_external_data_above_threshold_is_relative_and_runs(small, tiny_threshold, tmp_path):
    model, x = small
    path = tmp_path / "m.onnx"
    dynexport.export(model, (x,), path)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    proto = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"m.onnx.data"}
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": x.numpy()})
    assert_close(torch.from_numpy(out), model(x))


def test_below_threshold_single_file_and_explicit_name(small, tmp_path):
    model, x = small
    program = dynexport.export(model, (x,))
    program.save(tmp_path / "a.onnx")
    assert os.listdir(tmp_path) == ["a.onnx"]
    program.save(tmp_path / "b.onnx", external_data="weights.bin")
    assert (tmp_path / "weights.bin").exists()
    onnx.checker.check_model(str(tmp_path / "b.onnx"), full_check=True)
    with pytest.raises(ValueError, match="relative"):
        program.save(tmp_path / "c.onnx", external_data="/abs/w.bin")


def test_failed_external_write_leaves_no_file(small, tiny_threshold, tmp_path, monkeypatch):
    model, x = small
    program = dynexport.export(model, (x,))

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        program.save(tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_weights_are_streamed_without_a_copy(small, tiny_threshold, tmp_path, monkeypatch):
    """Torch tensors are written from their own memory: tobytes (a copy) is never called."""
    monkeypatch.setattr(files_module, "EXTERNAL_DATA_MIN_TENSOR_BYTES", 0)
    model, x = small
    program = dynexport.export(model, (x,))
    from onnx_ir.tensor_adapters import TorchTensor

    def no_copy(self):
        raise AssertionError("tobytes called")

    monkeypatch.setattr(TorchTensor, "tobytes", no_copy)
    seen = []
    program.save(tmp_path / "m.onnx", progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] == sum(p.numel() * 4 for p in model.parameters())


def test_export_is_deterministic(tiny_threshold, tmp_path):
    files = []
    for run in range(2):
        torch.manual_seed(0)
        model = TinyGPT().eval()
        directory = tmp_path / str(run)
        directory.mkdir()
        dynexport.export(model, (torch.randint(0, 128, (2, 8)),), directory / "gpt.onnx",
                         dynamic_shapes=({0: torch.export.Dim("batch")},))
        files.append({name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))})
    assert list(files[0]) == ["gpt.onnx", "gpt.onnx.data"]
    assert files[0] == files[1]


def test_meta_model_exports_then_takes_weights(tmp_path):
    torch.manual_seed(0)
    real = TinyGPT().eval()
    with torch.device("meta"):
        meta = TinyGPT().eval()
    ids = torch.randint(0, 128, (2, 8))
    program = dynexport.export(meta, (ids.to("meta"),))
    assert {"ln_f.weight", "positions.weight"} <= set(program.missing_weights())
    with pytest.raises(ValueError, match="apply_weights"):
        program.save(tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="shape"):
        program.apply_weights({"ln_f.weight": torch.zeros(3)})
    applied = program.apply_weights(real.state_dict())
    assert "ln_f.weight" in applied and program.missing_weights() == []
    assert_close(program(ids), real(ids))


def test_fake_model_takes_weights_from_safetensors(tmp_path, tiny_threshold):
    from safetensors.torch import save_file
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    real = TinyGPT().eval()
    save_file({k: v.clone() for k, v in real.state_dict().items()}, str(tmp_path / "w.safetensors"))
    with FakeTensorMode():
        fake = TinyGPT().eval()
        fake_ids = torch.randint(0, 128, (2, 8))
    program = dynexport.export(fake, (fake_ids,))
    program.apply_weights(str(tmp_path / "w.safetensors"))
    program.save(tmp_path / "m.onnx")  # lazily read tensor by tensor into the data file
    ids = torch.randint(0, 128, (2, 8))
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"input_ids": ids.numpy()})
    assert_close(torch.from_numpy(out), real(ids))


def test_include_initializers_false_and_initializers(small, tmp_path):
    model, x = small
    program = dynexport.export(model, (x,))
    assert torch.equal(program.initializers["head.weight"], model.head.weight)
    program.save(tmp_path / "m.onnx", include_initializers=False)
    assert len(onnx.load(str(tmp_path / "m.onnx")).graph.initializer) == 0
    assert len(program.model_proto.graph.initializer) == 4
    assert program.optimize() is program
    assert_close(program(x), model(x))


def test_optimize_again_takes_exports_target_and_clamp_keywords():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Hardtanh()).eval()
    x = torch.randn(2, 4) * 3

    def ops(program):
        return {node.op_type for node in program.model_proto.graph.node}

    strict = dynexport.export(model, (x,), optimize=False).optimize(strict_clamps=True)
    assert {"Max", "Min"} <= ops(strict) and "Clip" not in ops(strict)
    fast = dynexport.export(model, (x,), optimize=False).optimize()
    assert "Clip" in ops(fast) and not {"Max", "Min"} & ops(fast)
    for program in (strict, fast):
        assert_close(program(x), model(x))
    with pytest.raises(ValueError, match="target='tensorrt' is not supported"):
        fast.optimize(target="tensorrt")


def test_optimize_again_takes_exports_norm_keyword():
    norm = torch.nn.InstanceNorm2d(3, affine=True).eval()
    dims = ({2: torch.export.Dim("h"), 3: torch.export.Dim("w")},)
    x = torch.randn(1, 3, 5, 6)

    def ops(program):
        return [node.op_type for node in program.model_proto.graph.node]

    exact = dynexport.export(norm, (x,), dynamic_shapes=dims, optimize=False).optimize(exact_norms=True)
    fast = dynexport.export(norm, (x,), dynamic_shapes=dims, optimize=False).optimize()
    assert ops(exact) == ["Slice", "Sub", "InstanceNormalization"] and ops(fast) == ["InstanceNormalization"]
    for program in (exact, fast):
        assert_close(program(x), norm(x))


def test_text_form_lists_inputs_then_nodes_with_modules(small, capsys):
    model, x = small
    text = dynexport.export_to_pretty_string(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    lines = text.splitlines()
    assert lines[1] == "  %x : float[batch, 8]"
    gemm = next(line for line in lines if "encoder" in line and "= " in line)
    assert "scope: encoder (Linear)" in gemm and ": float[batch, 64]" in gemm
    assert lines[-2].startswith("  return %")
    dynexport.export(model, (x,), verbose=True)
    assert "scope: head (Linear)" in capsys.readouterr().out
    assert "ONNXProgram(opset=20" in repr(dynexport.export(model, (x,)))


# -- torch.onnx.ONNXProgram's methods ---------------------------------------------------------


def test_a_bfloat16_model_onnxruntime_has_no_kernels_for_says_where_it_runs():
    # onnxruntime's CPU provider has almost no bfloat16 kernels: the session refuses the graph
    # (NOT_IMPLEMENTED), and the error says the model is valid and where to run it; onnx's
    # reference evaluator runs it and gives bfloat16 tensors back.
    x = torch.randn(2, 3, dtype=torch.bfloat16)
    program = dynexport.export(lambda a: a * a + 1, (x,))
    try:
        result = program(x)
    except Exception as error:
        assert "NOT_IMPLEMENTED" in str(error)
        assert any("program.call_reference" in note for note in error.__notes__)
    else:  # an onnxruntime with bfloat16 kernels
        torch.testing.assert_close(result, x * x + 1)
    reference = program.call_reference(x)
    assert reference.dtype == torch.bfloat16
    torch.testing.assert_close(reference, x * x + 1)


def test_call_reference_computes_what_onnxruntime_and_eager_compute(small):
    model, x = small
    program = dynexport.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    other = torch.randn(5, 8)
    assert_close(program.call_reference(other), model(other))
    assert_close(program.call_reference(other), program(other))


def test_compute_values_reads_node_outputs_inputs_and_initializers(small):
    model, x = small
    program = dynexport.export(model, (x,))
    hidden = next(node.outputs[0].name for node in program.model.graph if node.op_type == "Relu")
    outputs_before = [value.name for value in program.model.graph.outputs]
    relu, given, weight = program.compute_values([hidden, "x", "encoder.weight"], (x,))
    assert_close(relu, torch.relu(model.encoder(x)))
    assert_close(given, x)
    assert_close(weight, model.encoder.weight)
    assert [value.name for value in program.model.graph.outputs] == outputs_before
    with pytest.raises(ValueError, match=r"\['encoder'\] name no value of the graph"):
        program.compute_values(["encoder"], (x,))


def test_an_inference_session_of_ones_own_is_used_until_released(small):
    import onnxruntime

    model, x = small
    program = dynexport.export(model, (x,))
    made = []

    def initializer(serialized):
        made.append(onnxruntime.InferenceSession(serialized, providers=["CPUExecutionProvider"]))
        return made[-1]

    program.initialize_inference_session(initializer)
    assert_close(program(x), model(x))
    assert program._session is made[0]
    program.release()
    assert program._session is None
    assert_close(program(x), model(x))  # a fresh default session
    assert len(made) == 1


def test_apply_weights_takes_torch_onnx_keyword(small):
    model, x = small
    program = dynexport.export(model, (x,))
    zeroed = {name: torch.zeros_like(tensor) for name, tensor in model.state_dict().items()}
    program.apply_weights(state_dict=zeroed)
    assert_close(program(x), torch.zeros(3, 4))


class _AppendsToPast(torch.nn.Module):
    def forward(self, x, past):
        return torch.cat([past, x], 1).relu()


def _appends_to_past() -> dynexport.ONNXProgram:
    Dim = torch.export.Dim
    batch = Dim("batch")
    return dynexport.export(
        _AppendsToPast(), (torch.randn(2, 3, 4), torch.randn(2, 5, 4)),
        dynamic_shapes=({0: batch, 1: Dim("seq")}, {0: batch, 1: Dim("past")}),
    )


def test_rename_axes_takes_torch_onnx_keys_and_renames_expressions_checks_and_metadata():
    program = _appends_to_past()
    batch = program.model.graph.inputs[0].shape[0]
    program.rename_axes({batch: "B", "seq": "new_tokens"})
    assert [str(v.shape) for v in program.model.graph.inputs] == ["[B,new_tokens,4]", "[B,past,4]"]
    assert str(program.model.graph.outputs[0].shape) == "[B,past + new_tokens,4]"
    onnx.checker.check_model(program.model_proto, full_check=True)
    assert '"x": ["B", "new_tokens", 4]' in program.model.metadata_props["pkg.dynexport.input_dims"]
    x, past = torch.randn(3, 2, 4), torch.randn(3, 7, 4)
    assert_close(program(x, past), torch.cat([past, x], 1).relu())
    with pytest.raises(ValueError, match=r"input 'past' dim 0 is 4 but input 'x' dim 0 is 3: .* \(both B\)"):
        program(x, torch.randn(4, 7, 4))


def test_rename_axes_refuses_a_name_another_dim_has_and_bad_keys():
    program = _appends_to_past()
    with pytest.raises(ValueError, match=r"'past', the new name of 'batch', already names another dim"):
        program.rename_axes({"batch": "past"})
    program.rename_axes({"batch": "past", "past": "history"})  # a swap of names is no merge
    assert [str(v.shape) for v in program.model.graph.inputs] == ["[past,seq,4]", "[past,history,4]"]
    with pytest.raises(TypeError, match="not a dim name"):
        program.rename_axes({0: "batch"})
    with pytest.raises(TypeError, match="non-empty str"):
        program.rename_axes({"seq": ""})


def test_rename_axes_renames_the_sizes_output_dims_stand_for():
    program = dynexport.export(
        lambda x: x.flatten(), (torch.randn(2, 3),), input_names=["x"], output_names=["flat"],
        dynamic_axes={"x": {0: "rows"}, "flat": {0: "values"}},
    )
    assert "rows" in program.model.metadata_props["pkg.dynexport.output_dims"]
    program.rename_axes({"rows": "lines"})
    sizes = program.model.metadata_props["pkg.dynexport.output_dims"]
    assert "lines" in sizes and "rows" not in sizes
