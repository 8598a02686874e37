"""Calling an ONNXProgram: inputs outside what the export proved are refused by name (ranges,
equalities, derived dims, static sizes, baked Python numbers), and verification never touches the
caller's tensors."""

from __future__ import annotations

import json

import pytest
import torch
from torch.export import Dim

import dynexport
from dynexport.input_guards import BAKED_INPUTS_KEY, DIM_RANGES_KEY, INPUT_DIMS_KEY
from tests.equivalence import assert_close


class BranchOnBatch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[0] > 10 else x + 1


def test_a_batch_outside_the_dims_range_is_refused_not_answered_by_the_other_branch():
    program = dynexport.export(BranchOnBatch(), (torch.randn(4, 3),), dynamic_shapes=({0: Dim("b", max=8)},))
    for batch in (0, 1, 4, 8):
        x = torch.randn(batch, 3)
        assert_close(program(x), BranchOnBatch()(x))
    with pytest.raises(ValueError, match=r"input 'x' dim 0 is 20, outside the range b \[0, 8\]"):
        program(torch.randn(20, 3))
    with pytest.raises(ValueError, match=r"input 'x' dim 1 is 5, the model was exported with the static size 3"):
        program(torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"input 'x' has 3 dims, the model was exported with 2"):
        program(torch.randn(4, 3, 1))
    metadata = program.model.metadata_props
    assert json.loads(metadata[INPUT_DIMS_KEY]) == {"x": ["b", 3]}
    assert json.loads(metadata[DIM_RANGES_KEY]) == {"b": [0, 8]}
    assert json.loads(metadata[BAKED_INPUTS_KEY]) == {}


@pytest.mark.parametrize(
    "declared",
    [
        {"input_names": ["x"], "dynamic_axes": {"x": {0: "b"}}},
        {"dynamic_shapes": ({0: "b"},)},
        {"dynamic_shapes": ({0: Dim.AUTO},)},
    ],
    ids=["dynamic_axes", "string", "auto"],
)
def test_a_branch_on_a_hinted_dim_is_refused_below_where_it_was_traced(declared):
    """torch.export narrows a hinted dim's range to the traced branch's (``b > 10``: from 11)
    without a word; below it the graph would answer with the other branch's computation."""
    program = dynexport.export(BranchOnBatch(), (torch.randn(12, 3),), **declared)
    for batch in (11, 20):
        x = torch.randn(batch, 3)
        assert_close(program(x), BranchOnBatch()(x))
    with pytest.raises(ValueError, match=r"input 'x' dim 0 is 10, outside the range \w+ >= 11"):
        program(torch.randn(10, 3))


def test_a_branch_on_a_hinted_dim_below_a_size_keeps_the_maximum_torch_narrowed_it_to():
    """Traced at 5, the branch holds up to 10: the graph's checks enforce that maximum (a
    narrowed minimum needs the audit's refinement, a maximum does not)."""
    program = dynexport.export(BranchOnBatch(), (torch.randn(5, 3),), dynamic_shapes=({0: "b"},))
    for batch in (2, 10):
        x = torch.randn(batch, 3)
        assert_close(program(x), BranchOnBatch()(x))
    with pytest.raises(ValueError, match=r"input 'x' dim 0 is 11, outside the range b \[\d+, 10\]"):
        program(torch.randn(11, 3))


def _concat_rows(x, y, z):
    return torch.cat([x, y], 0).sum(0) + z.sum(0)


def test_equal_and_derived_dims_are_checked_between_inputs():
    a = Dim("a")
    program = dynexport.export(
        _concat_rows, (torch.randn(2, 3), torch.randn(3, 3), torch.randn(2, 3)),
        dynamic_shapes=({0: a}, {0: a + 1}, {0: a}),
    )
    for rows in (2, 6):
        args = (torch.randn(rows, 3), torch.randn(rows + 1, 3), torch.randn(rows, 3))
        assert_close(program(*args), _concat_rows(*args))
    with pytest.raises(ValueError, match=r"input 'z' dim 0 is 5 but input 'x' dim 0 is 4: the export proved them"):
        program(torch.randn(4, 3), torch.randn(5, 3), torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"input 'y' dim 0 is 7, the export proved it equal to a \+ 1 = 5"):
        program(torch.randn(4, 3), torch.randn(7, 3), torch.randn(4, 3))
    assert json.loads(program.model.metadata_props[INPUT_DIMS_KEY]) == {"x": ["a", 3], "y": ["a + 1", 3], "z": ["a", 3]}


