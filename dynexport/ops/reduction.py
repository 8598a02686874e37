"""Reductions: sums, means, extrema and their indices, variance, logical and norm reductions.

ONNX reductions are written by ``_helpers.reduce``, in the form of the target opset (axes as an
input from opset 18, ReduceSum's from 13). PyTorch's "every dim" (``dim=None`` or ``[]``) and 0-d
inputs leave the axes out: ONNX then reduces all axes, while empty axes would mean all axes or
none depending on ``noop_with_empty_axes``.
"""

from __future__ import annotations

import builtins
import math

import onnx_ir as ir
import torch

from dynexport.dtypes import to_torch_dtype
from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import (
    cast,
    ints,
    is_floating,
    is_inf,
    least_value,
    normalize_dim,
    normalize_dims,
    rank,
    reduce,
    reshape,
    scalar_like,
    scatter_elements_add,
    shape_of,
)
from dynexport.registry import translates

aten = torch.ops.aten

# PyTorch accumulates half-precision reductions in float32 (squares overflow float16 at 256).
_HALF = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
_NARROW_INTEGERS = frozenset({ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16})
# ReduceMax/ReduceMin take neither 16-bit integers nor (before opset 20) bool; ArgMax no bool.
_NO_EXTREMUM = frozenset({ir.DataType.BOOL, ir.DataType.INT16, ir.DataType.UINT16})


def _dims(self: ir.Value, dim) -> list[int]:
    """PyTorch's ``dim`` as sorted dims of ``self``; a 0-d tensor has none to reduce."""
    return normalize_dims(dim, rank(self)) if rank(self) else []


def _axes(self: ir.Value, dim) -> list[int] | None:
    """The axes of an ONNX reduction over ``dim``: None when every dim goes."""
    dims = _dims(self, dim)
    return None if len(dims) == rank(self) else dims


def _drop_reduced(ctx, value: ir.Value, self: ir.Value, dim) -> ir.Value:
    """``value``, reduced over ``dim`` of ``self`` with keepdims=1, without those dims."""
    dims = _dims(self, dim)
    return ctx.op.Squeeze(value, ints(ctx, dims)) if dims else value


def _accumulator(ctx, self: ir.Value, dtype: ir.DataType) -> ir.Value:
    """``self`` as ``dtype``, or as float32 where ``dtype`` is a half type, or as int64 where it is
    an integer type narrower than 32 bits (ReduceSum, ReduceProd and CumSum take none; the cast
    back to ``dtype`` wraps around as PyTorch's own arithmetic does)."""
    if dtype in _HALF:
        return cast(ctx, self, ir.DataType.FLOAT)
    if dtype in _NARROW_INTEGERS:
        return cast(ctx, self, ir.DataType.INT64)
    return cast(ctx, self, dtype)


def _count(ctx, self: ir.Value, dim) -> int | ir.Value:
    """How many elements of ``self`` each reduction over ``dim`` sees (an int64 scalar if dynamic)."""
    dims = _dims(self, dim)
    sizes = [self.shape[d] for d in dims]
    symbolic = [s for s in sizes if not isinstance(s, int)]
    if not symbolic:
        return math.prod(sizes)
    if len(dims) == rank(self):
        return ctx.op.Size(self)
    return reduce(ctx, "ReduceProd", ctx.op.Gather(ctx.op.Shape(self), ints(ctx, dims)), keepdims=False)


def _never_empty(arg, dims: list[int]) -> bool:
    """Whether each of ``dims`` of the FX argument ``arg`` is at least 1 at every size the export
    accepts (a dynamic dim by its declared range)."""
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return False
    # (This module's ``all`` is aten.all's rule.)
    return builtins.all(least_value(val.shape[d]) >= 1 for d in dims)


def _nonzero(ctx, self: ir.Value) -> ir.Value:
    if self.dtype == ir.DataType.BOOL:
        return self
    return ctx.op.Not(ctx.op.Equal(self, scalar_like(ctx, 0, self)))


# -- sums and means -----------------------------------------------------------------------


@translates(aten.sum.default, aten.sum.dim_IntList)
def sum(ctx, self, dim=None, keepdim=False, *, dtype=None):
    # ctx.out_dtype is dtype, else int64 for bool and integer inputs, as PyTorch sums them.
    x = _accumulator(ctx, self, ctx.out_dtype)
    return cast(ctx, reduce(ctx, "ReduceSum", x, _axes(self, dim), keepdim), ctx.out_dtype)


