"""``nn.Embedding(max_norm=...)``'s renormalization: ``aten.embedding_renorm`` (the functional
form of ``embedding_renorm_``), which scales each row of the weight that the indices look up and
whose ``norm_type``-norm exceeds ``max_norm`` by ``max_norm / (norm + 1e-7)``.

Every row's norm is computed and the looked-up rows are found by comparing each row number with
every index (a row may be looked up several times; a scatter of duplicate indices is undefined
in ONNX), then the weight is multiplied by one scale per row.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import cast, ints, reduce, scalar_like, shape_tensor
from dynexport.registry import translates

aten = torch.ops.aten

_INT64 = ir.DataType.INT64
_FLOAT = ir.DataType.FLOAT
# PyTorch's kernel adds this to the norm before dividing.
_EPSILON = 1e-7


def _row_norms(ctx, weight: ir.Value, norm_type: float) -> ir.Value:
    """Each row's ``norm_type``-norm, as a column."""
    if norm_type == 2:
        return reduce(ctx, "ReduceL2", weight, [1])
    if norm_type == 1:
        return reduce(ctx, "ReduceL1", weight, [1])
    if norm_type == float("inf"):
        return reduce(ctx, "ReduceMax", ctx.op.Abs(weight), [1])
    p = scalar_like(ctx, norm_type, weight)
    powered = reduce(ctx, "ReduceSum", ctx.op.Pow(ctx.op.Abs(weight), p), [1])
    return ctx.op.Pow(powered, ctx.op.Reciprocal(p))


def _looked_up(ctx, weight: ir.Value, indices: ir.Value) -> ir.Value:
    """A boolean column: whether each row's number is among ``indices``."""
    rows = ctx.op.Gather(ctx.op.Shape(weight), ctx.constant(0, _INT64))
    numbers = ctx.op.Unsqueeze(ctx.op.Range(ctx.constant(0, _INT64), rows, ctx.constant(1, _INT64)), ints(ctx, [1]))
    every_index = ctx.op.Reshape(cast(ctx, indices, _INT64), shape_tensor(ctx, [1, -1]))
    hits = cast(ctx, ctx.op.Equal(numbers, every_index), _FLOAT)
    # ReduceMax of an empty row is its identity (-inf for float): no index, no hit.
    return ctx.op.Greater(reduce(ctx, "ReduceMax", hits, [1]), ctx.constant(0.0, _FLOAT))


@translates(aten.embedding_renorm.default)
def embedding_renorm(ctx, self, indices, max_norm, norm_type):
    norms = _row_norms(ctx, self, norm_type)
    limit = scalar_like(ctx, max_norm, self)
    shrunk = ctx.op.Div(limit, ctx.op.Add(norms, scalar_like(ctx, _EPSILON, self)))
    too_long = ctx.op.And(_looked_up(ctx, self, indices), ctx.op.Greater(norms, limit))
    return ctx.op.Mul(self, ctx.op.Where(too_long, shrunk, scalar_like(ctx, 1.0, self)))
