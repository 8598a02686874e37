"""export(report=...): a markdown report on failure and on success."""

from __future__ import annotations

import pytest
import torch

import dynexport
from dynexport.errors import UnsupportedOperatorError


@torch.library.custom_op("dynexport_report_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


class UsesMystery(torch.nn.Module):
    def forward(self, x):
        return torch.linalg.det(mystery(x)) + x.sum()  # mystery: no rule, no decomposition


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.silu(self.fc(x)).logsumexp(-1)


def test_report_on_failure_names_the_unsupported_operator(tmp_path):
    path = tmp_path / "failed.md"
    with pytest.raises(UnsupportedOperatorError) as caught:
        dynexport.export(UsesMystery(), (torch.randn(3, 3),), report=path)
    assert str(path) in "\n".join(caught.value.__notes__)
    text = path.read_text()
    assert "status: FAILED (UnsupportedOperatorError)" in text
    assert "### Unsupported operators" in text
    row = next(line for line in text.splitlines() if line.startswith("| dynexport_report_test.mystery"))
    assert "test_report.py" in row and "no rule, no decomposition" in row
    assert "| dynexport_report_test.mystery.default | 1 | **unsupported** |" in text
    assert "| aten.sum.default | 1 | rule |" in text
    assert "Strategy: torch.export(strict=False)" in text and "| capture |" in text


def test_report_on_success_next_to_the_model(tmp_path):
    program = dynexport.export(Small().eval(), (torch.randn(2, 4),), tmp_path / "small.onnx", report=True, verify=True)
    assert program.report_path == str(tmp_path / "small.report.md")
    text = (tmp_path / "small.report.md").read_text()
    assert "status: success" in text
    assert "| aten.linear.default | 1 | rule |" in text
    assert "| ONNX op | count |" in text and "| Gemm |" in text or "| MatMul |" in text
    assert "| example | output | float32 | [2] |" in text and "**FAIL**" not in text
    for phase in ("capture", "translate", "optimize", "verify", "serialize"):
        assert f"| {phase} |" in text


def test_report_argument_is_checked_before_work(tmp_path):
    with pytest.raises(FileNotFoundError, match="report"):
        dynexport.export(Small(), (torch.randn(2, 4),), report=tmp_path / "missing" / "r.md")
    with pytest.raises(TypeError, match="report"):
        dynexport.export(Small(), (torch.randn(2, 4),), report=3)


def test_report_marks_operators_kept_as_custom_domain_nodes(tmp_path):
    path = tmp_path / "fallback.md"
    with pytest.warns(UserWarning, match="custom-domain"):
        dynexport.export(UsesMystery(), (torch.randn(3, 3),), report=path, fallback="custom_domain")
    text = path.read_text()
    assert "status: success" in text
    assert "1 kept as custom-domain nodes" in text
    assert "| dynexport_report_test.mystery.default | 1 | custom domain |" in text


def test_torch_onnx_debugging_options_write_their_artifacts(tmp_path):
    # torch.onnx.export(..., report=True, profile=True, dump_exported_program=True, artifacts_dir=...)
    artifacts = tmp_path / "debug"
    artifacts.mkdir()
    model, x = Small(), torch.randn(2, 4)
    program = dynexport.export(
        model, (x,), tmp_path / "small.onnx", report=True, profile=True, dump_exported_program=True,
        artifacts_dir=artifacts,
    )
    assert sorted(p.name for p in artifacts.iterdir()) == ["small.profile.txt", "small.pt2", "small.report.md"]
    assert program.report_path == str(artifacts / "small.report.md")
    assert "dynexport/api.py" in (artifacts / "small.profile.txt").read_text()
    reloaded = torch.export.load(artifacts / "small.pt2")
    torch.testing.assert_close(reloaded.module()(x), model(x))


def test_a_profile_is_written_when_the_export_fails(tmp_path):
    with pytest.raises(UnsupportedOperatorError):
        dynexport.export(UsesMystery(), (torch.randn(3, 3),), tmp_path / "m.onnx", profile=True)
    assert (tmp_path / "m.profile.txt").exists()
    assert not (tmp_path / "m.onnx").exists()


def test_artifacts_dir_must_exist_before_any_work(tmp_path):
    with pytest.raises(FileNotFoundError, match="artifacts_dir .* is not an existing folder"):
        dynexport.export(UsesMystery(), (torch.randn(3, 3),), artifacts_dir=tmp_path / "missing", report=True)


@pytest.mark.parametrize(
    ("operator_export_type", "exported"),
    [("ONNX_FALLTHROUGH", True), ("ONNX_ATEN_FALLBACK", True), ("ONNX", False), ("ONNX_ATEN", False)],
)
def test_legacy_operator_export_types(operator_export_type, exported):
    # The fallthrough types export an operator with no translation as a custom-domain node.
    kind = getattr(torch.onnx.OperatorExportTypes, operator_export_type)
    call = lambda: dynexport.export(UsesMystery(), (torch.randn(3, 3),), operator_export_type=kind)  # noqa: E731
    if exported:
        with pytest.warns(UserWarning, match="custom-domain nodes"):
            program = call()
        assert "pkg.torch.dynexport_report_test" in {node.domain for node in program.model.graph}
    else:
        with pytest.raises(UnsupportedOperatorError if operator_export_type == "ONNX" else ValueError):
            call()
