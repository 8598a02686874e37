"""Scaled dot-product attention: ONNX's Attention op from opset 23, composed from MatMul and
Softmax before it and wherever Attention cannot express the call; dynexport's whole attention op
(a cache update and grouped-query heads with it, see passes/fx/fuse_llm.py) as one Attention."""

from __future__ import annotations

import math

import onnx_ir as ir
import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from dynexport.ops._helpers import (
    argument,
    bfloat16_as_float,
    cast,
    ints,
    rank,
    reduce,
    reshape,
    scalar,
    shape_of,
    shape_tensor,
    size_of,
)
from dynexport.passes.fx import llm_ops  # noqa: F401  (defines the dynexport:: ops)
from dynexport.registry import translates

aten = torch.ops.aten
fused_ops = torch.ops.dynexport


def _without_dropout(node: torch.fx.Node) -> bool:
    return argument(node, "dropout_p") == 0


def _fits_attention_op(node: torch.fx.Node) -> bool:
    # Attention takes (batch, heads, sequence, head size) tensors with one batch dim and, unless
    # grouped, equal head counts; PyTorch also broadcasts any number of batch dims.
    query, key, value = (node.args[i].meta["val"] for i in range(3))
    if not (_without_dropout(node) and query.dim() == key.dim() == value.dim() == 4):
        return False
    same_batch = statically_known_true(query.shape[0] == key.shape[0]) and statically_known_true(
        key.shape[0] == value.shape[0]
    )
    same_heads = statically_known_true(query.shape[1] == key.shape[1])
    return same_batch and (same_heads or argument(node, "enable_gqa"))


