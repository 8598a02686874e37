"""The unique family: results whose length is the number of distinct values, known only at run
time (an unbacked SymInt in the FX graph, a symbolic dim in ONNX)."""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import bfloat16_to_float, cast, ints
from dynexport.registry import translates

aten = torch.ops.aten

_INT64 = ir.DataType.INT64


@translates(aten._unique2.default)
def unique(ctx, self, sorted=True, return_inverse=False, return_counts=False):
    # PyTorch's CPU kernel sorts whether or not it is asked to; ONNX's unsorted order would be
    # first occurrence instead. Unique and Compress take no bfloat16.
    flat = ctx.op.Reshape(bfloat16_to_float(ctx, self), ints(ctx, [-1]))
    values, _, inverse, counts = ctx.op.Unique(flat, sorted=1, _outputs=4)
    inverse = ctx.op.Reshape(inverse, ctx.op.Shape(self))
    return [cast(ctx, values, self.dtype), inverse if return_inverse else None, counts if return_counts else None]



@translates(aten.unique_dim.default)
def unique_dim(ctx, self, dim, sorted=True, return_inverse=False, return_counts=False):
    values, _, inverse, counts = ctx.op.Unique(bfloat16_to_float(ctx, self), axis=dim, sorted=1, _outputs=4)
    return [cast(ctx, values, self.dtype), inverse if return_inverse else None, counts if return_counts else None]


@translates(aten.unique_consecutive.default, checker=lambda node: len(node.args) < 4 and "dim" not in node.kwargs)
def unique_consecutive(ctx, self, return_inverse=False, return_counts=False, dim=None):
    flat = ctx.op.Reshape(bfloat16_to_float(ctx, self), ints(ctx, [-1]))
    length = ctx.op.Shape(flat)
    changed = ctx.op.Not(
        ctx.op.Equal(ctx.op.Slice(flat, ints(ctx, [1]), length), ctx.op.Slice(flat, ints(ctx, [0]), ints(ctx, [-1])))
    )
    # The first element starts a run; Slice keeps an empty input empty.
    starts = ctx.op.Slice(ctx.op.Concat(ctx.constant([True], ir.DataType.BOOL), changed, axis=0), ints(ctx, [0]), length)
    values = ctx.op.Compress(flat, starts, axis=0)
    inverse = ctx.op.Sub(ctx.op.CumSum(cast(ctx, starts, _INT64), ctx.constant(0, _INT64)), ctx.constant(1, _INT64))
    first_positions = ctx.op.Reshape(ctx.op.NonZero(starts), ints(ctx, [-1]))
    ends = ctx.op.Concat(ctx.op.Slice(first_positions, ints(ctx, [1]), length), length, axis=0)
    counts = ctx.op.Sub(ends, first_positions)
    return [
        cast(ctx, values, self.dtype),
        ctx.op.Reshape(inverse, ctx.op.Shape(self)) if return_inverse else None,
        counts if return_counts else None,
    ]
