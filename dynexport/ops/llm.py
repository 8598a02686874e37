"""dynexport's whole decoder ops (passes/fx/fuse_llm.py puts them in place of their ATen
patterns) as ONNX's RMSNormalization, RotaryEmbedding and, for the 3-D forms (heads along the
last axis), Attention (opset 23)."""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import shape_tensor, size_of
from dynexport.ops.attention import attention_mask_input, total_keys
from dynexport.passes.fx import llm_ops  # noqa: F401  (defines the dynexport:: ops)
from dynexport.registry import translates

fused_ops = torch.ops.dynexport


@translates(fused_ops.rms_norm.default, min_opset=23)
def rms_norm(ctx, x, scale, epsilon):
    # stash_type 1: the mean and the root in float32, as LlamaRMSNorm computes them.
    return ctx.op.RMSNormalization(x, scale, axis=-1, epsilon=float(epsilon), stash_type=int(ir.DataType.FLOAT))


@translates(fused_ops.rotary_embedding.default, min_opset=23)
def rotary_embedding(ctx, x, cos, sin):
    return ctx.op.RotaryEmbedding(x, *_tables_per_row(ctx, x, cos, sin), interleaved=0)


@translates(fused_ops.rotary_embedding_3d.default, min_opset=23)
def rotary_embedding_3d(ctx, x, cos, sin, num_heads):
    return ctx.op.RotaryEmbedding(x, *_tables_per_row(ctx, x, cos, sin), interleaved=0, num_heads=int(num_heads))


def _tables_per_row(ctx, x, cos, sin) -> tuple[ir.Value, ir.Value]:
    if cos.shape[0] == 1 and x.shape[0] != 1:
        # Tables shared by the batch (positions counted from the cache): the op takes one per row.
        tables = shape_tensor(ctx, [size_of(ctx, x, 0), size_of(ctx, cos, 1), size_of(ctx, cos, 2)])
        cos, sin = ctx.op.Expand(cos, tables), ctx.op.Expand(sin, tables)
    return cos, sin


@translates(fused_ops.attention_3d.default, min_opset=23)
def attention_3d(ctx, query, key, value, attn_mask, past_key, past_value, scale, is_causal, q_num_heads, kv_num_heads):
    # 3-D queries and keys hold their sequence lengths second last, as 4-D ones: the mask is made alike.
    attributes = {"q_num_heads": int(q_num_heads), "kv_num_heads": int(kv_num_heads), "is_causal": int(is_causal)}
    if scale is not None:
        attributes["scale"] = float(scale)
    if past_key is None:
        # Without a past the fusion leaves the keys and values it returns unread.
        mask = attention_mask_input(ctx, attn_mask, query, key)
        return ctx.op.Attention(query, key, value, mask, **attributes), None, None
    mask = attention_mask_input(ctx, attn_mask, query, key, total_keys(ctx, past_key, key))
    return tuple(ctx.op.Attention(query, key, value, mask, past_key, past_value, _outputs=3, **attributes))
