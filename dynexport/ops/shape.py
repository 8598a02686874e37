"""Views, reshapes, joins and splits; copies and casts that move no data in ONNX."""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx_ir as ir
import sympy
import torch

from dynexport.builder import OperatorNotInOpset
from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import (
    cast,
    ints,
    normalize_dim,
    rank,
    shape_tensor,
    size_of,
    size_of_dims,
    split_equally,
)
from dynexport.ops._helpers import reshape as onnx_reshape
from dynexport.registry import translates

aten = torch.ops.aten
prims = torch.ops.prims


def _static_out_shape(ctx) -> list[int] | None:
    shape = ctx.out.shape
    if all(isinstance(d, int) for d in shape):
        return list(shape)
    return None


@translates(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def reshape(ctx, self, size):
    static = _static_out_shape(ctx)
    # PyTorch never means "copy this dim" by 0, so sizes of 0 are taken literally.
    return onnx_reshape(ctx, self, static if static is not None else size)


@translates(aten.permute.default)
def permute(ctx, self, dims):
    perm = [normalize_dim(d, rank(self)) for d in dims]
    if perm == sorted(perm):
        return self
    return ctx.op.Transpose(self, perm=perm)


@translates(aten.transpose.int)
def transpose(ctx, self, dim0, dim1):
    r = rank(self)
    if r < 2:
        return self
    dim0, dim1 = normalize_dim(dim0, r), normalize_dim(dim1, r)
    if dim0 == dim1:
        return self
    perm = list(range(r))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return ctx.op.Transpose(self, perm=perm)


@translates(aten.t.default)
def t(ctx, self):
    return transpose(ctx, self, 0, 1)


@translates(aten.numpy_T.default)
def numpy_t(ctx, self):
    return permute(ctx, self, list(reversed(range(rank(self)))))


@translates(aten.expand.default)
def expand(ctx, self, size, *, implicit=False):
    # -1 keeps the input's size; Expand's broadcasting does the same with 1.
    sizes = [1 if isinstance(s, int) and s == -1 else s for s in size]
    return ctx.op.Expand(self, shape_tensor(ctx, sizes))


@translates(aten.expand_as.default)
def expand_as(ctx, self, other):
    return ctx.op.Expand(self, ctx.op.Shape(other))


@translates(aten.unsqueeze.default)
def unsqueeze(ctx, self, dim):
    dim = normalize_dim(dim, rank(self) + 1)
    return ctx.op.Unsqueeze(self, ints(ctx, [dim]))


@translates(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(ctx, self, dim=None):
    r = rank(self)
    candidates = range(r) if dim is None else [normalize_dim(d, r) for d in ([dim] if isinstance(dim, int) else dim)]
    _refuse_rank_decided_at_run_time(ctx, self, candidates)
    # Only dims of size 1 go; the output's rank says how many torch removed.
    removed = [d for d in candidates if self.shape[d] == 1]
    if r - len(removed) != ctx.out_rank:
        symbolic = [d for d in candidates if not isinstance(self.shape[d], int)]
        removed = sorted(removed + symbolic[: r - ctx.out_rank - len(removed)])
    if not removed:
        return self
    return ctx.op.Squeeze(self, ints(ctx, removed))


def _refuse_rank_decided_at_run_time(ctx, self, candidates) -> None:
    """Squeeze removes a dim only when its size is 1, so a dynamic dim that may be 1 decides the
    result's rank, which an ONNX graph cannot leave to run time. (An example size of 1 on such a
    dim is captured size-obliviously: torch assumes the dim is not 1.)"""
    sizes = ctx.node.args[0].meta["val"].shape
    for d in candidates:
        size = sizes[d]
        if isinstance(size, torch.SymInt) and 1 in size.node.shape_env.bound_sympy(size.node.expr):
            name = self.shape[d].value if isinstance(self.shape[d], ir.SymbolicDim) else str(size)
            raise TranslationError(
                str(ctx.node.target),
                source_line(ctx.node),
                f"dim {d} of the input is dynamic ({name}) and may be 1, so whether squeeze removes it, "
                "and the rank of the result, is decided only at run time",
                f"export with an example size >= 2 for {name}, make that dim static, or squeeze only "
                "the dims that are always 1",
            )


@translates(aten.flatten.using_ints)
def flatten(ctx, self, start_dim=0, end_dim=-1):
    r = rank(self)
    if r == 0:
        return ctx.op.Reshape(self, ints(ctx, [1]))
    start, end = normalize_dim(start_dim, r), normalize_dim(end_dim, r)
    if start == end:
        return self
    static = _static_out_shape(ctx)
    if static is not None:
        return onnx_reshape(ctx, self, static)
    merged = size_of_dims(ctx, self, start, end + 1)
    sizes = [size_of(ctx, self, d) for d in range(start)] + [merged] + [size_of(ctx, self, d) for d in range(end + 1, r)]
    return onnx_reshape(ctx, self, sizes)


@translates(aten.slice.Tensor)
def slice(ctx, self, dim=0, start=None, end=None, step=1):
    dim = normalize_dim(dim, rank(self))
    start = 0 if start is None else start
    end = 2**63 - 1 if end is None else end
    if isinstance(start, int) and start == 0 and step == 1 and isinstance(end, int):
        size = self.shape[dim]
        if end >= 2**63 - 1 or (isinstance(size, int) and end >= size):
            return self
    return ctx.op.Slice(
        self, shape_tensor(ctx, [start]), shape_tensor(ctx, [end]), ints(ctx, [dim]), ints(ctx, [step])
    )


@translates(aten.narrow.default)
def narrow(ctx, self, dim, start, length):
    end = length + start if isinstance(start, int) and isinstance(length, int) else ctx.op.Add(
        cast(ctx, start if isinstance(start, ir.Value) else ctx.constant(start, ir.DataType.INT64), ir.DataType.INT64),
        length if isinstance(length, ir.Value) else ctx.constant(length, ir.DataType.INT64),
    )
    return slice(ctx, self, dim, start, end, 1)


@translates(aten.select.int)
def select(ctx, self, dim, index):
    dim = normalize_dim(dim, rank(self))
    index = index if isinstance(index, ir.Value) else ctx.constant(index, ir.DataType.INT64)
    return ctx.op.Gather(self, index, axis=dim)


def _refuse_strides_over_a_view(ctx) -> None:
    """as_strided addresses its input's storage: that is the input's elements in order only
    when the input is contiguous from the storage's start (not a transpose, slice or expand)."""
    val = ctx.node.args[0].meta["val"]
    if val.is_contiguous() and val.storage_offset() == 0:
        return
    raise TranslationError(
        str(ctx.node.target),
        source_line(ctx.node),
        f"the input is a view (strides {tuple(val.stride())}, storage offset {val.storage_offset()}) and "
        "as_strided reads the storage under it, which ONNX tensors do not have",
        "call .contiguous() on the tensor before as_strided, or express the view with slicing, "
        "unfold, expand or reshape",
    )


def _strided_positions(ctx, size, stride, storage_offset) -> ir.Value:
    """The storage position ``offset + sum(i[d] * stride[d])`` of each element ``i`` of an
    as_strided view, as an int64 tensor of shape ``size`` ([1] for a 0-d view)."""
    positions = shape_tensor(ctx, [0 if storage_offset is None else storage_offset])
    for d, (extent, step) in enumerate(zip(size, stride)):
        along = ctx.op.Range(
            ctx.constant(0, ir.DataType.INT64), _int64(ctx, extent), ctx.constant(1, ir.DataType.INT64)
        )
        along = ctx.op.Mul(along, _int64(ctx, step))
        positions = ctx.op.Add(ctx.op.Unsqueeze(positions, ints(ctx, [-1])) if d else positions, along)
    return positions


@translates(aten.as_strided.default)
def as_strided(ctx, self, size, stride, storage_offset=None):
    """Element ``i`` of the result is element ``offset + sum(i[d] * stride[d])`` of the input
    taken in order: a Gather from the flattened input at indices built by broadcasting."""
    _refuse_strides_over_a_view(ctx)
    positions = _strided_positions(ctx, size, stride, storage_offset)
    flat = onnx_reshape(ctx, self, ints(ctx, [-1]))
    if not size:
        return ctx.op.Gather(flat, ctx.op.Squeeze(positions, ints(ctx, [0])), axis=0)
    return ctx.op.Gather(flat, positions, axis=0)


def _never_overlaps(size, stride) -> bool:
    """Whether no two elements of a view with these (static) sizes and strides share a position."""
    if not all(isinstance(n, int) for n in (*size, *stride)):
        return False
    positions = {0}
    for extent, step in zip(size, stride):
        positions = {p + i * step for p in positions for i in range(extent)}
    return len(positions) == math.prod(size)


@translates(aten.as_strided_scatter.default, prims.as_strided_scatter.default)
def as_strided_scatter(ctx, self, src, size, stride, storage_offset=None):
    """``self`` with ``src`` written at its as_strided positions. Where positions repeat (a stride
    of 0, overlapping windows), eager's copy writes in order and the last write stays: each
    position takes the update of the highest index that names it (ScatterElements max of the
    indices, opset 18), as ScatterND leaves repeated indices undefined."""
    _refuse_strides_over_a_view(ctx)
    flat = onnx_reshape(ctx, self, ints(ctx, [-1]))
    positions = onnx_reshape(ctx, _strided_positions(ctx, size, stride, storage_offset), ints(ctx, [-1]))
    updates = onnx_reshape(ctx, src, ints(ctx, [-1]))
    if _never_overlaps(size, stride):
        written = ctx.op.ScatterND(flat, ctx.op.Unsqueeze(positions, ints(ctx, [-1])), updates)
    else:
        if ctx.opset < 18:
            raise OperatorNotInOpset("ScatterElements", ctx.opset, 18, "reduction 'max'")
        count = ctx.op.Shape(positions)
        order = ctx.op.Range(
            ctx.constant(0, ir.DataType.INT64), ctx.op.Squeeze(count, ints(ctx, [0])), ctx.constant(1, ir.DataType.INT64)
        )
        nobody = ctx.op.Expand(ctx.constant(-1, ir.DataType.INT64), ctx.op.Shape(flat))
        writer = ctx.op.ScatterElements(nobody, positions, order, axis=0, reduction="max")
        last_update = ctx.op.Gather(updates, ctx.op.Max(writer, ctx.constant(0, ir.DataType.INT64)), axis=0)
        written = ctx.op.Where(ctx.op.GreaterOrEqual(writer, ctx.constant(0, ir.DataType.INT64)), last_update, flat)
    return onnx_reshape(ctx, written, ctx.op.Shape(self))


def _int64(ctx, value: int | ir.Value) -> ir.Value:
    """A 0-d int64 scalar from an int or a SymInt's scalar."""
    if isinstance(value, ir.Value):
        return cast(ctx, value, ir.DataType.INT64)
    return ctx.constant(int(value), ir.DataType.INT64)


@translates(aten.cat.default, aten.concat.default)
def cat(ctx, tensors, dim=0):
    out_rank = ctx.out_rank
    # torch.cat skips 1-D empty tensors whatever the other inputs' rank (a legacy rule).
    kept = [t for t in tensors if not (rank(t) == 1 and t.shape[0] == 0 and out_rank != 1)]
    kept = [cast(ctx, t, ctx.out_dtype) for t in kept]
    if len(kept) == 1:
        return kept[0]
    return ctx.op.Concat(*kept, axis=normalize_dim(dim, out_rank))


@translates(aten.stack.default)
def stack(ctx, tensors, dim=0):
    dim = normalize_dim(dim, ctx.out_rank)
    axis = ints(ctx, [dim])
    unsqueezed = [ctx.op.Unsqueeze(cast(ctx, t, ctx.out_dtype), axis) for t in tensors]
    return unsqueezed[0] if len(unsqueezed) == 1 else ctx.op.Concat(*unsqueezed, axis=dim)


def _same_size_at_every_size(ctx, dim: int) -> bool:
    """Whether the ``count`` outputs of a split are equal along ``dim`` at every input size: each
    piece's size is one expression, ``count`` times which is the input's (``2 * batch`` in 2)."""
    sizes = [out.shape[dim] for out in ctx.out]
    whole = ctx.node.args[0].meta["val"].shape[dim]
    if not all(isinstance(s, torch.SymInt) for s in (*sizes, whole)) or len({s.node.expr for s in sizes}) != 1:
        return False
    return sympy.expand(whole.node.expr - len(sizes) * sizes[0].node.expr) == 0


def _equal_pieces(ctx, self, dim: int, piece: int | ir.Value, count: int) -> ir.Value:
    """The sizes along ``dim`` of torch.split's ``count`` pieces: ``piece`` each, the last what
    is left. Computed from the run-time size: the metadata's sizes hold only at the example."""
    sizes = [out.shape[dim] for out in ctx.out]
    if all(isinstance(s, int) for s in sizes):
        return ints(ctx, sizes)
    piece = shape_tensor(ctx, [piece])
    head = ctx.op.Expand(piece, ints(ctx, [count - 1]))
    rest = ctx.op.Sub(shape_tensor(ctx, [size_of(ctx, self, dim)]), ctx.op.Mul(piece, ints(ctx, [count - 1])))
    # Where eager returns another number of pieces (the last would be empty, or larger than the
    # others), a size of -1 makes Split fail rather than return pieces eager does not. (Pieces of
    # size 0 are chunk's of an empty dim: all empty.)
    zero = ints(ctx, [0])
    nonempty_or_all_empty = ctx.op.Or(ctx.op.Greater(rest, zero), ctx.op.Equal(piece, zero))
    fits = ctx.op.And(nonempty_or_all_empty, ctx.op.LessOrEqual(rest, piece))
    rest = ctx.op.Where(fits, rest, ints(ctx, [-1]))
    return ctx.op.Concat(head, rest, axis=0)


def _refuse_count_decided_at_run_time(ctx, self, dim: int, count_at: Callable[[int], int], per: str) -> None:
    """An ONNX node has a fixed number of outputs: a dynamic dim whose size changes how many
    pieces the op returns cannot stay dynamic. (torch.export records that count at the example.)"""
    size = ctx.node.args[0].meta["val"].shape[dim]
    if not isinstance(size, torch.SymInt):
        return
    bounds = size.node.shape_env.bound_sympy(size.node.expr)
    if math.isfinite(float(bounds.upper)) and count_at(int(bounds.lower)) == count_at(int(bounds.upper)):
        return
    name = self.shape[dim].value if isinstance(self.shape[dim], ir.SymbolicDim) else str(size)
    raise TranslationError(
        str(ctx.node.target),
        source_line(ctx.node),
        f"dim {dim} of the input is dynamic ({name}) and the op returns one output per {per} of it, "
        f"so the number of outputs ({len(ctx.out)} at the example) is decided only at run time",
        f"make {name} static, or split it into a fixed number of pieces (torch.chunk, a list of sizes)",
    )


@translates(aten.split.Tensor, aten.split_with_sizes.default)
def split(ctx, self, split_size, dim=0):
    dim = normalize_dim(dim, rank(self))
    if isinstance(split_size, int):
        _refuse_count_decided_at_run_time(ctx, self, dim, lambda n: max(1, -(-n // split_size)), f"{split_size} elements")
    count = len(ctx.out)
    if count == 1:
        return [self]
    if _same_size_at_every_size(ctx, dim):
        return split_equally(ctx, self, dim, count)
    if isinstance(split_size, (list, tuple)):
        sizes = shape_tensor(ctx, split_size)
    else:
        sizes = _equal_pieces(ctx, self, dim, split_size, count)
    return list(ctx.op.Split(self, sizes, axis=dim, _outputs=count))


def _chunk_count(size: int, chunks: int) -> int:
    # An empty dim splits into `chunks` empty pieces.
    return chunks if size == 0 else -(-size // -(-size // chunks))


@translates(aten.chunk.default)
def chunk(ctx, self, chunks, dim=0):
    dim = normalize_dim(dim, rank(self))
    count = len(ctx.out)
    if count == 1:
        _refuse_count_decided_at_run_time(ctx, self, dim, lambda n: _chunk_count(n, chunks), f"ceil(size / {chunks}) elements")
        return [self]
    if _same_size_at_every_size(ctx, dim):
        return split_equally(ctx, self, dim, count)
    # torch.chunk splits into pieces of ceil(size / chunks).
    size = size_of(ctx, self, dim)
    if isinstance(size, int):
        piece = -(-size // chunks)
    else:
        piece = ctx.op.Div(ctx.op.Add(size, ctx.constant(chunks - 1, ir.DataType.INT64)), ctx.constant(chunks, ir.DataType.INT64))
    return list(ctx.op.Split(self, _equal_pieces(ctx, self, dim, piece, count), axis=dim, _outputs=count))


@translates(aten.unbind.int)
def unbind(ctx, self, dim=0):
    dim = normalize_dim(dim, rank(self))
    _refuse_count_decided_at_run_time(ctx, self, dim, lambda n: n, "element")
    count = len(ctx.out)
    axis = ints(ctx, [dim])
    if count == 1:
        return [ctx.op.Squeeze(self, axis)]
    pieces = ctx.op.Split(self, ints(ctx, [1] * count), axis=dim, _outputs=count)
    return [ctx.op.Squeeze(piece, axis) for piece in pieces]


# -- copies and casts ---------------------------------------------------------------------


@translates(
    aten.clone.default,
    aten.alias.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
    aten.contiguous.default,
)
def clone(ctx, self, *, memory_format=None):
    return self


@translates(
    aten._to_copy.default,
    torch.ops.prims.convert_element_type.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.to.device,
    aten.to.other,
    aten.type_as.default,
)
def to(ctx, self, *args, **kwargs):
    return cast(ctx, self, ctx.out_dtype)


@translates(aten.copy.default)
def copy(ctx, self, src, non_blocking=False):
    return ctx.op.Expand(cast(ctx, src, self.dtype), ctx.op.Shape(self))


@translates(aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default,
            checker=lambda node: not node.args[2])
def dropout(ctx, input, p, train):
    return input


@translates(aten.native_dropout.default, checker=lambda node: node.args[2] is False)
def native_dropout(ctx, input, p, train):
    mask = ctx.op.Expand(ctx.constant(True, ir.DataType.BOOL), ctx.op.Shape(input))
    return input, mask
