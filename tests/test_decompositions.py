"""Only nodes without a rule are decomposed, at translation time; preserved ops have rules."""

from __future__ import annotations

import pytest
import torch

import dynexport
from dynexport.decompositions import decomposition_for
from dynexport.registry import default_table
from tests.equivalence import assert_exports_equivalent, op_histogram
from tests.preserved_ops import PRESERVED_OPS

aten = torch.ops.aten


@pytest.mark.parametrize("op", sorted(PRESERVED_OPS, key=str), ids=str)
def test_preserved_op_has_a_rule(op):
    import dynexport.ops  # noqa: F401

    assert op in default_table, f"{op} is in PRESERVED_OPS but the table has no rule for it"


def test_node_without_rule_is_decomposed_in_place():
    assert aten.addcmul.default not in default_table
    assert decomposition_for(aten.addcmul.default) is not None
    program = assert_exports_equivalent(
        lambda x, y, z: torch.addcmul(x, y, z, value=0.5), (torch.randn(3), torch.randn(3), torch.randn(3))
    )
    assert op_histogram(program)["Mul"] >= 1


def test_decomposed_nodes_keep_the_model_source_line():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.addcmul(x, x, x, value=0.5)

    program = dynexport.export(Model(), (torch.randn(3),))
    sources = {node.metadata_props.get("pkg.dynexport.source") for node in program.model.graph}
    assert any(s and "torch.addcmul(x, x, x" in s for s in sources)


def test_export_does_not_retrace_the_program(monkeypatch):
    calls = []
    original = torch.export.ExportedProgram.run_decompositions

    def spy(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", spy)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True), torch.nn.LayerNorm(4)).eval()
    assert_exports_equivalent(model, (torch.randn(2, 4),))
    assert calls == []


class NoGradRegion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([2.0, 3.0]))

    def forward(self, x):
        with torch.no_grad():
            factor = torch.cos(x * self.scale) + 1
        with torch.autocast("cpu", enabled=False):
            shifted = x.float() + 1
        return shifted * factor


def test_no_grad_and_disabled_autocast_regions_are_inlined():
    program = assert_exports_equivalent(
        NoGradRegion(), (torch.randn(3, 2),), dynamic_shapes=({0: torch.export.Dim("batch")},),
        resized=[(torch.randn(5, 2),)],
    )
    assert "Cos" in op_histogram(program)
