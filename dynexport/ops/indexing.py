"""Indexing: lookups and gathers, advanced indexing and its writes, scatters, masked fills, and
the ops that move elements within a tensor (triangles, repeat, roll, flip)."""

from __future__ import annotations

import math

import onnx_ir as ir
import torch

from dynexport.dtypes import to_torch_dtype
from dynexport.builder import OperatorNotInOpset
from dynexport.ops._helpers import (
    argument,
    cast,
    computed_in,
    ints,
    normalize_dim,
    only_first_output_used,
    rank,
    reshape,
    scalar,
    scatter_elements_add,
    select,
    shape_of,
    shape_tensor,
    size_of,
    with_shape,
)
from dynexport.ops.sorting import count_below
from dynexport.registry import Promote, translates

aten = torch.ops.aten

_INT64 = ir.DataType.INT64
_INT32 = ir.DataType.INT32
_MASKS = (ir.DataType.BOOL, ir.DataType.UINT8)


def _transpose(ctx, x: ir.Value, perm: list[int]) -> ir.Value:
    return x if perm == sorted(perm) else ctx.op.Transpose(x, perm=perm)


def _inverse(perm: list[int]) -> list[int]:
    return sorted(range(len(perm)), key=perm.__getitem__)


# -- lookups and gathers ----------------------------------------------------------------------


