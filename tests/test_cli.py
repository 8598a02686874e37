"""The dynexport command line: one real subprocess run, the rest in-process through main()."""

from __future__ import annotations

import subprocess
import sys

import torch

import dynexport
from dynexport import cli


def test_export_verify_report_then_inspect_in_a_subprocess(tmp_path):
    output = tmp_path / "mlp.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "dynexport", "export", "dynexport.examples:mlp", "-o", str(output),
         "--verify", "--report", "--dynamic", "input:0=rows"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "capture" in run.stderr and " s\n" in run.stderr  # a line per phase with its time
    assert "inputs:  input: float[rows, 16]" in run.stdout
    assert "| resized #1 |" in run.stdout and "FAIL" not in run.stdout
    assert (tmp_path / "mlp.report.md").exists()
    inspected = subprocess.run([sys.executable, "-m", "dynexport", "inspect", str(output)],
                               capture_output=True, text=True, timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    assert "input: float[rows, 16]" in inspected.stdout and "opsets: ai.onnx 20" in inspected.stdout
    assert "initializers: 6 tensors" in inspected.stdout and "Gemm" in inspected.stdout


@torch.library.custom_op("dynexport_cli_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


def failing_factory():
    class Mystery(torch.nn.Module):
        def forward(self, x):
            return mystery(x)

    return Mystery(), (torch.randn(3, 3),)


def test_errors_are_one_paragraph_without_traceback(tmp_path, capsys):
    assert cli.main(["export", "tests.test_cli:failing_factory", "-o", str(tmp_path / "m.onnx")]) == 1
    err = capsys.readouterr().err
    assert "dynexport: error: UnsupportedOperatorError" in err and "dynexport_cli_test.mystery" in err
    assert "Traceback" not in err and "--debug" in err
    assert not (tmp_path / "m.onnx").exists()
    assert cli.main(["--debug", "export", "tests.test_cli:failing_factory", "-o", str(tmp_path / "m.onnx")]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_bad_command_lines(tmp_path, capsys):
    assert cli.main(["export", "no_colon", "-o", str(tmp_path / "m.onnx")]) == 1
    assert "MODULE:FACTORY" in capsys.readouterr().err
    assert cli.main(["export", "dynexport.examples:mlp", "-o", str(tmp_path / "m.onnx"), "--dynamic", "input:x"]) == 1
    assert "not an integer" in capsys.readouterr().err
    assert cli.main(["inspect", str(tmp_path / "missing.onnx")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_verify_with_resized_inputs_runs_once_at_both_sizes(tmp_path, monkeypatch, capsys):
    runs = []
    verify = dynexport.ONNXProgram.verify

    def counted(self, *args, **kwargs):
        runs.append(kwargs.get("resized"))
        return verify(self, *args, **kwargs)

    monkeypatch.setattr(dynexport.ONNXProgram, "verify", counted)
    assert cli.main(["export", "dynexport.examples:mlp", "-o", str(tmp_path / "m.onnx"), "--verify"]) == 0
    assert len(runs) == 1 and runs[0] is not None
    assert "resized" in capsys.readouterr().out


def test_inspect_prints_the_inputs_the_model_was_exported_for(tmp_path, capsys):
    def scaled(x, n):
        return x * n

    program = dynexport.export(scaled, (torch.randn(4, 3), 2), dynamic_shapes=({0: torch.export.Dim("b", max=8)}, None))
    program.save(tmp_path / "m.onnx")
    assert cli.main(["inspect", str(tmp_path / "m.onnx")]) == 0
    out = capsys.readouterr().out
    assert "valid inputs (ONNXProgram refuses others):\n  x: [b, 3]\n  b in [0, 8]\n  n = 2 (built into the graph)" in out


def test_inspect_refuses_an_empty_or_not_onnx_file(tmp_path, capsys):
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "text.onnx").write_text("hello, not a model\n")
    assert cli.main(["inspect", str(tmp_path / "empty.onnx")]) == 1
    assert "is not an ONNX model: it is empty" in capsys.readouterr().err
    assert cli.main(["inspect", str(tmp_path / "text.onnx")]) == 1
    assert "is not an ONNX model" in capsys.readouterr().err
