"""Sorting and selection: sort, topk, kthvalue, median, nanmedian, mode and nonzero, all built on
ONNX TopK; bucketize, searchsorted and repeat_interleave's indices, which count the boundaries
below each value.

TopK breaks ties by the lower index, which is what PyTorch's stable sort does in both
directions. It orders NaN arbitrarily, while PyTorch treats NaN as larger than +inf; floating
inputs are therefore ranked by a key in which NaN is +inf and +inf the largest finite double.
"""

from __future__ import annotations

import math

import onnx_ir as ir
import torch

from dynexport.ops._helpers import (
    cast,
    ints,
    is_floating,
    normalize_dim,
    pad,
    rank,
    reduce,
    reshape,
    scatter_elements_add,
    shape_tensor,
    size_of,
    with_shape,
)
from dynexport.registry import Promote, translates

aten = torch.ops.aten

_INT64 = ir.DataType.INT64
_DOUBLE = ir.DataType.DOUBLE
# TopK has no bool or int16 kernel in onnxruntime and no complex type at all.
_KEY_TYPES = {ir.DataType.BOOL: ir.DataType.UINT8, ir.DataType.INT16: ir.DataType.INT32}
# Nor an Equal kernel for bfloat16.
_EQUALITY_TYPES = {ir.DataType.BFLOAT16: ir.DataType.FLOAT}


def _sort_key(ctx, x: ir.Value) -> ir.Value:
    """A tensor that TopK orders the way PyTorch orders ``x``."""
    if x.dtype in _KEY_TYPES:
        return cast(ctx, x, _KEY_TYPES[x.dtype])
    if not is_floating(x):
        return x
    # Every float16/bfloat16/float32 value is exact as a double, below the largest finite one.
    # (A double input holding both +inf and that largest value ranks them as ties.)
    key = cast(ctx, x, _DOUBLE)
    key = ctx.op.Where(ctx.op.Equal(key, ctx.constant(float("inf"), _DOUBLE)), ctx.constant(1.7976931348623157e308, _DOUBLE), key)
    return ctx.op.Where(ctx.op.IsNaN(key), ctx.constant(float("inf"), _DOUBLE), key)


def _equality_key(ctx, x: ir.Value) -> ir.Value:
    """``x`` in a type onnxruntime's Equal takes, equal where ``x`` is."""
    return cast(ctx, x, _EQUALITY_TYPES.get(x.dtype, x.dtype))


def _top(ctx, x: ir.Value, k, axis: int, largest: bool) -> tuple[ir.Value, ir.Value]:
    """The ``k`` largest (or smallest) elements of ``x`` along ``axis`` and their indices,
    sorted, ties in index order."""
    key = _sort_key(ctx, x)
    values, indices = ctx.op.TopK(key, shape_tensor(ctx, [k]), axis=axis, largest=int(largest), sorted=1, _outputs=2)
    if key is not x:
        values = ctx.op.GatherElements(x, indices, axis=axis)
    return values, indices


def _scalar_result(ctx, self: ir.Value) -> tuple[ir.Value, ir.Value]:
    # Every reduction over a 0-d tensor returns the element and index 0.
    return ctx.op.Identity(self), ctx.constant(0, _INT64)


@translates(aten.sort.default, aten.sort.stable)
def sort(ctx, self, dim=-1, descending=False, *, stable=False):
    if rank(self) == 0:
        return _scalar_result(ctx, self)
    axis = normalize_dim(dim, rank(self))
    return _top(ctx, self, size_of(ctx, self, axis), axis, largest=descending)


@translates(aten.topk.default)
def topk(ctx, self, k, dim=-1, largest=True, sorted=True):
    if rank(self) == 0:
        return _scalar_result(ctx, self)
    # Unsorted results may come in any order; sorted is one of them.
    return _top(ctx, self, k, normalize_dim(dim, rank(self)), largest)


def _select(ctx, self: ir.Value, k, axis: int, keepdim: bool) -> tuple[ir.Value, ir.Value]:
    """The ``k``-th smallest element along ``axis`` (``k`` counts from 1) and its index."""
    values, indices = _top(ctx, self, k, axis, largest=False)
    last = ctx.op.Sub(shape_tensor(ctx, [k]), ints(ctx, [1]))
    values, indices = (ctx.op.Gather(t, last, axis=axis) for t in (values, indices))
    if not keepdim:
        values, indices = (ctx.op.Squeeze(t, ints(ctx, [axis])) for t in (values, indices))
    return values, indices


@translates(aten.kthvalue.default)
def kthvalue(ctx, self, k, dim=-1, keepdim=False):
    if rank(self) == 0:
        return _scalar_result(ctx, self)
    return _select(ctx, self, k, normalize_dim(dim, rank(self)), keepdim)


