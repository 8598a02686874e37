"""Tensor factory rules (arange, full, zeros, *_like, new_*, fill, eye, linspace) against onnxruntime."""

from __future__ import annotations

import pytest
import torch

from tests.equivalence import (
    assert_batch_dynamic_equivalent,
    assert_exports_equivalent,
    op_histogram,
)

BATCH_FROM_2 = torch.export.Dim("batch", min=2)


def _batch_dynamic(fn, *inputs, **options):
    return assert_batch_dynamic_equivalent(fn, *inputs, batched=[True] * len(inputs), smaller=True, dim=BATCH_FROM_2, **options)


@pytest.mark.parametrize("opset", [18, 20, 23])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.arange(x.shape[0]),
        lambda x: torch.arange(2, x.shape[0] + 3),
        lambda x: torch.arange(1, 2 * x.shape[0] + 1, 3),
        lambda x: torch.arange(x.shape[0], 0, -1),
        lambda x: torch.arange(x.shape[0] * 2, -3, -3),
        lambda x: torch.arange(0.5, x.shape[0], 0.3),
        lambda x: torch.arange(x.shape[0], dtype=torch.float16),
        lambda x: torch.arange(x.shape[0], dtype=torch.int32),
        lambda x: torch.arange(1, x.shape[0] + 1, dtype=torch.float64) / 3,
        lambda x: torch.arange(0.5, x.shape[0] + 0.5, dtype=torch.int64),
        lambda x: x[:, 0].long() * 0 + torch.arange(x.shape[0]),
    ],
    ids=["end", "start", "step", "negative_step", "negative_end", "float_step", "half", "int32",
         "double", "int64_from_floats", "used"],
)
def test_arange_follows_dynamic_bounds(fn, opset):
    _batch_dynamic(fn, torch.randn(4, 3), opset_version=opset)


@pytest.mark.parametrize(
    "fn",
    [
        lambda: torch.arange(0, 1, 0.1),
        lambda: torch.arange(1, 1.3, 0.1),
        lambda: torch.arange(-2.5, 2.5, 0.7, dtype=torch.float64),
        lambda: torch.arange(10, dtype=torch.uint8),
    ],
    ids=["tenths", "rounding_length", "double", "uint8"],
)
def test_arange_static_length_and_values(fn):
    assert_exports_equivalent(lambda x: (fn(), x + 1), (torch.randn(2),))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]
)
def test_full_zeros_ones_follow_symbolic_sizes(dtype):
    _batch_dynamic(
        lambda x: (
            torch.zeros(x.shape[0], 4, dtype=dtype),
            torch.ones(2, x.shape[0], dtype=dtype),
            torch.full((x.shape[0], 2), 1, dtype=dtype),
            torch.full((), 0, dtype=dtype),
            torch.empty(x.shape[0], 3, dtype=dtype).fill_(1),
        ),
        torch.randn(3, 2),
    )


@pytest.mark.parametrize("opset", [18, 23])
def test_full_with_default_and_symbolic_fill_values(opset):
    _batch_dynamic(
        lambda x: (
            torch.full((x.shape[0], 2), 3.5),
            torch.full((2,), 7),
            torch.full((3,), True),
            torch.full((2, x.shape[0]), x.shape[0]),
            torch.full((2,), 1.5, dtype=torch.int64),
            torch.full((x.shape[0],), float("-inf"), dtype=torch.float16),
        ),
        torch.randn(3, 2),
        opset_version=opset,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool])
def test_like_factories_follow_input_shape_and_dtype(dtype):
    x = (torch.randn(3, 4) * 5).to(dtype)
    _batch_dynamic(
        lambda x: (
            torch.zeros_like(x),
            torch.ones_like(x),
            torch.full_like(x, 2),
            torch.zeros_like(x, dtype=torch.float16),
            torch.full_like(x, 3, dtype=torch.int32),
            torch.empty_like(x).fill_(1),
        ),
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_new_factories(dtype):
    x = torch.ones(3, 4).to(dtype)
    _batch_dynamic(
        lambda x: (
            x.new_zeros(x.shape[0], 2),
            x.new_ones((x.shape[0],)),
            x.new_full((2, x.shape[0]), 1),
            x.new_full((3,), 7.0, dtype=torch.float64),
            x.new_zeros((2,), dtype=torch.int32),
            x.new_empty((x.shape[0], 5)).fill_(0),
        ),
        x,
    )


def test_strided_empty_factories_follow_symbolic_sizes():
    _batch_dynamic(
        lambda x: (
            torch.empty_strided((x.shape[0], 3), (3, 1)).fill_(2),
            x.new_empty_strided((2, x.shape[0]), (x.shape[0], 1)).fill_(1) + x[:, 0],
        ),
        torch.randn(3, 2),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_fill_scalar_and_tensor(dtype):
    x = (torch.randn(3, 4) * 5).to(dtype)
    _batch_dynamic(lambda x: (x.clone().fill_(2), x.clone().fill_(x[0, 1]), x.clone().fill_(x[-1, 0].double())), x)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.eye(x.shape[0]),
        lambda x: torch.eye(x.shape[0], 5, dtype=torch.int64),
        lambda x: torch.eye(3, x.shape[0], dtype=torch.bool),
        lambda x: torch.eye(4, dtype=torch.float16),
    ],
    ids=["square", "rectangular", "symbolic_columns", "static"],
)
def test_eye(fn):
    _batch_dynamic(fn, torch.randn(3, 2))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.linspace(0, 1, 7),
        lambda x: torch.linspace(-3, 5, 10, dtype=torch.int64),
        lambda x: torch.linspace(2, 9, 1),
        lambda x: torch.linspace(2, 9, 0),
        lambda x: torch.linspace(-1.5, 2.5, 100, dtype=torch.float64),
        lambda x: torch.linspace(x[0], x[1], 6),
        lambda x: torch.linspace(x[0], 4.0, 5),
    ],
    ids=["unit", "int64", "one_step", "no_steps", "double", "tensor_bounds", "tensor_start"],
)
def test_linspace(fn):
    assert_exports_equivalent(lambda x: (fn(x), x + 1), (torch.tensor([-2.0, 3.0]),))


def test_large_static_factories_stay_small_in_the_file():
    program = assert_exports_equivalent(
        lambda x: (torch.zeros(256, 512) + x, torch.full((300, 300), 2.0), torch.ones_like(x).expand(256, 512)),
        (torch.randn(512),),
    )
    assert program.model_proto.ByteSize() < 8192
    assert op_histogram(program)["Expand"] >= 2
