"""Verification: outputs compared with dtype-aware tolerances, resized inputs, first divergence."""

from __future__ import annotations

import pytest
import torch

import dynexport
from dynexport.verification import VerificationError, resized_inputs, tolerance


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 32)
        self.down = torch.nn.Linear(32, 8)

    def forward(self, x):
        hidden = torch.nn.functional.gelu(self.up(x))  # the line a divergence must point at
        return self.down(hidden) + x, hidden.sum(-1)


def relu_instead_of_gelu(ctx, x, approximate="none"):
    return ctx.op.Relu(x)


WRONG = {torch.ops.aten.gelu.default: relu_instead_of_gelu}


@pytest.fixture
def block():
    torch.manual_seed(0)
    return Block().eval(), torch.randn(4, 8)


def test_verify_passes_and_checks_resized_inputs(block):
    model, x = block
    program = dynexport.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    report = program.verify(resized=True)
    assert report.passed and program.verification is report
    assert [(o.inputs, o.name) for o in report.outputs] == [
        ("example", "output_0"), ("example", "output_1"), ("resized", "output_0"), ("resized", "output_1"),
    ]
    assert report.outputs[2].shape == (6, 8)  # batch 4 grown by half
    assert all(o.max_abs <= 1e-4 and (o.rtol, o.atol) == tolerance(torch.float32) for o in report.outputs)
    assert "| example | output_0 | float32 | [4, 8] |" in report.table()


def test_resized_inputs_respect_declared_ranges():
    program = dynexport.export(lambda t: t * 2, (torch.randn(4, 5),),
                               dynamic_shapes=({0: torch.export.Dim("n", max=5)},))
    (grown,), _ = resized_inputs(program, (torch.randn(4, 5),))
    assert grown.shape == (3, 5)  # grown by half (6) would exceed max=5: shrunk by one instead


def test_wrong_translation_fails_and_names_the_node(block):
    model, x = block
    report = dynexport.verify(model, (x,), custom_translation_table=WRONG, compare_intermediates=True)
    assert not report.passed
    assert [o.passed for o in report.outputs] == [False, False]
    divergence = report.divergence
    assert divergence.node == "gelu" and divergence.target == "aten::gelu"
    assert "test_verification.py" in divergence.source and "the line a divergence" in divergence.source
    assert report.intermediates_compared == 2  # up (linear), then gelu: the first that diverges
    assert "first divergence at FX node gelu" in str(report)
    with pytest.raises(VerificationError, match="gelu"):
        report.raise_on_failure()


def test_intermediates_all_match_on_a_correct_export(block):
    model, x = block
    report = dynexport.export(model, (x,)).verify(x, compare_intermediates=True)
    assert report.passed and report.divergence is None and report.intermediates_compared >= 4


def test_export_verify_true_raises_after_writing(block, tmp_path):
    model, x = block
    with pytest.raises(VerificationError) as caught:
        dynexport.export(model, (x,), tmp_path / "m.onnx", custom_translation_table=WRONG, verify=True)
    assert (tmp_path / "m.onnx").exists()
    assert caught.value.report.program is not None
    assert dynexport.export(model, (x,), verify=True).verification.passed


def test_integer_outputs_are_exact():
    program = dynexport.export(lambda t: t.argmax(-1), (torch.randn(3, 5),))
    report = program.verify()
    assert report.passed and report.outputs[0].dtype == "int64" and report.outputs[0].rtol == 0.0