def _lower_median(ctx, self: ir.Value, axis: int, keepdim: bool) -> tuple[ir.Value, ir.Value]:
    size = size_of(ctx, self, axis)
    k = (size - 1) // 2 + 1 if isinstance(size, int) else ctx.op.Add(ctx.op.Div(ctx.op.Sub(size, 1), 2), 1)
    values, indices = _select(ctx, self, k, axis, keepdim)
    if not is_floating(self):
        return values, indices
    # A NaN anywhere makes the median NaN, found at the first NaN.
    nan = ctx.op.IsNaN(self)
    has_nan = reduce(ctx, "ReduceMax", cast(ctx, nan, ir.DataType.UINT8), [axis], keepdim)
    has_nan = cast(ctx, has_nan, ir.DataType.BOOL)
    first_nan = ctx.op.ArgMax(cast(ctx, nan, ir.DataType.UINT8), axis=axis, keepdims=int(keepdim), select_last_index=0)
    nan_value = ctx.constant(float("nan"), self.dtype)
    return ctx.op.Where(has_nan, nan_value, values), ctx.op.Where(has_nan, first_nan, indices)


@translates(aten.median.dim)
def median_dim(ctx, self, dim, keepdim=False):
    if rank(self) == 0:
        return _scalar_result(ctx, self)
    return _lower_median(ctx, self, normalize_dim(dim, rank(self)), keepdim)


def _flattened(ctx, self: ir.Value) -> ir.Value:
    numel = math.prod(self.shape) if all(isinstance(d, int) for d in self.shape) else None
    return with_shape(ctx.op.Reshape(self, ints(ctx, [-1])), [numel])


@translates(aten.median.default)
def median(ctx, self):
    values, _ = _lower_median(ctx, _flattened(ctx, self), 0, keepdim=False)
    return values


def _lower_nanmedian(ctx, self: ir.Value, axis: int, keepdim: bool) -> tuple[ir.Value, ir.Value]:
    if not is_floating(self):
        return _lower_median(ctx, self, axis, keepdim)
    # NaN sorts last, so the lower median of a row's c non-NaN values is its ((c - 1) // 2)-th
    # smallest element; with c = 0, the first of its NaNs.
    values, indices = _top(ctx, self, size_of(ctx, self, axis), axis, largest=False)
    counts = reduce(ctx, "ReduceSum", cast(ctx, ctx.op.Not(ctx.op.IsNaN(self)), _INT64), [axis])
    zero, one, two = (ctx.constant(n, _INT64) for n in (0, 1, 2))
    middle = ctx.op.Div(ctx.op.Max(ctx.op.Sub(counts, one), zero), two)
    values, indices = (ctx.op.GatherElements(t, middle, axis=axis) for t in (values, indices))
    if not keepdim:
        values, indices = (ctx.op.Squeeze(t, ints(ctx, [axis])) for t in (values, indices))
    return values, indices


@translates(aten.nanmedian.dim)
def nanmedian_dim(ctx, self, dim, keepdim=False):
    if rank(self) == 0:
        return _scalar_result(ctx, self)
    return _lower_nanmedian(ctx, self, normalize_dim(dim, rank(self)), keepdim)


@translates(aten.nanmedian.default)
def nanmedian(ctx, self):
    values, _ = _lower_nanmedian(ctx, _flattened(ctx, self), 0, keepdim=False)
    return values


def _end_of_longest_run(ctx, ordered: ir.Value, size, axis: int) -> ir.Value:
    """Where the longest run of equal values of ``ordered`` (sorted along ``axis``) ends, the
    first of equally long runs (keepdims)."""
    axes = ints(ctx, [axis])
    following = ctx.op.Slice(ordered, ints(ctx, [1]), shape_tensor(ctx, [size]), axes)
    preceding = ctx.op.Slice(ordered, ints(ctx, [0]), ctx.op.Sub(shape_tensor(ctx, [size]), ints(ctx, [1])), axes)
    # A NaN equals nothing, so every NaN is a run of its own.
    repeated = ctx.op.Equal(_equality_key(ctx, following), _equality_key(ctx, preceding))
    run_starts = with_shape(cast(ctx, ctx.op.Not(repeated), _INT64), [None] * rank(ordered))
    runs = ctx.op.CumSum(pad(ctx, run_starts, [1, 0], [axis]), ctx.constant(axis, _INT64))
    zeros, ones = (ctx.op.Expand(ctx.constant(n, _INT64), ctx.op.Shape(runs)) for n in (0, 1))
    lengths = scatter_elements_add(ctx, with_shape(zeros, [None] * rank(ordered)), runs, ones, axis)
    longest = ctx.op.ArgMax(lengths, axis=axis, keepdims=1, select_last_index=0)
    run_ends = ctx.op.CumSum(lengths, ctx.constant(axis, _INT64))
    return ctx.op.Sub(ctx.op.GatherElements(run_ends, longest, axis=axis), ctx.constant(1, _INT64))