@translates(aten.cumsum.default)
def cumsum(ctx, self, dim, *, dtype=None):
    x = _accumulator(ctx, self, ctx.out_dtype)
    axis = ctx.constant(normalize_dim(dim, rank(self)), ir.DataType.INT64) if rank(self) else None
    if axis is None:
        return cast(ctx, x, ctx.out_dtype)
    return cast(ctx, ctx.op.CumSum(x, axis), ctx.out_dtype)


# cumprod, logcumsumexp, cummax and cummin have no ONNX op (and a product of logs is not exact):
# each reduces a [..., n, n] tensor whose row i holds the elements up to i, so n is kept small.
_MAX_PREFIX = 1024


def _small_scan(node: torch.fx.Node) -> bool:
    """Whether the scanned length is small: a dynamic one is judged by its example size."""
    self, dim = node.args[0].meta["val"], node.args[1]
    if self.dim() == 0:
        return True
    size = self.shape[dim]
    size = size if isinstance(size, int) else size.node.hint
    return size is not None and size <= _MAX_PREFIX


def _positions(ctx, x: ir.Value) -> ir.Value:
    """0, 1, ..., n - 1 for the (possibly dynamic) size n of ``x``'s last dim."""
    zero, one = ctx.constant(0, ir.DataType.INT64), ctx.constant(1, ir.DataType.INT64)
    return ctx.op.Range(zero, ctx.sym_size(x, -1), one)


def _prefixes(ctx, x: ir.Value, filler: float) -> tuple[ir.Value, ir.Value]:
    """``x`` (scanned along its last dim) repeated as rows: row i keeps elements 0..i, ``filler``
    elsewhere; and the [n, n] mask of the kept elements."""
    positions = _positions(ctx, x)
    columns = ctx.op.Unsqueeze(positions, ints(ctx, [0]))
    kept = ctx.op.LessOrEqual(columns, ctx.op.Unsqueeze(positions, ints(ctx, [1])))
    rows = ctx.op.Unsqueeze(x, ints(ctx, [-2]))
    return ctx.op.Where(kept, rows, ctx.constant(filler, x.dtype)), kept


def _scan(ctx, op_type: str, prefixes: ir.Value, x: ir.Value) -> ir.Value:
    """``prefixes`` reduced over each row, shaped like ``x``: onnxruntime gives wrong shapes when
    it reduces an empty axis, and the reshape (of no elements then) corrects them."""
    reduced = reduce(ctx, op_type, prefixes, [-1], keepdims=False)
    return reshape(ctx, reduced, ctx.op.Shape(x))


def _last(ctx, x: ir.Value, dim: int, rank_: int) -> ir.Value:
    """``x`` with ``dim`` moved to the end (or back: the permutation is its own inverse)."""
    if dim == rank_ - 1:
        return x
    perm = list(range(rank_))
    perm[dim], perm[-1] = perm[-1], perm[dim]
    return ctx.op.Transpose(x, perm=perm)


@translates(aten.cumprod.default, checker=_small_scan)
def cumprod(ctx, self, dim, *, dtype=None):
    x = _accumulator(ctx, self, ctx.out_dtype)
    if rank(self) == 0:
        return cast(ctx, x, ctx.out_dtype)
    dim = normalize_dim(dim, rank(self))
    x = _last(ctx, x, dim, rank(self))
    products = _scan(ctx, "ReduceProd", _prefixes(ctx, x, 1)[0], x)
    return cast(ctx, _last(ctx, products, dim, rank(self)), ctx.out_dtype)


@translates(aten.logcumsumexp.default, checker=_small_scan)
def logcumsumexp(ctx, self, dim):
    if rank(self) == 0:
        return self
    dim = normalize_dim(dim, rank(self))
    x = _last(ctx, _accumulator(ctx, self, self.dtype), dim, rank(self))
    prefixes, _ = _prefixes(ctx, x, -math.inf)
    peak = _scan(ctx, "ReduceMax", prefixes, x)
    # As in logsumexp: an all-infinite prefix is shifted by 0, not by itself.
    peak = ctx.op.Where(is_inf(ctx, peak), ctx.constant(0.0, peak.dtype), peak)
    shifted = ctx.op.Exp(ctx.op.Sub(prefixes, ctx.op.Unsqueeze(peak, ints(ctx, [-1]))))
    result = ctx.op.Add(ctx.op.Log(_scan(ctx, "ReduceSum", shifted, x)), peak)
    return cast(ctx, _last(ctx, result, dim, rank(self)), self.dtype)


