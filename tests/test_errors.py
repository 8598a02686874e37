"""Typed errors: every unsupported operator listed at once, capture failures, broken rules."""

from __future__ import annotations

import sys

import pytest
import torch

import dynexport
from dynexport.errors import (
    CaptureError,
    ExportError,
    TranslationError,
    UnsupportedOperatorError,
)


@torch.library.custom_op("dynexport_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("dynexport_test::enigma", mutates_args=())
def enigma(x: torch.Tensor, k: int) -> torch.Tensor:
    return x * k


@enigma.register_fake
def _(x, k):
    return torch.empty_like(x)


class UsesUnknownOps(torch.nn.Module):
    def forward(self, x):
        a = torch.ops.dynexport_test.mystery(x)
        b = torch.ops.dynexport_test.mystery(a + 1)
        return torch.ops.dynexport_test.enigma(b, 3)


def test_every_unsupported_operator_is_listed_with_counts_and_source(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(UnsupportedOperatorError) as caught:
        dynexport.export(UsesUnknownOps(), (torch.randn(2),), path)
    error = caught.value
    assert error.targets == ["dynexport_test.mystery.default", "dynexport_test.enigma.default"]
    assert [use.count for use in error.uses] == [2, 1]
    assert "test_errors.py" in error.uses[0].source
    assert "mystery(x)" in error.uses[0].source
    assert "custom_translation_table" in str(error)
    assert isinstance(error, ExportError)
    assert not path.exists()


def test_custom_translation_table_supplies_the_missing_rules():
    table = {
        torch.ops.dynexport_test.mystery.default: lambda ctx, x: ctx.op.Identity(x),
        torch.ops.dynexport_test.enigma.default: lambda ctx, x, k: ctx.op.Mul(x, ctx.constant(float(k), x.dtype)),
    }
    x = torch.randn(3)
    program = dynexport.export(UsesUnknownOps(), (x,), custom_translation_table=table)
    torch.testing.assert_close(program(x), UsesUnknownOps()(x))


def test_custom_rule_overrides_ours():
    def relu_as_abs(ctx, x):
        return ctx.op.Abs(x)

    x = torch.tensor([-1.0, 2.0])
    program = dynexport.export(torch.nn.ReLU(), (x,), custom_translation_table={torch.ops.aten.relu.default: relu_as_abs})
    torch.testing.assert_close(program(x), x.abs())


def test_a_rule_that_breaks_raises_translation_error_with_op_and_source():
    def broken(ctx, x):
        raise KeyError("boom")

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    with pytest.raises(TranslationError) as caught:
        dynexport.export(Model(), (torch.randn(2),), custom_translation_table={torch.ops.aten.relu.default: broken})
    error = caught.value
    assert error.target == "aten.relu.default"
    assert "torch.relu(x)" in error.source
    assert "boom" in str(error) and "Hint:" in str(error)


class NotCapturable(torch.nn.Module):
    def forward(self, x):
        return x.view(3, 5)


def test_capture_error_carries_each_strategy_reason():
    with pytest.raises(CaptureError) as caught:
        dynexport.export(NotCapturable(), (torch.randn(2),))
    error = caught.value
    assert list(error.reasons) == [
        "torch.export(strict=False)",
        "torch.export(strict=True)",
        "torch.export.draft_export",
    ]
    assert "Hint:" in str(error)
    assert "shape '[3, 5]' is invalid" in str(error)


def test_a_refused_capture_prints_no_graph_and_keeps_the_models_own_output(capfd):
    """torch.export prints the graph traced up to a data-dependent failure to stderr, for each
    strategy tried (hundreds of lines for a transformer); dynexport's error names the line."""

    class BranchesOnData(torch.nn.Module):
        def forward(self, x):
            print("forward ran", file=sys.stderr)
            y = (x * 2).sum()
            return x if y.item() > 0 else -x

    with pytest.raises(CaptureError, match=r"y.item\(\) > 0"):
        dynexport.export(BranchesOnData(), (torch.randn(3),), dynamo=True)
    stderr = capfd.readouterr().err
    assert "forward ran" in stderr and "def forward" not in stderr and "torch.ops.aten" not in stderr


def test_dynamic_shapes_user_error_stops_at_the_first_strategy():
    class Fixed(torch.nn.Module):
        def forward(self, x):
            return x.view(2, 3)

    with pytest.raises(CaptureError) as caught:
        dynexport.export(Fixed(), (torch.randn(2, 3),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    assert list(caught.value.reasons) == ["torch.export(strict=False)"]
    assert "batch" in str(caught.value)


def test_an_fx_pass_that_fixes_a_dynamic_size_is_refused(monkeypatch):
    """A pass between capture and translation that reads a dynamic size as an int would make the
    whole program static; the export stops naming the dim, rather than writing that graph."""
    import importlib

    api = importlib.import_module("dynexport.api")
    simplify = api.simplify_program

    def reads_a_size(program, **options):
        int(program.graph.find_nodes(op="placeholder")[-1].meta["val"].shape[0])
        return simplify(program, **options)

    monkeypatch.setattr(api, "simplify_program", reads_a_size)
    with pytest.raises(TranslationError, match=r"fixed dynamic sizes to the example's \(x.shape\[0\] = 3\)"):
        dynexport.export(lambda x: x * 2, (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("b")},))
