"""The unique family: results whose length is the number of distinct values, known only at run
time (an unbacked SymInt in the FX graph, a symbolic dim in ONNX)."""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import bfloat16_to_float, cast, ints, normalize_dim, rank, reduce, reshape, shape_of
from dynexport.registry import translates

aten = torch.ops.aten

_INT64 = ir.DataType.INT64


# onnxruntime's Unique takes float, double, int8, int64 and string: other integer types and bools
# compute in int64, bfloat16 in float (both exact).
_UNIQUE_STAND_INS = {
    ir.DataType.BOOL: _INT64,
    ir.DataType.UINT8: _INT64,
    ir.DataType.INT16: _INT64,
    ir.DataType.INT32: _INT64,
    ir.DataType.BFLOAT16: ir.DataType.FLOAT,
}


def _unique_input(ctx, x: ir.Value) -> ir.Value:
    return cast(ctx, x, _UNIQUE_STAND_INS.get(x.dtype, x.dtype))


@translates(aten._unique2.default)
def unique(ctx, self, sorted=True, return_inverse=False, return_counts=False):
    # PyTorch's CPU kernel sorts whether or not it is asked to; ONNX's unsorted order would be
    # first occurrence instead.
    flat = ctx.op.Reshape(_unique_input(ctx, self), ints(ctx, [-1]))
    values, _, inverse, counts = ctx.op.Unique(flat, sorted=1, _outputs=4)
    inverse = reshape(ctx, inverse, ctx.op.Shape(self))
    return [cast(ctx, values, self.dtype), inverse if return_inverse else None, counts if return_counts else None]


@translates(aten.unique_dim.default)
def unique_dim(ctx, self, dim, sorted=True, return_inverse=False, return_counts=False):
    values, _, inverse, counts = ctx.op.Unique(_unique_input(ctx, self), axis=dim, sorted=1, _outputs=4)
    return [cast(ctx, values, self.dtype), inverse if return_inverse else None, counts if return_counts else None]


@translates(aten.unique_consecutive.default)
def unique_consecutive(ctx, self, return_inverse=False, return_counts=False, dim=None):
    # Along a dim, slices are compared whole; without one, the flattened elements.
    if dim is not None and dim < 0:
        raise TranslationError(
            "aten.unique_consecutive.default",
            source_line(ctx.node),
            f"torch's shape function gives unique_consecutive(dim={dim}) a wrong output rank "
            f"({len(ctx.out[0].shape)} for a rank-{rank(self)} input), so the captured graph is wrong from there on",
            f"pass the dim counted from the front: dim={dim + rank(self)}",
        )
    x = bfloat16_to_float(ctx, self)
    if dim is None:
        x = ctx.op.Reshape(x, ints(ctx, [-1]))
        axis = 0
    else:
        axis = normalize_dim(dim, rank(self))
    length = shape_of(ctx, x, axis, axis + 1)
    differs = ctx.op.Not(
        ctx.op.Equal(
            ctx.op.Slice(x, ints(ctx, [1]), length, ints(ctx, [axis])),
            ctx.op.Slice(x, ints(ctx, [0]), ints(ctx, [-1]), ints(ctx, [axis])),
        )
    )
    others = [d for d in range(1 if dim is None else rank(self)) if d != axis]
    changed = reduce(ctx, "ReduceMax", cast(ctx, differs, _INT64), others, keepdims=False) if others else differs
    changed = cast(ctx, changed, ir.DataType.BOOL)
    # The first slice starts a run; Slice keeps an empty input empty.
    starts = ctx.op.Slice(ctx.op.Concat(ctx.constant([True], ir.DataType.BOOL), changed, axis=0), ints(ctx, [0]), length)
    values = ctx.op.Compress(x, starts, axis=axis)
    inverse = ctx.op.Sub(ctx.op.CumSum(cast(ctx, starts, _INT64), ctx.constant(0, _INT64)), ctx.constant(1, _INT64))
    first_positions = ctx.op.Reshape(ctx.op.NonZero(starts), ints(ctx, [-1]))
    ends = ctx.op.Concat(ctx.op.Slice(first_positions, ints(ctx, [1]), length), length, axis=0)
    counts = ctx.op.Sub(ends, first_positions)
    if dim is None:
        inverse = reshape(ctx, inverse, ctx.op.Shape(self))
    return [cast(ctx, values, self.dtype), inverse if return_inverse else None, counts if return_counts else None]