def _cumulative_extremum(ctx, op_type: str, self: ir.Value, dim: int):
    if rank(self) == 0:
        return self, ctx.constant(0, ir.DataType.INT64)
    dim = normalize_dim(dim, rank(self))
    x = cast(ctx, self, ir.DataType.INT32) if self.dtype in _NO_EXTREMUM else self
    if is_floating(x):
        filler = -math.inf if op_type == "ReduceMax" else math.inf
    else:
        bounds = torch.iinfo(to_torch_dtype(x.dtype))
        filler = bounds.min if op_type == "ReduceMax" else bounds.max
    x = _last(ctx, x, dim, rank(self))
    prefixes, kept = _prefixes(ctx, x, filler)
    values = _scan(ctx, op_type, prefixes, x)
    # PyTorch's index is the last position up to i holding the extremum.
    hit = ctx.op.And(kept, ctx.op.Equal(prefixes, ctx.op.Unsqueeze(values, ints(ctx, [-1]))))
    indices = _last_hit(ctx, hit, x)
    if is_floating(x):
        # As PyTorch's: a NaN is the extremum from where it occurs on, with the last NaN's index.
        nan_indices = _last_hit(ctx, ctx.op.And(kept, ctx.op.IsNaN(prefixes)), x)
        has_nan = ctx.op.GreaterOrEqual(nan_indices, ctx.constant(0, ir.DataType.INT64))
        values = ctx.op.Where(has_nan, ctx.constant(math.nan, x.dtype), values)
        indices = ctx.op.Where(has_nan, nan_indices, indices)
    return cast(ctx, _last(ctx, values, dim, rank(self)), self.dtype), _last(ctx, indices, dim, rank(self))


def _last_hit(ctx, hit: ir.Value, x: ir.Value) -> ir.Value:
    """The last column of each row of ``hit`` that is True, or -1."""
    hits = ctx.op.Where(hit, _positions(ctx, x), ctx.constant(-1, ir.DataType.INT64))
    return _scan(ctx, "ReduceMax", hits, x)


@translates(aten.cummax.default, checker=_small_scan)
def cummax(ctx, self, dim):
    return _cumulative_extremum(ctx, "ReduceMax", self, dim)


@translates(aten.cummin.default, checker=_small_scan)
def cummin(ctx, self, dim):
    return _cumulative_extremum(ctx, "ReduceMin", self, dim)


@translates(aten.mean.default, aten.mean.dim)
def mean(ctx, self, dim=None, keepdim=False, *, dtype=None):
    x = _accumulator(ctx, self, ctx.out_dtype)
    if _never_empty(ctx.node.args[0], _dims(self, dim)):
        return cast(ctx, reduce(ctx, "ReduceMean", x, _axes(self, dim), keepdim), ctx.out_dtype)
    # Counted on x: onnxruntime's Size takes no bfloat16.
    count = _count(ctx, x, dim)
    # ReduceMean of no elements gives 0 where PyTorch's sum / count gives NaN: when the count
    # may be 0, divide explicitly.
    total = reduce(ctx, "ReduceSum", x, _axes(self, dim), keepdim)
    count = ctx.constant(float(count), x.dtype) if isinstance(count, int) else cast(ctx, count, x.dtype)
    return cast(ctx, ctx.op.Div(total, count), ctx.out_dtype)


@translates(aten.prod.default, aten.prod.dim_int)
def prod(ctx, self, dim=None, keepdim=False, *, dtype=None):
    x = _accumulator(ctx, self, ctx.out_dtype)
    return cast(ctx, reduce(ctx, "ReduceProd", x, _axes(self, dim), keepdim), ctx.out_dtype)


@translates(aten.logsumexp.default)
def logsumexp(ctx, self, dim, keepdim=False):
    x = _accumulator(ctx, self, ctx.out_dtype)
    axes = _axes(self, dim)
    peak = reduce(ctx, "ReduceMax", x, axes)
    # Shifting an all-infinite slice by its peak would give inf - inf = NaN; shift it by 0.
    peak = ctx.op.Where(is_inf(ctx, peak), ctx.constant(0.0, peak.dtype), peak)
    total = reduce(ctx, "ReduceSum", ctx.op.Exp(ctx.op.Sub(x, peak)), axes)
    result = ctx.op.Add(ctx.op.Log(total), peak)
    result = result if keepdim else _drop_reduced(ctx, result, self, dim)
    return cast(ctx, result, ctx.out_dtype)