@translates(aten.scaled_dot_product_attention.default, min_opset=23, checker=_fits_attention_op)
def scaled_dot_product_attention_23(
    ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    inputs = [query, key, value, attention_mask_input(ctx, attn_mask, query, key)]
    attributes = {} if scale is None else {"scale": float(scale)}
    return ctx.op.Attention(*inputs, is_causal=int(is_causal), **attributes)


@translates(fused_ops.attention.default, min_opset=23)
def attention(ctx, query, key, value, attn_mask, past_key, past_value, scale, is_causal):
    attributes = {} if scale is None else {"scale": float(scale)}
    if past_key is None:
        output = ctx.op.Attention(query, key, value, attention_mask_input(ctx, attn_mask, query, key), is_causal=int(is_causal), **attributes)
        return output, key, value
    mask = attention_mask_input(ctx, attn_mask, query, key, total_keys(ctx, past_key, key))
    return tuple(ctx.op.Attention(query, key, value, mask, past_key, past_value, is_causal=int(is_causal), _outputs=3, **attributes))


def total_keys(ctx, past_key, key) -> int | ir.Value:
    """How many keys the past and the new ones make together."""
    past, new = size_of(ctx, past_key, -2), size_of(ctx, key, -2)
    if isinstance(past, int) and isinstance(new, int):
        return past + new
    past, new = (ctx.constant(size, ir.DataType.INT64) if isinstance(size, int) else size for size in (past, new))
    return ctx.op.Add(past, new)


def attention_mask_input(ctx, attn_mask, query, key, keys=None) -> ir.Value | None:
    """``attn_mask`` as Attention takes it: boolean or in the query's dtype, (query sequence,
    ``keys``) in its last two dims (``keys``: the key sequence's length by default)."""
    if attn_mask is None:
        return None
    if attn_mask.dtype != ir.DataType.BOOL:
        attn_mask = cast(ctx, attn_mask, query.dtype)
    if keys is None and list(attn_mask.shape)[-2:] == [query.shape[-2], key.shape[-2]]:
        return attn_mask
    # onnxruntime rejects masks that broadcast along either sequence dim.
    sequences = shape_tensor(ctx, [size_of(ctx, query, -2), size_of(ctx, key, -2) if keys is None else keys])
    return ctx.op.Expand(attn_mask, sequences)


@translates(aten.scaled_dot_product_attention.default, checker=_without_dropout)
@bfloat16_as_float
def scaled_dot_product_attention(
    ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    scores = _scores(ctx, query, key, attn_mask, is_causal, scale, enable_gqa)
    if enable_gqa:
        value = _repeat_heads(ctx, value, query)
    return _attend(ctx, scores, value, masked=attn_mask is not None)


@translates(aten._scaled_dot_product_flash_attention_for_cpu.default, checker=_without_dropout)
def scaled_dot_product_flash_attention_for_cpu(
    ctx, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
    # The kernel reads grouped key-value heads as SDPA's enable_gqa does (what that call decomposes to).
    scores = _scores(ctx, query, key, attn_mask, is_causal, scale, enable_gqa=True)
    logsumexp = reduce(ctx, "ReduceLogSumExp", scores, [-1], keepdims=False)
    attended = _attend(ctx, scores, _repeat_heads(ctx, value, query), masked=attn_mask is not None)
    return attended, cast(ctx, logsumexp, ir.DataType.FLOAT)


def _scores(ctx, query, key, attn_mask, is_causal: bool, scale, enable_gqa: bool = False):
    """Scaled query @ key^T with the causal or the given mask applied."""
    if scale is None:
        head_size = query.shape[-1]
        if isinstance(head_size, int):
            scale = ctx.constant(1 / math.sqrt(head_size), query.dtype)
        else:
            scale = ctx.op.Reciprocal(ctx.op.Sqrt(cast(ctx, ctx.sym_size(query, -1), query.dtype)))
    else:
        scale = ctx.constant(scale, query.dtype)
    perm = list(range(rank(key)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    keys = ctx.op.Transpose(_repeat_heads(ctx, key, query) if enable_gqa else key, perm=perm)
    scores = ctx.op.MatMul(ctx.op.Mul(query, scale), keys)
    if is_causal:
        attn_mask = _causal_mask(ctx, query, key)
    if attn_mask is None:
        return scores
    if attn_mask.dtype == ir.DataType.BOOL:
        return ctx.op.Where(attn_mask, scores, ctx.constant(-math.inf, query.dtype))
    return ctx.op.Add(scores, cast(ctx, attn_mask, query.dtype))


def _causal_mask(ctx, query, key) -> ir.Value:
    # PyTorch aligns the causal mask top-left (tril of ones(L, S)): query i sees keys j <= i.
    int64 = ir.DataType.INT64
    zero, one = ctx.constant(0, int64), ctx.constant(1, int64)
    rows = ctx.op.Range(zero, scalar(ctx, size_of(ctx, query, -2), ir.DataType.INT64), one)
    columns = ctx.op.Range(zero, scalar(ctx, size_of(ctx, key, -2), ir.DataType.INT64), one)
    return ctx.op.GreaterOrEqual(ctx.op.Unsqueeze(rows, ints(ctx, [1])), columns)


def _attend(ctx, scores, value, *, masked: bool) -> ir.Value:
    weights = ctx.op.Softmax(scores, axis=-1)
    if masked:
        # PyTorch gives a fully masked query row zero weights, not Softmax's NaNs.
        blocked = ctx.op.Equal(
            reduce(ctx, "ReduceMax", scores, [-1]), ctx.constant(-math.inf, scores.dtype)
        )
        weights = ctx.op.Where(blocked, ctx.constant(0.0, scores.dtype), weights)
    return ctx.op.MatMul(weights, value)


def _repeat_heads(ctx, x, query) -> ir.Value:
    """``x`` with each of its heads repeated to match ``query``'s (grouped-query attention)."""
    heads, kv_heads = query.shape[-3], x.shape[-3]
    if heads == kv_heads:
        return x
    if isinstance(heads, int) and isinstance(kv_heads, int):
        groups = heads // kv_heads
    else:
        groups = ctx.op.Div(scalar(ctx, size_of(ctx, query, -3), ir.DataType.INT64), scalar(ctx, size_of(ctx, x, -3), ir.DataType.INT64))
    repeated = ctx.op.Expand(ctx.op.Unsqueeze(x, ints(ctx, [-3])), shape_tensor(ctx, [groups, 1, 1]))
    # The head count spelled out: Reshape cannot infer a -1 when the batch is empty.
    shape = ctx.op.Concat(shape_of(ctx, x, end=-3), shape_of(ctx, query, -3, -2), shape_of(ctx, x, -2), axis=0)
    return reshape(ctx, repeated, shape)