@translates(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # padding_idx only stops its row's gradient; the forward pass is a plain lookup.
    return ctx.op.Gather(weight, indices, axis=0)


_EMBEDDING_BAG_MODES = ("sum", "mean", "max")


@translates(
    aten.embedding_bag.padding_idx, aten.embedding_bag.default, aten._embedding_bag.default,
    aten._embedding_bag_forward_only.default, checker=only_first_output_used,
)
def embedding_bag(
    ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
    include_last_offset=False, padding_idx=None,
):
    # aten.embedding_bag.padding_idx passes None for none; the aten._embedding_bag ops pass -1.
    if padding_idx == -1 and ctx.node.target is not aten.embedding_bag.padding_idx:
        padding_idx = None
    bags = _bags(ctx, weight, indices, offsets, _EMBEDDING_BAG_MODES[mode], per_sample_weights, include_last_offset, padding_idx)
    # The other outputs (bag of each index, bag sizes, max positions) only serve backward.
    return bags, None, None, None


def _bags(ctx, weight, indices, offsets, reduce: str, per_sample_weights, include_last_offset: bool, padding) -> ir.Value:
    # Each looked-up row is scattered into its bag: the bag of position i is the number of bag
    # starts at or before i, minus one. Empty bags give zeros, as in PyTorch.
    count = ctx.op.Size(indices)
    positions = with_shape(ctx.op.Range(ctx.constant(0, _INT64), count, ctx.constant(1, _INT64)), [None])
    starts = offsets
    if include_last_offset:
        starts = with_shape(ctx.op.Slice(offsets, ints(ctx, [0]), ints(ctx, [-1])), [None])
    bags = ctx.op.Sub(count_below(ctx, starts, positions, right=True, out_int32=False), ctx.constant(1, _INT64))
    rows = ctx.op.Gather(weight, indices, axis=0)
    if per_sample_weights is not None:
        rows = ctx.op.Mul(rows, ctx.op.Unsqueeze(per_sample_weights, ints(ctx, [1])))
    if include_last_offset and padding is None and reduce != "max" and weight.dtype != ir.DataType.DOUBLE:
        # PyTorch's fast kernel (sums of float, half and bfloat16 rows without padding_idx) ends
        # the last bag at the last offset: indices past it add nothing (mean still counts them).
        last_offset = cast(ctx, ctx.op.Gather(offsets, ctx.constant(-1, _INT64)), _INT64)
        summed = ctx.op.Unsqueeze(ctx.op.Less(positions, last_offset), ints(ctx, [1]))
        rows = ctx.op.Where(summed, rows, ctx.constant(0.0, weight.dtype))
    kept = None
    if padding is not None:
        padding_row = ctx.constant(padding, indices.dtype)
        if padding < 0:  # counted from the end of the table
            padding_row = ctx.op.Add(padding_row, cast(ctx, shape_of(ctx, weight, end=1), indices.dtype))
        kept = ctx.op.Not(ctx.op.Equal(indices, padding_row))
    filler = -math.inf if reduce == "max" else 0.0
    if kept is not None:
        rows = ctx.op.Where(ctx.op.Unsqueeze(kept, ints(ctx, [1])), rows, ctx.constant(filler, weight.dtype))
    bag_count = size_of(ctx, starts, 0)
    empty = ctx.op.Expand(ctx.constant(filler, weight.dtype), shape_tensor(ctx, [bag_count, size_of(ctx, weight, 1)]))
    targets = ctx.op.Expand(ctx.op.Unsqueeze(bags, ints(ctx, [1])), ctx.op.Shape(rows))
    totals = _reduced(ctx, "ScatterElements", empty, targets, rows, "max" if reduce == "max" else "add", axis=0)
    if reduce == "sum":
        return totals
    members = ctx.op.Expand(ctx.constant(1, _INT64), ctx.op.Shape(indices)) if kept is None else cast(ctx, kept, _INT64)
    zeros = ctx.op.Expand(ctx.constant(0, _INT64), shape_tensor(ctx, [bag_count]))
    sizes = ctx.op.Unsqueeze(scatter_elements_add(ctx, with_shape(zeros, [None]), bags, members, 0), ints(ctx, [1]))
    if reduce == "mean":
        return ctx.op.Div(totals, cast(ctx, ctx.op.Max(sizes, ctx.constant(1, _INT64)), weight.dtype))
    return ctx.op.Where(ctx.op.Greater(sizes, ctx.constant(0, _INT64)), totals, ctx.constant(0.0, weight.dtype))


_SEGMENT_REDUCTIONS = {"sum": "add", "mean": "add", "prod": "mul", "max": "max", "min": "min"}


def _segment_reduce_supported(node: torch.fx.Node) -> bool:
    # Segments along axis 0 only: along a later axis, lengths has the leading dims too.
    bounds = argument(node, "lengths")
    if bounds is None:
        bounds = argument(node, "offsets")
    data_rank = node.args[0].meta["val"].dim()
    return bounds is not None and bounds.meta["val"].dim() == 1 and argument(node, "axis") in (0, -data_rank)


@translates(aten.segment_reduce.default, checker=_segment_reduce_supported)
def segment_reduce(ctx, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    if lengths is not None:
        starts = ctx.op.CumSum(cast(ctx, lengths, _INT64), ctx.constant(0, _INT64), exclusive=1)
    else:
        starts = ctx.op.Slice(cast(ctx, offsets, _INT64), ints(ctx, [0]), ints(ctx, [-1]))
    starts = with_shape(starts, [None])
    count = size_of(ctx, data, 0)
    positions = ctx.op.Range(ctx.constant(0, _INT64), scalar(ctx, count, _INT64), ctx.constant(1, _INT64))
    positions = with_shape(positions, [None])
    # As for embedding bags, a row belongs to the last segment that starts at or before it.
    segments = ctx.op.Sub(count_below(ctx, starts, positions, right=True, out_int32=False), ctx.constant(1, _INT64))
    trailing = ints(ctx, range(1, rank(data)))
    targets = ctx.op.Expand(ctx.op.Unsqueeze(segments, trailing) if rank(data) > 1 else segments, ctx.op.Shape(data))
    # Every segment starts from initial (empty ones end there) or from the reduction's identity.
    if initial is None:
        start = _identity(ctx, "a" + reduce if reduce in ("max", "min") else reduce, data.dtype)
    else:
        start = ctx.constant(initial, data.dtype)
    result_shape = ctx.op.Concat(ctx.op.Shape(starts), shape_of(ctx, data, 1), axis=0)
    reduction = _SEGMENT_REDUCTIONS[reduce]
    totals = _reduced(ctx, "ScatterElements", ctx.op.Expand(start, result_shape), targets, data, reduction, axis=0)
    if reduce != "mean":
        return totals
    ones = ctx.op.Expand(ctx.constant(1, _INT64), ctx.op.Shape(segments))
    zeros = ctx.op.Expand(ctx.constant(0, _INT64), ctx.op.Shape(starts))
    sizes = scatter_elements_add(ctx, with_shape(zeros, [None]), segments, ones, 0)
    if rank(data) > 1:
        sizes = ctx.op.Unsqueeze(sizes, trailing)
    if initial is not None:
        # An empty segment keeps initial; without it, its mean is 0 / 0 = NaN, as in PyTorch.
        sizes = ctx.op.Max(sizes, ctx.constant(1, _INT64))
    return ctx.op.Div(totals, cast(ctx, sizes, data.dtype))


@translates(aten.index_select.default)
def index_select(ctx, self, dim, index):
    if rank(index) == 0:
        # A 0-d index still keeps the dim, with size 1.
        index = ctx.op.Reshape(index, ints(ctx, [1]))
    if rank(self) == 0:
        # A 0-d tensor is indexed as if it had one element (its index can only be 0).
        return ctx.op.Identity(self)
    return ctx.op.Gather(self, index, axis=normalize_dim(dim, rank(self)))


@translates(aten.gather.default)
def gather(ctx, self, dim, index, *, sparse_grad=False):
    return ctx.op.GatherElements(self, index, axis=normalize_dim(dim, rank(self)))


# -- advanced indexing ------------------------------------------------------------------------


def _index_tensors(ctx, indices) -> tuple[list[int], list[ir.Value]]:
    """The indexed dims and an int64 index tensor for each; a boolean mask indexes as many dims
    as it has, with the coordinates of its True entries."""
    dims, tensors, dim = [], [], 0
    for index in indices:
        if index is None:
            dim += 1
        elif index.dtype in _MASKS:
            coordinates = ctx.op.NonZero(index)
            for i in range(rank(index)):
                dims.append(dim + i)
                tensors.append(ctx.op.Gather(coordinates, ctx.constant(i, _INT64), axis=0))
            dim += rank(index)
        else:
            dims.append(dim)
            tensors.append(cast(ctx, index, _INT64))
            dim += 1
    return dims, tensors


def _stacked(ctx, indices, tensors: list[ir.Value]) -> ir.Value:
    """The index tensors broadcast together and stacked on a new last axis (GatherND's layout)."""
    given = [index for index in indices if index is not None]
    same_shapes = all(i.dtype not in _MASKS and i.shape == given[0].shape for i in given)
    if len(given) > 1 and not same_shapes:
        total = tensors[0]
        for tensor in tensors[1:]:
            total = ctx.op.Add(total, tensor)
        tensors = [ctx.op.Expand(tensor, ctx.op.Shape(total)) for tensor in tensors]
    last = ints(ctx, [-1])
    return ctx.op.Concat(*(ctx.op.Unsqueeze(tensor, last) for tensor in tensors), axis=-1)


def _index_layout(indices) -> tuple[int, int | None]:
    """(rank of the broadcast index, dim where the indexed dims' result goes or None for the
    front): PyTorch keeps the result in place only when the index tensors are adjacent."""
    given = [d for d, index in enumerate(indices) if index is not None]
    index_rank = max(1 if indices[d].dtype in _MASKS else rank(indices[d]) for d in given)
    adjacent = given == list(range(given[0], given[-1] + 1))
    return index_rank, given[0] if adjacent else None


def _arange_lane(index: ir.Value | None) -> tuple[ir.Value, int, int] | None:
    """(arange, axis, rank) when ``index`` is the 1-D ``arange`` laid along one axis of a shape of
    ``rank`` whose other sizes are 1, as ``torch.arange(n)[:, None, None]`` makes it."""
    if index is None or index.dtype in _MASKS or index.shape is None:
        return None
    wide = [axis for axis, size in enumerate(index.shape) if size != 1]
    if len(wide) != 1:
        return None
    value = index
    while (node := value.producer()) is not None and node.op_type in ("Unsqueeze", "Cast", "Add") and node.domain == "":
        if node.op_type == "Cast" and node.inputs[0].dtype not in (_INT64, _INT32):
            return None
        if node.op_type == "Add" and _constant_int(node.inputs[1]) != 0:
            return None  # an offset other than 0 (transformers adds its kv offset, 0 without a sliding window)
        value = node.inputs[0]
    node = value.producer()
    if node is None or node.op_type != "Range" or node.domain != "":
        return None
    start, _, delta = node.inputs
    if _constant_int(start) != 0 or _constant_int(delta) != 1:
        return None
    return value, wide[0], len(index.shape)


def _constant_int(value: ir.Value) -> int | None:
    node = value.producer()
    if node is None or node.op_type != "Constant" or "value" not in node.attributes:
        return None
    array = node.attributes["value"].as_tensor().numpy()
    return int(array) if array.size == 1 and array.dtype.kind in "iu" else None


def _same_size(a: ir.Value, a_axis: int, b: ir.Value, b_axis: int) -> bool:
    """Whether the two sizes are known equal: the same int, or the same named symbol."""
    if a.shape is None or b.shape is None:
        return False
    size, other = a.shape[a_axis], b.shape[b_axis]
    if isinstance(size, int) or isinstance(other, int):
        return size == other
    return size.value is not None and size.value == other.value


def _index_by_aranges(ctx, self: ir.Value, indices) -> ir.Value | None:
    """``self[arange(n0)[:, None], arange(n1)[None, :]]`` and the like, where each dim of ``self``
    is indexed by an arange laid along its own axis: the leading ``n_k`` of each dim, moved to
    those axes, with no broadcast and stacked indices. (transformers' attention masks read their
    padding mask this way.)"""
    lanes = [_arange_lane(index) for index in indices]
    if len(indices) != rank(self) or len(indices) < 2 or any(lane is None for lane in lanes):
        return None
    out_rank = max(lane_rank for _, _, lane_rank in lanes)
    axes = [axis + out_rank - lane_rank for _, axis, lane_rank in lanes]
    if len(set(axes)) != len(axes):
        return None
    result = self
    for dim, ((arange, axis, _), index) in enumerate(zip(lanes, indices)):
        if not _same_size(self, dim, index, axis):
            # A Gather, not a Slice: past the dim's end it fails, as PyTorch does. By a [1, n]
            # index, which onnxruntime does not rewrite into a Slice (it does a Range's 1-D one).
            first = ints(ctx, [0])
            gathered = ctx.op.Gather(result, ctx.op.Unsqueeze(arange, first), axis=dim)
            result = ctx.op.Squeeze(gathered, ints(ctx, [dim]))
    result = _transpose(ctx, result, sorted(range(len(axes)), key=axes.__getitem__))
    spread = [axis for axis in range(out_rank) if axis not in axes]
    return ctx.op.Unsqueeze(result, ints(ctx, spread)) if spread else result


@translates(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(ctx, self, indices):
    given = [d for d, index in enumerate(indices) if index is not None]
    if len(given) == 1 and indices[given[0]].dtype not in _MASKS:
        return ctx.op.Gather(self, indices[given[0]], axis=given[0])
    by_aranges = _index_by_aranges(ctx, self, indices)
    if by_aranges is not None:
        return by_aranges
    dims, tensors = _index_tensors(ctx, indices)
    perm = dims + [d for d in range(rank(self)) if d not in dims]
    result = ctx.op.GatherND(_transpose(ctx, self, perm), _stacked(ctx, indices, tensors))
    index_rank, position = _index_layout(indices)
    if not position:
        return result
    rest = ctx.out_rank - index_rank
    front = [index_rank + i for i in range(position)]
    back = [index_rank + i for i in range(position, rest)]
    return ctx.op.Transpose(result, perm=front + list(range(index_rank)) + back)


@translates(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(ctx, self, indices, values, accumulate=False):
    if _empty(self) or any(index is not None and _empty(index) for index in indices):
        return ctx.op.Identity(self)  # nothing written; onnxruntime's ScatterND rejects no updates
    dims, tensors = _index_tensors(ctx, indices)
    perm = dims + [d for d in range(rank(self)) if d not in dims]
    moved = _transpose(ctx, self, perm)
    stacked = _stacked(ctx, indices, tensors)
    index_rank, position = _index_layout(indices)
    if position:
        values = _index_dims_first(ctx, values, position, index_rank, rank(self) - dims[-1] - 1)
    shape = ctx.op.Concat(shape_of(ctx, stacked, end=-1), shape_of(ctx, moved, len(dims)), axis=0)
    updates = ctx.op.Expand(values, shape)
    written = _reduced(ctx, "ScatterND", moved, stacked, updates, "add" if accumulate else "none")
    return _transpose(ctx, written, _inverse(perm))


def _index_dims_first(ctx, values, position: int, index_rank: int, trailing: int) -> ir.Value:
    """``values``, laid out like ``self[indices]`` with the index's dims at ``position``, with
    those dims moved to the front."""
    total = position + index_rank + trailing
    if rank(values) < total:
        values = ctx.op.Unsqueeze(values, ints(ctx, range(total - rank(values))))
    perm = [*range(position, position + index_rank), *range(position), *range(position + index_rank, total)]
    return ctx.op.Transpose(values, perm=perm)


@translates(aten.masked_fill.Scalar, aten.masked_fill.Tensor, promote=Promote.RESULT, promoted=("value",))
def masked_fill(ctx, self, mask, value):
    return select(ctx, mask, value, self)


@translates(aten.masked_select.default)
def masked_select(ctx, self, mask):
    if mask.shape != self.shape:
        shape = ctx.op.Shape(select(ctx, mask, self, self))
        self, mask = ctx.op.Expand(self, shape), ctx.op.Expand(mask, shape)
    coordinates = ctx.op.Transpose(ctx.op.NonZero(mask), perm=[1, 0])
    return ctx.op.GatherND(self, coordinates)


@translates(aten.masked_scatter.default)
def masked_scatter(ctx, self, mask, source):
    # The k-th True position (in row-major order) takes the k-th element of source.
    flat_mask = ctx.op.Reshape(ctx.op.Expand(mask, ctx.op.Shape(self)), ints(ctx, [-1]))
    ordinals = ctx.op.Sub(ctx.op.CumSum(cast(ctx, flat_mask, _INT64), ctx.constant(0, _INT64)), ctx.constant(1, _INT64))
    # An all-False mask accepts an empty source; one padding element keeps the (unused) gather
    # in bounds.
    flat_source = ctx.op.Concat(ctx.op.Reshape(source, ints(ctx, [-1])), ctx.constant([0], source.dtype), axis=0)
    taken = ctx.op.Gather(flat_source, ctx.op.Max(ordinals, ctx.constant(0, _INT64)), axis=0)
    flat = select(ctx, flat_mask, taken, ctx.op.Reshape(self, ints(ctx, [-1])))
    return reshape(ctx, flat, ctx.op.Shape(self))


@translates(aten.nonzero_static.default)
def nonzero_static(ctx, self, *, size, fill_value=-1):
    if rank(self) == 0:
        return ctx.op.Expand(ctx.constant(fill_value, _INT64), shape_tensor(ctx, [size, 0]))
    coordinates = ctx.op.Transpose(ctx.op.NonZero(self), perm=[1, 0])
    # Padding with size rows of fill_value, then keeping size rows, covers fewer and more nonzeros.
    padding = ctx.op.Expand(ctx.constant(fill_value, _INT64), shape_tensor(ctx, [size, rank(self)]))
    padded = ctx.op.Concat(coordinates, padding, axis=0)
    return ctx.op.Slice(padded, ints(ctx, [0]), shape_tensor(ctx, [size]), ints(ctx, [0]))


# -- scatters ---------------------------------------------------------------------------------


def _scatter(ctx, self, dim, index, src, reduction: str) -> ir.Value:
    if rank(self) == 0:
        # ScatterElements needs an axis: a 0-d scatter is one of a single element.
        self, index, src = (_one_element(ctx, x) for x in (self, index, src))
        return ctx.op.Reshape(_scatter(ctx, self, 0, index, src, reduction), ints(ctx, []))
    if src.shape != index.shape:
        # PyTorch reads only the leading index-shaped block of a larger src.
        zeros = ints(ctx, [0] * rank(index))
        src = ctx.op.Slice(src, zeros, ctx.op.Shape(index))
    return _reduced(ctx, "ScatterElements", self, index, src, reduction, axis=normalize_dim(dim, rank(self)))


def _one_element(ctx, x: ir.Value) -> ir.Value:
    """A 0-d (or one-element) ``x`` as a 1-D tensor of one element."""
    return with_shape(ctx.op.Reshape(x, ints(ctx, [1])), [1])


def _empty(x: ir.Value) -> bool:
    """Whether ``x`` has no elements whatever the inputs (a dim of static size 0)."""
    return x.shape is not None and any(size == 0 for size in x.shape if isinstance(size, int))


# ScatterElements and ScatterND reduce by add and mul from opset 16, by max and min from 18
# (onnxruntime's kernels take max and min from 16, other runtimes do not).
_REDUCTIONS_SINCE = {"add": 16, "mul": 16, "max": 18, "min": 18}


def _reduced(ctx, op_type: str, self, index, updates, reduction: str, **attributes) -> ir.Value:
    """A ScatterND/ScatterElements; reductions run in float for 16-bit floats and in uint8 for
    bools (as 0/1 bytes max is or, min is and), which onnxruntime's CPU kernels only scatter
    with reduction "none"."""
    since = _REDUCTIONS_SINCE.get(reduction, 1)
    if ctx.opset < since:
        raise OperatorNotInOpset(op_type, ctx.opset, since, f"reduction {reduction!r}")
    dtype = self.dtype
    if reduction != "none" and dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        dtype = ir.DataType.FLOAT
    elif reduction != "none" and dtype == ir.DataType.BOOL:
        dtype = ir.DataType.UINT8
    scatter = getattr(ctx.op, op_type)
    if reduction != "none":  # an attribute from opset 16
        attributes["reduction"] = reduction
    result = scatter(cast(ctx, self, dtype), index, cast(ctx, updates, dtype), **attributes)
    return cast(ctx, result, self.dtype)


@translates(aten.scatter.src)
def scatter(ctx, self, dim, index, src):
    return _scatter(ctx, self, dim, index, src, "none")


@translates(aten.scatter.value, promote=Promote.RESULT, promoted=("value",))
def scatter_value(ctx, self, dim, index, value):
    src = with_shape(ctx.op.Expand(value, ctx.op.Shape(index)), index.shape)
    return _scatter(ctx, self, dim, index, src, "none")


# scatter's deprecated ``reduce=`` argument.
_SCATTER_REDUCE_ARGUMENTS = {"add": "add", "multiply": "mul"}


@translates(aten.scatter.reduce)
def scatter_with_reduce_argument(ctx, self, dim, index, src, *, reduce):
    return _scatter(ctx, self, dim, index, src, _SCATTER_REDUCE_ARGUMENTS[reduce])


@translates(aten.scatter.value_reduce, promote=Promote.RESULT, promoted=("value",))
def scatter_value_with_reduce_argument(ctx, self, dim, index, value, *, reduce):
    src = with_shape(ctx.op.Expand(value, ctx.op.Shape(index)), index.shape)
    return _scatter(ctx, self, dim, index, src, _SCATTER_REDUCE_ARGUMENTS[reduce])


@translates(aten.scatter_add.default)
def scatter_add(ctx, self, dim, index, src):
    return _scatter(ctx, self, dim, index, src, "add")


_REDUCTIONS = {"sum": "add", "mean": "add", "prod": "mul", "amax": "max", "amin": "min"}


@translates(aten.scatter_reduce.two, checker=lambda node: node.args[4] in _REDUCTIONS)
def scatter_reduce(ctx, self, dim, index, src, reduce, *, include_self=True):
    if include_self and reduce != "mean":
        return _scatter(ctx, self, dim, index, src, _REDUCTIONS[reduce])
    counts = _scatter_counts(ctx, self, dim, index)
    written = ctx.op.Greater(counts, ctx.constant(0, _INT64))
    if not include_self:
        # Written positions start from the reduction's identity, so self does not take part.
        self = with_shape(select(ctx, written, _identity(ctx, reduce, self.dtype), self), self.shape)
    result = _scatter(ctx, self, dim, index, src, _REDUCTIONS[reduce])
    if reduce != "mean":
        return result
    counts = ctx.op.Add(counts, ctx.constant(1, _INT64)) if include_self else ctx.op.Max(counts, ctx.constant(1, _INT64))
    return _divided(ctx, result, counts)


@translates(aten.index_reduce.default, checker=lambda node: node.args[4] in _REDUCTIONS)
def index_reduce(ctx, self, dim, index, source, reduce, *, include_self=True):
    # index_reduce is scatter_reduce with the 1-D index spread over source's other dims.
    dim = normalize_dim(dim, rank(self))
    along = [1] * rank(source)
    if along:
        along[dim] = -1
    spread = with_shape(ctx.op.Expand(ctx.op.Reshape(index, ints(ctx, along)), ctx.op.Shape(source)), source.shape)
    return scatter_reduce(ctx, self, dim, spread, source, reduce, include_self=include_self)


def _scatter_counts(ctx, self, dim, index) -> ir.Value:
    """How many index entries point at each position of ``self`` (int64)."""
    zeros = with_shape(ctx.op.Expand(ctx.constant(0, _INT64), ctx.op.Shape(self)), self.shape)
    ones = with_shape(ctx.op.Expand(ctx.constant(1, _INT64), ctx.op.Shape(index)), index.shape)
    return _scatter(ctx, zeros, dim, index, ones, "add")


def _identity(ctx, reduce: str, dtype: ir.DataType) -> ir.Value:
    if reduce in ("sum", "mean"):
        return ctx.constant(0, dtype)
    if reduce == "prod":
        return ctx.constant(1, dtype)
    torch_dtype = to_torch_dtype(dtype)
    if torch_dtype == torch.bool:
        return ctx.constant(reduce == "amin", dtype)
    if torch_dtype.is_floating_point:
        return ctx.constant(-math.inf if reduce == "amax" else math.inf, dtype)
    bounds = torch.iinfo(torch_dtype)
    return ctx.constant(bounds.min if reduce == "amax" else bounds.max, dtype)


def _divided(ctx, total: ir.Value, counts: ir.Value) -> ir.Value:
    """``total / counts`` as PyTorch's scatter mean divides: floored for integers."""
    counts = cast(ctx, counts, total.dtype)
    if to_torch_dtype(total.dtype).is_floating_point:
        return ctx.op.Div(total, counts)
    # Mod with fmod=0 takes the sign of the (positive) count, so the division below is exact.
    return ctx.op.Div(ctx.op.Sub(total, ctx.op.Mod(total, counts, fmod=0)), counts)


@translates(aten.slice_scatter.default)
def slice_scatter(ctx, self, src, dim=0, start=None, end=None, step=1):
    dim = normalize_dim(dim, rank(self))
    if start in (None, 0) and step == 1 and src.shape == self.shape:
        return cast(ctx, src, self.dtype)
    if _empty(self) or _empty(src):
        return ctx.op.Identity(self)  # nothing written; onnxruntime's ScatterElements rejects no updates
    first = _slice_start(ctx, self, dim, start)
    zero, one = ctx.constant(0, _INT64), ctx.constant(1, _INT64)
    offsets = ctx.op.Range(zero, scalar(ctx, size_of(ctx, src, dim), _INT64), one)
    positions = ctx.op.Add(first, ctx.op.Mul(offsets, scalar(ctx, step, _INT64)))
    along = [1] * rank(self)
    along[dim] = -1
    index = ctx.op.Expand(ctx.op.Reshape(positions, ints(ctx, along)), ctx.op.Shape(src))
    return ctx.op.ScatterElements(self, index, cast(ctx, src, self.dtype), axis=dim)


def _slice_start(ctx, self, dim: int, start) -> ir.Value:
    """The first position a slice starting at ``start`` reads, clamped like PyTorch's."""
    if start is None:
        start = 0
    if isinstance(start, ir.Value) or start >= 0:
        return scalar(ctx, start, _INT64)
    size = self.shape[dim]
    if isinstance(size, int):
        return ctx.constant(max(start + size, 0), _INT64)
    from_end = ctx.op.Add(ctx.sym_size(self, dim), ctx.constant(start, _INT64))
    return ctx.op.Max(from_end, ctx.constant(0, _INT64))


@translates(aten.select_scatter.default)
def select_scatter(ctx, self, src, dim, index):
    dim = normalize_dim(dim, rank(self))
    updates = ctx.op.Unsqueeze(cast(ctx, src, self.dtype), ints(ctx, [dim]))
    # ScatterElements counts negative positions from the end, as select does.
    positions = ctx.op.Expand(scalar(ctx, index, _INT64), ctx.op.Shape(updates))
    return ctx.op.ScatterElements(self, positions, updates, axis=dim)


@translates(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, self, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = normalize_dim(dim1, rank(self)), normalize_dim(dim2, rank(self))
    rest = [d for d in range(rank(self)) if d not in (dim1, dim2)]
    # With the two dims in front, ScatterND writes src's element i (a slice over the other dims)
    # at (i + first row, i + first column); src is as long as the diagonal.
    perm = [dim1, dim2] + rest
    moved = _transpose(ctx, self, perm)
    length = shape_of(ctx, src, -1)
    positions = ctx.op.Range(ctx.constant(0, _INT64), ctx.op.Squeeze(length, ints(ctx, [0])), ctx.constant(1, _INT64))
    positions = ctx.op.Unsqueeze(positions, ints(ctx, [1]))
    corner = ints(ctx, [max(-offset, 0), max(offset, 0)])
    updates = _transpose(ctx, cast(ctx, src, self.dtype), [rank(src) - 1] + list(range(rank(src) - 1)))
    written = ctx.op.ScatterND(moved, ctx.op.Add(positions, corner), updates)
    return _transpose(ctx, written, _inverse(perm))


@translates(aten.put.default)
def put(ctx, self, index, source, accumulate=False):
    flat = ctx.op.Reshape(self, ints(ctx, [-1]))
    # Mod with fmod=0 takes the sign of the (positive) element count: negative indices count
    # from the end.
    positions = ctx.op.Mod(cast(ctx, index, _INT64), ctx.op.Size(self), fmod=0)
    positions = ctx.op.Reshape(positions, ints(ctx, [-1, 1]))
    updates = ctx.op.Reshape(cast(ctx, source, self.dtype), ints(ctx, [-1]))
    written = _reduced(ctx, "ScatterND", flat, positions, updates, "add" if accumulate else "none")
    return reshape(ctx, written, ctx.op.Shape(self))


# -- moving elements --------------------------------------------------------------------------


# onnxruntime's Trilu has no 8- or 16-bit integer kernels.
_TRILU_STAND_INS = {ir.DataType.INT8: _INT32, ir.DataType.UINT8: _INT32, ir.DataType.INT16: _INT32}


@translates(aten.tril.default, min_opset=14)
def tril(ctx, self, diagonal=0):
    return computed_in(ctx, self, _TRILU_STAND_INS, lambda x: ctx.op.Trilu(x, scalar(ctx, diagonal, _INT64), upper=0))


@translates(aten.triu.default, min_opset=14)
def triu(ctx, self, diagonal=0):
    return computed_in(ctx, self, _TRILU_STAND_INS, lambda x: ctx.op.Trilu(x, scalar(ctx, diagonal, _INT64), upper=1))


# Trilu exists from opset 14; before it the kept triangle is a mask of column - row against the
# diagonal.


@translates(aten.tril.default)
def tril_masked(ctx, self, diagonal=0):
    return _triangle(ctx, self, diagonal, ctx.op.LessOrEqual)


@translates(aten.triu.default)
def triu_masked(ctx, self, diagonal=0):
    return _triangle(ctx, self, diagonal, ctx.op.GreaterOrEqual)


def _triangle(ctx, self, diagonal, keeps) -> ir.Value:
    zero, one = ctx.constant(0, _INT64), ctx.constant(1, _INT64)
    rows = ctx.op.Range(zero, ctx.sym_size(self, -2), one)
    columns = ctx.op.Range(zero, ctx.sym_size(self, -1), one)
    offsets = ctx.op.Sub(ctx.op.Unsqueeze(columns, ints(ctx, [0])), ctx.op.Unsqueeze(rows, ints(ctx, [1])))
    kept = keeps(offsets, scalar(ctx, diagonal, _INT64))
    return select(ctx, kept, self, ctx.constant(0, self.dtype))


@translates(aten.repeat.default)
def repeat(ctx, self, repeats):
    extra = len(repeats) - rank(self)
    if extra:
        self = ctx.op.Unsqueeze(self, ints(ctx, range(extra)))
    return ctx.op.Tile(self, shape_tensor(ctx, repeats))


@translates(aten.roll.default)
def roll(ctx, self, shifts, dims=()):
    if not dims:
        # Without dims, roll shifts the flattened tensor.
        numel = ctx.out.numel()
        size = numel if isinstance(numel, int) else ctx.op.Size(self)
        flat = _roll(ctx, ctx.op.Reshape(self, ints(ctx, [-1])), shifts[0], 0, size)
        return reshape(ctx, flat, ctx.op.Shape(self))
    rolled = self
    for shift, dim in zip(shifts, dims):
        dim = normalize_dim(dim, rank(self))
        rolled = _roll(ctx, rolled, shift, dim, size_of(ctx, self, dim))
    return rolled


def _roll(ctx, x, shift, dim: int, size) -> ir.Value:
    if isinstance(shift, int) and isinstance(size, int):
        if size == 0 or shift % size == 0:
            return x
        split = ints(ctx, [size - shift % size])
    else:
        # An empty dim rolls to itself; Max keeps Mod from dividing by its zero size.
        size = ctx.op.Max(scalar(ctx, size, _INT64), ctx.constant(1, _INT64))
        split = shape_tensor(ctx, [ctx.op.Sub(size, ctx.op.Mod(scalar(ctx, shift, _INT64), size))])
    axis = ints(ctx, [dim])
    tail = ctx.op.Slice(x, split, ints(ctx, [2**63 - 1]), axis)
    head = ctx.op.Slice(x, ints(ctx, [0]), split, axis)
    return ctx.op.Concat(tail, head, axis=dim)


@translates(aten.flip.default)
def flip(ctx, self, dims):
    dims = [normalize_dim(d, rank(self)) for d in dims]
    if not dims:
        return self
    count = len(dims)
    # Stepping back from the last element to before the first reverses each dim.
    starts, ends = ints(ctx, [-1] * count), ints(ctx, [-(2**63)] * count)
    return ctx.op.Slice(self, starts, ends, ints(ctx, dims), ints(ctx, [-1] * count))


@translates(aten.diagonal.default)
def diagonal(ctx, self, offset=0, dim1=0, dim2=1):
    dim1, dim2 = normalize_dim(dim1, rank(self)), normalize_dim(dim2, rank(self))
    rest = [d for d in range(rank(self)) if d not in (dim1, dim2)]
    x = _transpose(ctx, self, rest + [dim1, dim2])
    # Cut the matrices so that the wanted diagonal starts at [0, 0]; it is then as long as the
    # shorter side, and GatherElements picks column i of row i.
    if offset:
        axis = -1 if offset > 0 else -2
        x = ctx.op.Slice(x, ints(ctx, [abs(offset)]), ints(ctx, [2**63 - 1]), ints(ctx, [axis]))
    rows, columns = shape_of(ctx, x, -2, -1), shape_of(ctx, x, -1)
    length = ctx.op.Min(rows, columns)
    x = ctx.op.Slice(x, ints(ctx, [0]), length, ints(ctx, [-2]))
    positions = ctx.op.Range(ctx.constant(0, _INT64), ctx.op.Squeeze(length, ints(ctx, [0])), ctx.constant(1, _INT64))
    positions = ctx.op.Unsqueeze(positions, ints(ctx, [1]))
    along = ctx.op.Concat(shape_of(ctx, x, end=-1), ints(ctx, [1]), axis=0)
    picked = ctx.op.GatherElements(x, ctx.op.Expand(positions, along), axis=-1)
    return ctx.op.Squeeze(picked, ints(ctx, [-1]))
