"""Higher-order operators: torch.cond as If, while_loop as Loop, scan and map as Scan.

Every model is checked on inputs that take the other branch or run a different number of
iterations than the export inputs did, against eager PyTorch.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch._higher_order_ops.map import map as map_over
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import dynexport
from dynexport.errors import UnsupportedOperatorError
from tests.equivalence import BATCH, assert_exports_equivalent, op_histogram


def _subgraph_ops(program: dynexport.ONNXProgram) -> list[str]:
    """Op types of every node inside the model's subgraphs."""
    graph = program.model.graph
    return [node.op_type for subgraph in graph.subgraphs() for node in subgraph]


# -- torch.cond -> If -----------------------------------------------------------------------


class TwoOutputCond(torch.nn.Module):
    def forward(self, x, y):
        def positive(x, y):
            return x + y, x * 2

        def negative(x, y):
            return x - y, x.cos()

        return torch.cond(x.sum() > 0, positive, negative, (x, y))


def test_cond_takes_either_branch_with_dynamic_batch():
    x, y = torch.rand(3, 4), torch.randn(3, 4)
    program = assert_exports_equivalent(
        TwoOutputCond(),
        (x, y),
        dynamic_shapes=({0: BATCH}, {0: BATCH}),
        resized=[(-x, y), (torch.rand(6, 4), torch.randn(6, 4)), (-torch.rand(1, 4), torch.randn(1, 4))],
    )
    assert op_histogram(program)["If"] == 1
    assert sorted(_subgraph_ops(program)) == ["Add", "Cos", "Mul", "Sub"]