@translates(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(ctx, self, dim=None):
    flags = cast(ctx, _nonzero(ctx, self), ir.DataType.INT64)
    return reduce(ctx, "ReduceSum", flags, _axes(self, dim), keepdims=False)


@translates(aten.histc.default)
def histc(ctx, self, bins=100, min=0, max=0):
    _check_histc_range(ctx, self, min, max)
    # PyTorch's bin edges are min and max in the input's dtype; an element's bin is
    # int((x - min) * bins / (max - min)), computed in that dtype, max itself in the last bin.
    dtype = to_torch_dtype(self.dtype)
    low, high = torch.tensor(float(min), dtype=dtype), torch.tensor(float(max), dtype=dtype)
    x = reshape(ctx, self, [-1])
    inside = ctx.op.And(
        ctx.op.GreaterOrEqual(x, ctx.constant(low.item(), self.dtype)), ctx.op.LessOrEqual(x, ctx.constant(high.item(), self.dtype))
    )
    scaled = ctx.op.Mul(ctx.op.Sub(x, ctx.constant(low.item(), self.dtype)), ctx.constant(float(bins), self.dtype))
    position = ctx.op.Div(scaled, ctx.constant((high - low).item(), self.dtype))
    index = ctx.op.Min(cast(ctx, ctx.op.Floor(position), ir.DataType.INT64), ctx.constant(bins - 1, ir.DataType.INT64))
    # Elements outside [min, max] (and NaN) count nowhere: they add 0 to the first bin.
    index = ctx.op.Where(inside, index, ctx.constant(0, ir.DataType.INT64))
    counts = ctx.constant([0.0] * bins, self.dtype)
    return scatter_elements_add(ctx, counts, index, cast(ctx, inside, self.dtype), axis=0)


def _check_histc_range(ctx, self: ir.Value, low, high) -> None:
    problem = None
    if self.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        reason = f"histc of {self.dtype.name.lower()} counts in that dtype's arithmetic, which is not reproduced"
        problem = (reason, "compute the histogram of x.float()")
    elif low == high:
        problem = ("histc with min == max takes its range from the data", "pass the range: min < max")
    elif not (math.isfinite(low) and math.isfinite(high)) or low > high:
        problem = (f"histc's range [{low}, {high}] is not a finite interval", "pass finite min < max")
    if problem is not None:
        raise TranslationError(str(ctx.node.target), source_line(ctx.node), *problem)


# -- extrema ------------------------------------------------------------------------------


def _extremum(ctx, op_type: str, self: ir.Value, dim, keepdim: bool) -> ir.Value:
    x = cast(ctx, self, ir.DataType.INT32) if self.dtype in _NO_EXTREMUM else self
    axes = _axes(self, dim)
    result = reduce(ctx, op_type, x, axes, keepdim)
    if is_floating(x):
        # onnxruntime's ReduceMax/ReduceMin skip NaN; PyTorch's extremum of a slice with NaN is NaN.
        flags = cast(ctx, ctx.op.IsNaN(x), ir.DataType.INT32)
        has_nan = ctx.op.Greater(reduce(ctx, "ReduceMax", flags, axes, keepdim), ctx.constant(0, ir.DataType.INT32))
        result = ctx.op.Where(has_nan, ctx.constant(math.nan, x.dtype), result)
    return cast(ctx, result, self.dtype)


def _index_of_extremum(ctx, op_type: str, self: ir.Value, dim, keepdim: bool) -> ir.Value:
    x = cast(ctx, self, ir.DataType.INT32) if self.dtype in _NO_EXTREMUM else self
    if dim is None or rank(self) == 0:
        index = _arg_extremum(ctx, op_type, ctx.op.Reshape(x, ints(ctx, [-1])), 0, False)
        return ctx.op.Reshape(index, ints(ctx, [1] * rank(self))) if keepdim and rank(self) else index
    return _arg_extremum(ctx, op_type, x, normalize_dim(dim, rank(self)), keepdim)


def _arg_extremum(ctx, op_type: str, x: ir.Value, axis: int, keepdim: bool) -> ir.Value:
    # PyTorch returns the first of tied indices, which is select_last_index=0.
    index = getattr(ctx.op, op_type)(x, axis=axis, keepdims=int(keepdim), select_last_index=0)
    if not is_floating(x):
        return index
    # PyTorch takes NaN as the extremum: the index of a slice's first NaN.
    flags = cast(ctx, ctx.op.IsNaN(x), ir.DataType.INT32)
    first_nan = ctx.op.ArgMax(flags, axis=axis, keepdims=int(keepdim), select_last_index=0)
    has_nan = ctx.op.Greater(reduce(ctx, "ReduceMax", flags, [axis], keepdim), ctx.constant(0, ir.DataType.INT32))
    return ctx.op.Where(has_nan, first_nan, index)


@translates(aten.amax.default, aten.max.default)
def amax(ctx, self, dim=(), keepdim=False):
    return _extremum(ctx, "ReduceMax", self, dim, keepdim)


@translates(aten.amin.default, aten.min.default)
def amin(ctx, self, dim=(), keepdim=False):
    return _extremum(ctx, "ReduceMin", self, dim, keepdim)


@translates(aten.max.dim)
def max_dim(ctx, self, dim, keepdim=False):
    values = _extremum(ctx, "ReduceMax", self, [dim], keepdim)
    return values, _index_of_extremum(ctx, "ArgMax", self, dim, keepdim)


@translates(aten.min.dim)
def min_dim(ctx, self, dim, keepdim=False):
    values = _extremum(ctx, "ReduceMin", self, [dim], keepdim)
    return values, _index_of_extremum(ctx, "ArgMin", self, dim, keepdim)


@translates(aten.argmax.default)
def argmax(ctx, self, dim=None, keepdim=False):
    return _index_of_extremum(ctx, "ArgMax", self, dim, keepdim)


@translates(aten.argmin.default)
def argmin(ctx, self, dim=None, keepdim=False):
    return _index_of_extremum(ctx, "ArgMin", self, dim, keepdim)


# -- logical ------------------------------------------------------------------------------


def _truth(ctx, op_type: str, self: ir.Value, dim, keepdim: bool) -> ir.Value:
    # As int32 flags; over no elements ReduceMax gives INT32_MIN and ReduceMin INT32_MAX, so
    # "> 0" makes an empty any() False and an empty all() True, as in PyTorch.
    flags = cast(ctx, _nonzero(ctx, self), ir.DataType.INT32)
    reduced = reduce(ctx, op_type, flags, _axes(self, dim), keepdim)
    return cast(ctx, ctx.op.Greater(reduced, ctx.constant(0, ir.DataType.INT32)), ctx.out_dtype)


@translates(aten.any.default, aten.any.dim, aten.any.dims)
def any(ctx, self, dim=None, keepdim=False):
    return _truth(ctx, "ReduceMax", self, dim, keepdim)


@translates(aten.all.default, aten.all.dim, aten.all.dims)
def all(ctx, self, dim=None, keepdim=False):
    return _truth(ctx, "ReduceMin", self, dim, keepdim)


# -- variance -----------------------------------------------------------------------------


def _var_mean(ctx, self: ir.Value, dim, correction, keepdim: bool) -> tuple[ir.Value, ir.Value]:
    """Variance and mean in the accumulation dtype; PyTorch divides by max(N - correction, 0)."""
    x = _accumulator(ctx, self, self.dtype)
    axes = _axes(self, dim)
    mean = reduce(ctx, "ReduceMean", x, axes)
    squares = reduce(ctx, "ReduceSumSquare", ctx.op.Sub(x, mean), axes, keepdim)
    count = _count(ctx, self, dim)
    if isinstance(count, int):
        dof = ctx.constant(float(max(count - correction, 0)), x.dtype)
    else:
        dof = ctx.op.Sub(cast(ctx, count, x.dtype), ctx.constant(float(correction), x.dtype))
        dof = ctx.op.Max(dof, ctx.constant(0.0, x.dtype))
    variance = ctx.op.Div(squares, dof)
    return variance, mean if keepdim else _drop_reduced(ctx, mean, self, dim)


def _correction(unbiased: bool, correction) -> float:
    if correction is not None:
        return correction
    return 1 if unbiased else 0


@translates(aten.var.correction, aten.var.dim)
def var(ctx, self, dim=None, unbiased=True, keepdim=False, *, correction=None):
    variance, _ = _var_mean(ctx, self, dim, _correction(unbiased, correction), keepdim)
    return cast(ctx, variance, self.dtype)


@translates(aten.std.correction, aten.std.dim)
def std(ctx, self, dim=None, unbiased=True, keepdim=False, *, correction=None):
    variance, _ = _var_mean(ctx, self, dim, _correction(unbiased, correction), keepdim)
    return cast(ctx, ctx.op.Sqrt(variance), self.dtype)


@translates(aten.var_mean.correction, aten.var_mean.dim)
def var_mean(ctx, self, dim=None, unbiased=True, keepdim=False, *, correction=None):
    variance, mean = _var_mean(ctx, self, dim, _correction(unbiased, correction), keepdim)
    return cast(ctx, variance, self.dtype), cast(ctx, mean, self.dtype)


@translates(aten.std_mean.correction, aten.std_mean.dim)
def std_mean(ctx, self, dim=None, unbiased=True, keepdim=False, *, correction=None):
    variance, mean = _var_mean(ctx, self, dim, _correction(unbiased, correction), keepdim)
    return cast(ctx, ctx.op.Sqrt(variance), self.dtype), cast(ctx, mean, self.dtype)


# The .default overloads take only ``unbiased`` and reduce every dim.


@translates(aten.var.default)
def var_default(ctx, self, unbiased=True):
    return var(ctx, self, None, unbiased)


@translates(aten.std.default)
def std_default(ctx, self, unbiased=True):
    return std(ctx, self, None, unbiased)


@translates(aten.var_mean.default)
def var_mean_default(ctx, self, unbiased=True):
    return var_mean(ctx, self, None, unbiased)


@translates(aten.std_mean.default)
def std_mean_default(ctx, self, unbiased=True):
    return std_mean(ctx, self, None, unbiased)


# -- norms --------------------------------------------------------------------------------


@translates(aten.linalg_vector_norm.default)
def linalg_vector_norm(ctx, self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = _accumulator(ctx, self, ctx.out_dtype)
    return cast(ctx, _vector_norm(ctx, x, ord, _axes(self, dim), keepdim), ctx.out_dtype)


def _vector_norm(ctx, x: ir.Value, ord, axes: list[int] | None, keepdims: bool) -> ir.Value:
    if ord == 2:
        return reduce(ctx, "ReduceL2", x, axes, keepdims)
    if ord == 1:
        return reduce(ctx, "ReduceL1", x, axes, keepdims)
    if ord in (math.inf, -math.inf):
        extremum = reduce(ctx, "ReduceMax" if ord > 0 else "ReduceMin", ctx.op.Abs(x), axes, keepdims)
        # onnxruntime's ReduceMax/ReduceMin skip NaN; PyTorch's norm is NaN then.
        nans = reduce(ctx, "ReduceSum", cast(ctx, ctx.op.IsNaN(x), x.dtype), axes, keepdims)
        return ctx.op.Where(ctx.op.Greater(nans, scalar_like(ctx, 0, x)), scalar_like(ctx, math.nan, x), extremum)
    if ord == 0:
        return reduce(ctx, "ReduceSum", cast(ctx, _nonzero(ctx, x), x.dtype), axes, keepdims)
    powers = ctx.op.Pow(ctx.op.Abs(x), ctx.constant(float(ord), x.dtype))
    total = reduce(ctx, "ReduceSum", powers, axes, keepdims)
    return ctx.op.Pow(total, ctx.constant(1.0 / ord, x.dtype))


@translates(aten._cdist_forward.default)
def cdist(ctx, x1, x2, p, compute_mode=None):
    # Every pair's difference, [..., P, R, M], then its p-norm over M.
    differences = ctx.op.Sub(ctx.op.Unsqueeze(x1, ints(ctx, [-2])), ctx.op.Unsqueeze(x2, ints(ctx, [-3])))
    x = _accumulator(ctx, differences, x1.dtype)
    return cast(ctx, _vector_norm(ctx, x, p, [-1], False), x1.dtype)


@translates(aten._pdist_forward.default)
def pdist(ctx, self, p=2):
    # The pairs of rows i < j in PyTorch's (row-major) order: NonZero of the [n, n] mask i < j,
    # for a static or a dynamic row count n.
    zero, one = ctx.constant(0, ir.DataType.INT64), ctx.constant(1, ir.DataType.INT64)
    rows = ctx.op.Range(zero, ctx.sym_size(self, 0), one)
    pairs = ctx.op.NonZero(ctx.op.Less(ctx.op.Unsqueeze(rows, ints(ctx, [1])), ctx.op.Unsqueeze(rows, ints(ctx, [0]))))
    first, second = (ctx.op.Gather(self, ctx.op.Gather(pairs, k), axis=0) for k in (zero, one))
    differences = ctx.op.Sub(first, second)
    norms = _vector_norm(ctx, _accumulator(ctx, differences, self.dtype), p, [-1], False)
    # onnxruntime reduces a single row's no pairs to shape [0, m]; the reshape corrects it.
    return cast(ctx, reshape(ctx, norms, shape_of(ctx, differences, end=1)), self.dtype)
