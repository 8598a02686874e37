"""Shape arithmetic on SymInt and SymFloat follows Python's operators, negative operands included."""

from __future__ import annotations

import torch
from torch.export import Dim

from tests.equivalence import assert_exports_equivalent


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
