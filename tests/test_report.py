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
