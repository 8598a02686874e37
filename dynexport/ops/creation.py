"""Tensor factories: arange, full and its zeros/ones/empty/_like/new_ kin, fill, eye, linspace.

A filled tensor is a scalar Expanded to its shape, never a materialized constant, so the sizes
may be SymInts and the model file stays small.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.dtypes import FLOATING
from dynexport.ops._helpers import cast, ints, scalar, shape_tensor
from dynexport.registry import Promote, translates

aten = torch.ops.aten


def _filled(ctx, shape: ir.Value, value) -> ir.Value:
    """``value`` (a number or an already promoted scalar) Expanded to ``shape`` in the node's dtype."""
    return ctx.op.Expand(scalar(ctx, value, ctx.out_dtype), shape)


def _range(ctx, count) -> ir.Value:
    """0, 1, ..., count - 1 as int64."""
    int64 = ir.DataType.INT64
    return ctx.op.Range(ctx.constant(0, int64), scalar(ctx, count, int64), ctx.constant(1, int64))


# -- full and its kin ------------------------------------------------------------------------


@translates(aten.full.default, promote=Promote.RESULT, promoted=("fill_value",))
def full(ctx, size, fill_value, *, dtype=None):
    return _filled(ctx, shape_tensor(ctx, size), fill_value)


@translates(aten.zeros.default, aten.empty.memory_format)
def zeros(ctx, size, *, dtype=None):
    # empty's contents are unspecified; zeros are as good as any and deterministic.
    return _filled(ctx, shape_tensor(ctx, size), 0)


@translates(aten.empty_strided.default)
def empty_strided(ctx, size, stride, *, dtype=None):
    return zeros(ctx, size)


@translates(aten.ones.default)
def ones(ctx, size, *, dtype=None):
    return _filled(ctx, shape_tensor(ctx, size), 1)


@translates(aten.full_like.default, promote=Promote.RESULT, promoted=("fill_value",))
def full_like(ctx, self, fill_value, *, dtype=None):
    return _filled(ctx, ctx.op.Shape(self), fill_value)


@translates(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(ctx, self, *, dtype=None):
    return _filled(ctx, ctx.op.Shape(self), 0)


@translates(aten.ones_like.default)
def ones_like(ctx, self, *, dtype=None):
    return _filled(ctx, ctx.op.Shape(self), 1)


@translates(aten.new_full.default, promote=Promote.RESULT, promoted=("fill_value",))
def new_full(ctx, self, size, fill_value, *, dtype=None):
    return _filled(ctx, shape_tensor(ctx, size), fill_value)


@translates(aten.new_zeros.default, aten.new_empty.default)
def new_zeros(ctx, self, size, *, dtype=None):
    return _filled(ctx, shape_tensor(ctx, size), 0)


@translates(aten.new_empty_strided.default)
def new_empty_strided(ctx, self, size, stride, *, dtype=None):
    return new_zeros(ctx, self, size)


@translates(aten.new_ones.default)
def new_ones(ctx, self, size, *, dtype=None):
    return _filled(ctx, shape_tensor(ctx, size), 1)


@translates(aten.fill.Scalar, aten.fill.Tensor, promote=Promote.RESULT, promoted=("value",))
def fill(ctx, self, value):
    return _filled(ctx, ctx.op.Shape(self), value)


# -- ranges -----------------------------------------------------------------------------------


@translates(aten.arange.default)
def arange(ctx, end, *, dtype=None):
    return arange_start_step(ctx, 0, end)


@translates(aten.arange.start, aten.arange.start_step)
def arange_start_step(ctx, start, end, step=1, *, dtype=None):
    bounds = (start, end, step)
    if all(_is_integer(bound) for bound in bounds):
        # From integer bounds ONNX's Range computes exactly what PyTorch does.
        return cast(ctx, ctx.op.Range(*(scalar(ctx, b, ir.DataType.INT64) for b in bounds)), ctx.out_dtype)
    # PyTorch computes start + i * step in double for floating results, in int64 (from
    # truncated bounds) for integral ones, then casts.
    compute = ir.DataType.DOUBLE if ctx.out_dtype in FLOATING else ir.DataType.INT64
    values = cast(ctx, _range(ctx, _arange_length(ctx, start, end, step)), compute)
    if isinstance(step, ir.Value) or step != 1:
        values = ctx.op.Mul(values, scalar(ctx, step, compute))
    if isinstance(start, ir.Value) or start != 0:
        values = ctx.op.Add(values, scalar(ctx, start, compute))
    return cast(ctx, values, ctx.out_dtype)


def _is_integer(value) -> bool:
    if isinstance(value, ir.Value):
        return value.dtype == ir.DataType.INT64
    return isinstance(value, int) and not isinstance(value, bool)


def _arange_length(ctx, start, end, step):
    length = ctx.out.shape[0]
    if isinstance(length, int):
        return length
    # ceil((end - start) / step) in double, as PyTorch sizes it; int64 results first truncate
    # the bounds to int64.
    if ctx.out_dtype == ir.DataType.INT64:
        start, end, step = (scalar(ctx, v, ir.DataType.INT64) for v in (start, end, step))
    start, end, step = (scalar(ctx, v, ir.DataType.DOUBLE) for v in (start, end, step))
    return cast(ctx, ctx.op.Ceil(ctx.op.Div(ctx.op.Sub(end, start), step)), ir.DataType.INT64)


@translates(
    aten.linspace.default,
    aten.linspace.Tensor_Tensor,
    aten.linspace.Tensor_Scalar,
    aten.linspace.Scalar_Tensor,
)
def linspace(ctx, start, end, steps, *, dtype=None):
    # PyTorch walks forward from start for the first half and back from end for the second, so
    # both ends are exact.
    double = ir.DataType.DOUBLE
    start, end = scalar(ctx, start, double), scalar(ctx, end, double)
    index = cast(ctx, _range(ctx, steps), double)
    step = ctx.op.Div(ctx.op.Sub(end, start), ctx.constant(float(max(steps - 1, 1)), double))
    forward = ctx.op.Add(start, ctx.op.Mul(index, step))
    backward = ctx.op.Sub(end, ctx.op.Mul(ctx.op.Sub(ctx.constant(float(steps - 1), double), index), step))
    first_half = ctx.op.Less(index, ctx.constant(float(max(steps // 2, 1)), double))
    return cast(ctx, ctx.op.Where(first_half, forward, backward), ctx.out_dtype)


@translates(aten.eye.default, aten.eye.m)
def eye(ctx, n, m=None, *, dtype=None):
    rows = ctx.op.Unsqueeze(_range(ctx, n), ints(ctx, [1]))
    columns = _range(ctx, n if m is None else m)
    return cast(ctx, ctx.op.Equal(rows, columns), ctx.out_dtype)
