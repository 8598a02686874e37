"""passes/fx/simplify.py: no-op views read through, parameter-only subgraphs
evaluated with torch; the user's ExportedProgram is never changed."""

import torch

import dynexport
from dynexport.passes.fx.simplify import simplify_program
from tests.equivalence import assert_exports_equivalent, op_histogram

aten = torch.ops.aten


class _ScaledTransposed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        weight = (self.weight * 2).t()
        return (x.clone() @ weight).reshape(x.shape[0], 3)


def _program():
    return torch.export.export(_ScaledTransposed().eval(), (torch.randn(5, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))


def test_plan_reads_through_no_ops_and_folds_the_weight():
    program = _program()
    plan = simplify_program(program)
    targets = lambda nodes: {n.target for n in nodes}
    assert targets(plan.aliases) == {aten.clone.default, aten.reshape.default}
    assert targets(plan.constants) == {aten.mul.Tensor, aten.t.default}
    (name, folded), = [c for n, c in plan.constants.items() if n.target is aten.t.default]
    assert name == "weight.mul.t"
    torch.testing.assert_close(folded, (program.state_dict["weight"] * 2).t())
    assert not simplify_program(program, fold_constants=False).constants


def test_export_uses_the_plan_and_leaves_the_program_unchanged():
    program = _program()
    before = str(program.graph)
    onnx_program = dynexport.export(program)
    assert str(program.graph) == before
    assert "weight.mul.t" in onnx_program.model.graph.initializers
    histogram = op_histogram(onnx_program)
    assert "Mul" not in histogram and "Transpose" not in histogram
    x = torch.randn(7, 4)
    torch.testing.assert_close(onnx_program(x), program.module()(x))


def test_equivalent_on_a_module_with_dynamic_batch():
    assert_exports_equivalent(_ScaledTransposed().eval(), (torch.randn(5, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},), resized=[(torch.randn(3, 4),)])


class ChecksItsInputs(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= x.shape[0])
        return x[:k] * 2


def test_runtime_asserts_and_the_arithmetic_feeding_them_are_dropped():
    captured = torch.export.export(
        ChecksItsInputs(), (torch.randn(6, 3), torch.tensor(2)), dynamic_shapes=({0: torch.export.Dim("batch")}, None)
    )
    plan = simplify_program(captured)
    dropped = {str(n.target) for n in plan.dropped}
    assert dropped == {"aten._assert_scalar.default", "<built-in function ge>", "<built-in function le>", "aten.sym_size.int"}
    program = assert_exports_equivalent(
        ChecksItsInputs(), (torch.randn(6, 3), torch.tensor(2)),
        dynamic_shapes=({0: torch.export.Dim("batch")}, None),
        resized=[(torch.randn(9, 3), torch.tensor(7))],
    )
    histogram = op_histogram(program)
    assert "GreaterOrEqual" not in histogram and "LessOrEqual" not in histogram