@translates(aten.mode.default)
def mode(ctx, self, dim=-1, keepdim=False):
    if rank(self) == 0:
        return _scalar_result(ctx, self)
    axis = normalize_dim(dim, rank(self))
    size = size_of(ctx, self, axis)
    # In ascending order the first longest run holds the most frequent value, the smallest of
    # equally frequent ones. Its last element is the tie at the largest index (TopK keeps ties in
    # index order), PyTorch's choice for short rows; which one it takes is not specified. (Its CPU
    # kernel sorts NaN arbitrarily, so for a row with NaN its mode may differ.)
    values, indices = _top(ctx, self, size, axis, largest=False)
    last = _end_of_longest_run(ctx, with_shape(values, self.shape), size, axis)
    values, indices = (ctx.op.GatherElements(t, last, axis=axis) for t in (values, indices))
    if not keepdim:
        values, indices = (ctx.op.Squeeze(t, ints(ctx, [axis])) for t in (values, indices))
    return values, indices


@translates(aten.nonzero.default)
def nonzero(ctx, self):
    if rank(self) == 0:
        # NonZero counts a true 0-d tensor's element with one coordinate; PyTorch with none.
        count = cast(ctx, cast(ctx, self, ir.DataType.BOOL), _INT64)
        return ctx.op.Expand(ctx.constant(0, _INT64), shape_tensor(ctx, [count, 0]))
    return ctx.op.Transpose(ctx.op.NonZero(self), perm=[1, 0])


def count_below(ctx, boundaries: ir.Value, values: ir.Value, right: bool, out_int32: bool) -> ir.Value:
    """For each value, how many of the sorted ``boundaries`` (along their last dim) lie below it
    (or at it, with ``right``): its insertion index."""
    columns = ctx.op.Unsqueeze(values, ints(ctx, [-1]))
    if rank(boundaries) > 1:
        boundaries = ctx.op.Unsqueeze(boundaries, ints(ctx, [-2]))
    below = (ctx.op.LessOrEqual if right else ctx.op.Less)(boundaries, columns)
    if is_floating(values):
        # NaN sorts after everything in PyTorch: it goes past every boundary.
        below = ctx.op.Or(below, ctx.op.IsNaN(columns))
    counts = reduce(ctx, "ReduceSum", cast(ctx, below, _INT64), [-1], keepdims=False)
    # onnxruntime shapes a reduction over an empty axis wrongly; the reshape corrects it.
    counts = reshape(ctx, counts, ctx.op.Shape(values))
    return cast(ctx, counts, ir.DataType.INT32 if out_int32 else _INT64)


@translates(aten.bucketize.Tensor, aten.bucketize.Scalar, promote=Promote.COMMON, promoted=("self", "boundaries"))
def bucketize(ctx, self, boundaries, *, out_int32=False, right=False):
    return count_below(ctx, boundaries, self, right, out_int32)


@translates(
    aten.searchsorted.Tensor, aten.searchsorted.Scalar, promote=Promote.COMMON, promoted=("sorted_sequence", "self")
)
def searchsorted(ctx, sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        sorted_sequence = with_shape(ctx.op.GatherElements(sorted_sequence, sorter, axis=-1), sorted_sequence.shape)
    return count_below(ctx, sorted_sequence, self, right or side == "right", out_int32)


def _repeated_indices(ctx, repeats: ir.Value) -> ir.Value:
    """0 repeated repeats[0] times, 1 repeats[1] times, ...: the bucket of each output position
    among the running totals of ``repeats``."""
    repeats = cast(ctx, repeats, _INT64)
    ends = with_shape(ctx.op.CumSum(repeats, ctx.constant(0, _INT64)), [None])
    total = reduce(ctx, "ReduceSum", repeats, keepdims=False)
    positions = with_shape(ctx.op.Range(ctx.constant(0, _INT64), total, ctx.constant(1, _INT64)), [None])
    return count_below(ctx, ends, positions, right=True, out_int32=False)


@translates(aten.repeat_interleave.Tensor)
def repeat_interleave(ctx, repeats, *, output_size=None):
    return cast(ctx, _repeated_indices(ctx, repeats), repeats.dtype)


@translates(aten.repeat_interleave.self_Tensor)
def repeat_interleave_self(ctx, self, repeats, dim=None, *, output_size=None):
    if dim is None:
        self, dim = with_shape(ctx.op.Reshape(self, ints(ctx, [-1])), [None]), 0
    dim = normalize_dim(dim, rank(self))
    # One repeat count applies to every slice along dim.
    repeats = ctx.op.Expand(ctx.op.Reshape(repeats, ints(ctx, [-1])), shape_tensor(ctx, [size_of(ctx, self, dim)]))
    return ctx.op.Gather(self, _repeated_indices(ctx, repeats), axis=dim)
