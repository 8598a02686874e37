"""Shape arithmetic on SymInt and SymFloat follows Python's operators, negative operands included."""

from __future__ import annotations

import torch
from torch.export import Dim

from tests.equivalence import assert_exports_equivalent, op_histogram


class _ShapeArithmetic(torch.nn.Module):
    """``%`` and ``//`` of a size offset below zero at small batches: Python's ``%`` takes the
    divisor's sign (C fmod the dividend's) and ``//`` floors (ONNX Div truncates)."""

    def forward(self, x):
        n = x.shape[0]
        f = torch.sym_float(n) - 10.5
        return x * ((n - 10) % 3), x * ((n - 10) // 3), x * (f % 3.0), x * (f // 3.0), x * (f % -4.0)


def test_mod_and_floordiv_of_sizes_follow_python_signs():
    x = torch.ones(2, 3)
    assert_exports_equivalent(
        _ShapeArithmetic(), (x,), dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.ones(n, 3),) for n in (3, 7, 10, 13, 17)],
    )


class _Offset(torch.nn.Module):
    def forward(self, x):
        return x * ((x.shape[0] - 10) // 3)


def test_floordiv_of_a_size_whose_range_keeps_it_nonnegative_is_one_div():
    # From a batch of 10 the dividend is never negative, where truncation is floor division;
    # below, the batch of 7 takes the floor-corrected form (-1, where truncation gives 0).
    x = torch.ones(12, 3)
    program = assert_exports_equivalent(
        _Offset(), (x,), dynamic_shapes=({0: Dim("batch", min=10)},), resized=[(torch.ones(n, 3),) for n in (10, 11, 13, 40)]
    )
    assert op_histogram(program) == {"Shape": 1, "Squeeze": 1, "Sub": 1, "Div": 1, "Cast": 1, "Mul": 1}
    program = assert_exports_equivalent(
        _Offset(), (x,), dynamic_shapes=({0: Dim("batch")},), resized=[(torch.ones(n, 3),) for n in (2, 7, 10, 13)]
    )
    assert "Xor" in op_histogram(program)


class _SymIte(torch.nn.Module):
    """``torch.sym_ite`` picks a size by a condition on another: 2n rows below 5, n from there."""

    def forward(self, x):
        n = x.shape[0]
        return x.new_ones(torch.sym_ite(n > 4, n, 2 * n), 2), x * torch.sym_ite(n > 4, 1.5, 0.5)


def test_sym_ite_takes_either_branch_at_run_time():
    assert_exports_equivalent(
        _SymIte(), (torch.ones(6, 3),), dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.ones(n, 3),) for n in (2, 4, 5, 9)],
    )
