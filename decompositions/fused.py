"""Decompositions of torch's fused inference kernels that torch itself does not decompose.

``nn.TransformerEncoderLayer`` in eval mode under ``torch.no_grad()`` calls one fused kernel for
the whole layer (its "fast path"); Dynamo graphs, and so the ``torch.compile`` backend, see it.
Written here in the operators the layer is made of, it translates like the unfused layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["FUSED_DECOMPOSITIONS"]

aten = torch.ops.aten


def transformer_encoder_layer(
    src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
    norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
    mask=None, mask_type=None,
):
    """``aten._transformer_encoder_layer_fwd``: batch-first ``src`` (the fast path's condition)."""
    batch, steps = src.shape[0], src.shape[1]
    if mask is not None:
        mask = _attention_mask(mask, mask_type, batch, steps)

    def heads(x):
        return x.view(batch, steps, num_heads, embed_dim // num_heads).transpose(1, 2)

    def attention(x):
        query, key, value = F.linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1)
        mixed = F.scaled_dot_product_attention(heads(query), heads(key), heads(value), attn_mask=mask)
        return F.linear(mixed.transpose(1, 2).reshape(batch, steps, embed_dim), proj_weight, proj_bias)

    def feed_forward(x):
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), ffn_weight_2, ffn_bias_2)

    def norm_1(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm_2(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    if norm_first:
        src = src + attention(norm_1(src))
        return src + feed_forward(norm_2(src))
    src = norm_1(src + attention(src))
    return norm_2(src + feed_forward(src))


def _attention_mask(mask, mask_type, batch, steps):
    """The fused kernel's mask as scaled_dot_product_attention's: 0 a (steps, steps) mask, 1 a
    (batch, steps) key padding mask, 2 merged (batch, heads, steps, steps); True or -inf masks
    a position out, where scaled_dot_product_attention's boolean masks keep what is True."""
    if mask_type == 1:
        mask = mask.view(batch, 1, 1, steps)
    return mask.logical_not() if mask.dtype == torch.bool else mask


FUSED_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer,
}