class _DownUp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(3, 3, 3, stride=2, padding=1)

    def forward(self, x):
        return x + torch.nn.functional.interpolate(self.down(x), scale_factor=2.0)


def test_a_dim_refined_to_a_multiple_of_two_refuses_odd_sizes():
    torch.manual_seed(0)
    model = _DownUp().eval()
    with pytest.warns(UserWarning, match="refined"):
        program = dynexport.export(model, (torch.randn(1, 3, 8, 6),), dynamic_shapes=({2: Dim("h"), 3: Dim("w")},))
    for h, w in ((2, 10), (12, 4)):
        x = torch.randn(1, 3, h, w)
        with torch.no_grad():
            assert_close(program(x), model(x))
    with pytest.raises(ValueError, match=r"input 'x' dim 2 is 7, which is no value of 2\*_h"):
        program(torch.randn(1, 3, 7, 6))


def _scaled(x, n):
    return x * n


def test_a_baked_python_number_must_be_passed_with_its_exported_value():
    program = dynexport.export(_scaled, (torch.randn(2, 3), 3), dynamic_shapes=({0: Dim("b")}, None))
    x = torch.randn(5, 3)
    assert_close(program(x, 3), _scaled(x, 3))
    with pytest.raises(ValueError, match=r"argument 'n' was exported as the constant 3, .* this call passes 4"):
        program(x, 4)
    with pytest.raises(ValueError, match=r"argument 'n' was exported as the constant 3"):
        program(x, 3.0)
    assert json.loads(program.model.metadata_props[BAKED_INPUTS_KEY]) == {"n": 3}


class DoublesItsInput(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


def test_verify_runs_eager_and_onnx_on_private_copies():
    x = torch.ones(2, 3)
    program = dynexport.export(DoublesItsInput(), (x,), verify=True)
    assert program.verification.passed
    assert torch.equal(x, torch.ones(2, 3))
    y, z = torch.full((2, 3), 5.0), torch.full((2, 3), -1.0)
    report = program.verify(y, resized=[(z,)], compare_intermediates=True)
    assert report.passed, report.summary()
    assert torch.equal(y, torch.full((2, 3), 5.0)) and torch.equal(z, torch.full((2, 3), -1.0))


def _reflect_pad(x):
    return torch.nn.functional.pad(x, (3, 3), mode="reflect")


def test_a_minimum_the_model_demands_is_enforced_not_torchs_own_assumption():
    with pytest.warns(UserWarning, match="w: min=4"):
        program = dynexport.export(_reflect_pad, (torch.randn(2, 8),), dynamic_shapes=({1: Dim("w")},))
    for width in (4, 9):
        x = torch.randn(2, width)
        assert_close(program(x), _reflect_pad(x))
    with pytest.raises(ValueError, match=r"input 'x' dim 1 is 3, outside the range w >= 4"):
        program(torch.randn(2, 3))
    # dynamic_axes at an example of 3: torch assumes the dim is at least 2 while tracing, which
    # this graph does not depend on; the dim was declared dynamic, so 1 is accepted.
    doubled = dynexport.export(lambda x: x * 2, (torch.randn(3, 4),), input_names=["x"], dynamic_axes={"x": [0]})
    assert doubled.exported_program.range_constraints and json.loads(
        doubled.model.metadata_props[DIM_RANGES_KEY]
    ) == {"x_dim_0": [0, None]}
    x = torch.randn(1, 4)
    assert_close(doubled(x), x * 2)


def test_a_minimum_the_user_declares_is_enforced():
    program = dynexport.export(lambda x: x * 2, (torch.randn(5, 3),), dynamic_shapes=({0: Dim("rows", min=3)},))
    assert json.loads(program.model.metadata_props[DIM_RANGES_KEY]) == {"rows": [3, None]}
    x = torch.randn(3, 3)
    assert_close(program(x), x * 2)
    with pytest.raises(ValueError, match=r"input 'x' dim 0 is 2, outside the range rows >= 3"):
        program(torch.randn(2, 3))