class WeightsAndShapesInBranches(torch.nn.Module):
    """Branches read module weights and the batch size from the enclosing scope, and the false
    branch holds a nested condition on a SymBool."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        def linear(x):
            return self.linear(x) + x.shape[0]

        def by_size(x):
            return torch.cond(x.shape[0] > 4, lambda x: x * 3, lambda x: x.sin(), (x,))

        return torch.cond(x.sum() > 0, linear, by_size, (x,))


def test_cond_reads_weights_and_sizes_and_nests():
    x = torch.rand(3, 4)
    program = assert_exports_equivalent(
        WeightsAndShapesInBranches().eval(),
        (x,),
        dynamic_shapes=({0: BATCH},),
        resized=[(-x,), (-torch.rand(6, 4),), (torch.rand(6, 4),)],
    )
    assert op_histogram(program)["If"] == 1
    assert _subgraph_ops(program).count("If") == 1


def test_cond_branch_returning_its_operand_and_a_constant_fold():
    def passthrough(x):
        return torch.cond(x[0] > 0, lambda x: x.clone(), lambda x: x * (2.0 + 1.0), (x,))

    x = torch.randn(5)
    x[0] = 1.0
    program = assert_exports_equivalent(passthrough, (x,), resized=[(-x,)])
    # One output per branch, each made by a node of its own branch.
    for subgraph in program.model.graph.subgraphs():
        assert subgraph.outputs[0].producer().graph is subgraph


def test_cond_branch_writing_through_a_view_of_its_own_tensor():
    # torch.export keeps a branch's in-place writes as written; x[0] = ... writes through a view.
    def write_first(x):
        def first_row_to_last(x):
            y = x.clone()
            y[0] = x[-1]
            return y

        def last_row_doubled(x):
            y = x * 1.0
            y[-1] *= 2.0
            return y

        return torch.cond(x.sum() > 0, first_row_to_last, last_row_doubled, (x,))

    assert_exports_equivalent(
        write_first,
        (torch.rand(3, 2),),
        dynamic_shapes=({0: BATCH},),
        resized=[(-torch.rand(5, 2),), (torch.rand(4, 2),)],
    )


def test_cond_with_data_dependent_branch_and_unoptimized_export():
    def count_scaled(x):
        return torch.cond(x.sum() > 0, lambda x: (x > 0).nonzero().shape[0] * x, lambda x: x + 1, (x,))

    x = torch.rand(3, 4)
    x[0, 0] = -1.0
    for optimize in (True, False):
        assert_exports_equivalent(
            count_scaled,
            (x,),
            dynamic_shapes=({0: BATCH},),
            resized=[(torch.rand(5, 4),), (-torch.rand(2, 4),)],
            optimize=optimize,
        )


def test_cond_folds_constants_inside_branches():
    class Branches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0]))

        def forward(self, x):
            return torch.cond(
                x.sum() > 0, lambda x, s: x * (s * 2).exp(), lambda x, s: x - s.sqrt(), (x, self.scale)
            )

    x = torch.rand(2, 3)
    program = assert_exports_equivalent(Branches(), (x,), resized=[(-x,)])
    # exp(scale * 2) and sqrt(scale) are computed at export time, in their branches.
    assert sorted(_subgraph_ops(program)) == ["Mul", "Sub"]


# -- while_loop -> Loop ----------------------------------------------------------------------


class CountedLoop(torch.nn.Module):
    """A trip count given as an input tensor; three carried tensors; a value from outside."""

    def forward(self, n, x, bias):
        def keep_going(i, acc, history):
            return i < n

        def step(i, acc, history):
            return i + 1, acc * 0.5 + bias, history + acc.sum()

        return while_loop(keep_going, step, (torch.zeros((), dtype=torch.int64), x, torch.zeros(1)))


def test_while_loop_trip_count_from_input():
    x, bias = torch.randn(3, 4), torch.randn(4)
    program = assert_exports_equivalent(
        CountedLoop(),
        (torch.tensor(3), x, bias),
        resized=[(torch.tensor(0), x, bias), (torch.tensor(7), x, bias)],
    )
    assert op_histogram(program)["Loop"] == 1


class ConvergingLoop(torch.nn.Module):
    """A data-dependent condition over a dynamic-batch carried tensor."""

    def forward(self, x):
        def below_limit(steps, y):
            return y.abs().sum() < 100

        def double(steps, y):
            return steps + 1, y * 2 + x

        return while_loop(below_limit, double, (torch.tensor(0), x.abs() + 0.1))


def test_while_loop_data_dependent_condition_and_batch():
    x = torch.rand(3, 4)
    assert_exports_equivalent(
        ConvergingLoop(),
        (x,),
        dynamic_shapes=({0: BATCH},),
        resized=[(torch.rand(5, 4) * 10,), (torch.full((2, 4), 30.0),)],
    )


def test_while_loop_with_python_int_counter():
    def five_doublings(x):
        # The counter becomes an unbacked SymInt: an int64 scalar carried and returned.
        return while_loop(lambda i, y: i < 5, lambda i, y: (i + 1, y * 2), (0, x))

    assert_exports_equivalent(five_doublings, (torch.rand(3),), resized=[(torch.randn(3),)])


def test_cond_inside_while_loop_body():
    def alternate(n, x):
        def body(i, y):
            return i + 1, torch.cond(i % 2 == 0, lambda y: y + 1, lambda y: y * 3, (y,))

        return while_loop(lambda i, y: i < n, body, (torch.tensor(0), x))

    x = torch.randn(2, 2)
    program = assert_exports_equivalent(alternate, (torch.tensor(3), x), resized=[(torch.tensor(4), x)])
    assert _subgraph_ops(program).count("If") == 1


# -- scan and map -> Scan --------------------------------------------------------------------


def test_scan_carries_state_over_a_dynamic_length():
    def cumulative(init, xs):
        return scan(lambda carry, x: (carry + x, carry * x.sigmoid()), init, xs)

    init, xs = torch.randn(4), torch.randn(3, 4)
    program = assert_exports_equivalent(
        cumulative, (init, xs), dynamic_shapes=(None, {0: torch.export.Dim("steps")}), resized=[(init, torch.randn(7, 4))]
    )
    assert op_histogram(program)["Scan"] == 1


def test_scan_reverse_along_dim_1_with_outside_weight():
    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.Linear(4, 4)

        def forward(self, h, xs):
            return scan(lambda h, x: (torch.tanh(self.cell(h) + x), h.clone()), h, xs, dim=1, reverse=True)

    h, xs = torch.randn(2, 4), torch.randn(2, 5, 4)
    assert_exports_equivalent(
        Recurrent().eval(),
        (h, xs),
        dynamic_shapes=(None, {1: torch.export.Dim("steps")}),
        resized=[(h, torch.randn(2, 9, 4))],
    )


def test_map_over_two_inputs_with_a_shared_argument():
    def per_row(xs, ys, scale):
        return map_over(lambda row, s: (row[0] * row[1] + s, (row[0] - row[1]).sum()), (xs, ys), scale)

    xs, ys, scale = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
    dim = torch.export.Dim("rows")
    program = assert_exports_equivalent(
        per_row,
        (xs, ys, scale),
        dynamic_shapes=({0: dim}, {0: dim}, None),
        resized=[(torch.randn(8, 4), torch.randn(8, 4), scale)],
    )
    assert op_histogram(program)["Scan"] == 1


# -- what the passes and errors do with subgraphs --------------------------------------------


def test_subgraph_names_are_unique_across_scopes():
    program = dynexport.export(TwoOutputCond(), (torch.rand(3, 4), torch.randn(3, 4)))
    graph = program.model.graph
    names = [v.name for g in [graph, *graph.subgraphs()] for node in g for v in node.outputs]
    names += [v.name for g in graph.subgraphs() for v in [*g.inputs, *g.initializers.values()]]
    assert len(names) == len(set(names))
    onnx.checker.check_model(program.model_proto, full_check=True)


def test_value_read_only_inside_a_branch_survives_dead_code_elimination():
    def outside(x):
        shifted = x.exp() + 1  # read by the true branch alone
        return torch.cond(x.sum() > 0, lambda x, s: x * s, lambda x, s: x - 1, (x, shifted))

    x = torch.rand(4)
    program = assert_exports_equivalent(outside, (x,), resized=[(-x,)])
    assert op_histogram(program)["Exp"] == 1


@torch.library.custom_op("dynexport_test::untranslatable", mutates_args=())
def _untranslatable(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_untranslatable.register_fake
def _(x):
    return torch.empty_like(x)


def test_operator_without_translation_inside_a_branch_is_named():
    class Guarded(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: _untranslatable(x), lambda x: x + 1, (x,))

    with pytest.raises(UnsupportedOperatorError) as error:
        dynexport.export(Guarded(), (torch.rand(3),))
    assert error.value.targets == ["dynexport_test.untranslatable.default"]
    assert "first used at" in str(error.value) and "test_control_flow.py" in str(error.value)
