"""The whole ops that :mod:`dynexport.passes.fx.fuse_llm` puts in place of a decoder's ATen
patterns, as ``torch.library`` operators in the ``dynexport`` namespace. Their eager kernels
compute what the patterns they replace compute (the fused graph still runs in PyTorch); their
rules are in dynexport/ops/attention.py and dynexport/ops/llm.py."""

from __future__ import annotations

import torch

__all__ = ["attention", "attention_3d", "rms_norm", "rotary_embedding", "rotary_embedding_3d"]


@torch.library.custom_op("dynexport::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, scale: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2, last axis) + epsilon)``, computed in float32 and cast back to x's
    dtype, times ``scale``: transformers' LlamaRMSNorm."""
    x32 = x.float()
    normalized = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + epsilon)
    return scale * normalized.to(x.dtype)


@rms_norm.register_fake
def _(x, scale, epsilon):
    return torch.empty_like(x)


@torch.library.custom_op("dynexport::rotary_embedding", mutates_args=())
def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, sequence, head size), its halves
    rotated (not interleaved): ``x * c + rotate_half(x) * s`` with ``c = cat(cos, cos)`` and
    ``s = cat(sin, sin)``; ``cos`` and ``sin`` are (batch or 1, sequence, head size / 2)."""
    c, s = (torch.cat([t, t], -1).unsqueeze(1) for t in (cos, sin))
    first, second = x.chunk(2, -1)
    return x * c + torch.cat([-second, first], -1) * s


@rotary_embedding.register_fake
def _(x, cos, sin):
    return torch.empty_like(x)


@torch.library.custom_op("dynexport::attention", mutates_args=())
def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    past_key: torch.Tensor | None,
    past_value: torch.Tensor | None,
    scale: float | None,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention over the past and the new keys and values, with as many or
    fewer key/value heads than query heads (grouped-query); returns the output and the keys and
    values it attended to (the past followed by the new: the cache's next state)."""
    if past_key is not None:
        key, value = torch.cat([past_key, key], -2), torch.cat([past_value, value], -2)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=True
    )
    return output, key.clone(), value.clone()


@attention.register_fake
def _(query, key, value, attn_mask, past_key, past_value, scale, is_causal):
    if past_key is not None:
        key, value = torch.cat([past_key, key], -2), torch.cat([past_value, value], -2)
    output = query.new_empty((*query.shape[:-1], value.shape[-1]))
    return output, torch.empty_like(key), torch.empty_like(value)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, sequence, heads * head size) -> (batch, heads, sequence, head size)."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, sequence, head size) -> (batch, sequence, heads * head size)."""
    return x.transpose(1, 2).flatten(2)


@torch.library.custom_op("dynexport::rotary_embedding_3d", mutates_args=())
def rotary_embedding_3d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """:func:`rotary_embedding` of ``x`` (batch, sequence, ``num_heads`` * head size), each
    head's slice of the last axis rotated."""
    return _merge_heads(rotary_embedding(_split_heads(x, num_heads), cos, sin))


@rotary_embedding_3d.register_fake
def _(x, cos, sin, num_heads):
    return torch.empty_like(x)


@torch.library.custom_op("dynexport::attention_3d", mutates_args=())
def attention_3d(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    past_key: torch.Tensor | None,
    past_value: torch.Tensor | None,
    scale: float | None,
    is_causal: bool,
    q_num_heads: int,
    kv_num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`attention` of (batch, sequence, heads * head size) queries, keys and values, whose
    heads are the last axis' consecutive slices; the output is (batch, sequence, ``q_num_heads``
    * value head size), the past and the returned keys and values (batch, ``kv_num_heads``,
    sequence, head size) as in :func:`attention`."""
    output, present_key, present_value = attention(
        _split_heads(query, q_num_heads), _split_heads(key, kv_num_heads), _split_heads(value, kv_num_heads),
        attn_mask, past_key, past_value, scale, is_causal,
    )
    return _merge_heads(output), present_key, present_value


@attention_3d.register_fake
def _(query, key, value, attn_mask, past_key, past_value, scale, is_causal, q_num_heads, kv_num_heads):
    key, value = _split_heads(key, kv_num_heads), _split_heads(value, kv_num_heads)
    if past_key is not None:
        key, value = torch.cat([past_key, key], -2), torch.cat([past_value, value], -2)
    output = query.new_empty((*query.shape[:-1], q_num_heads * value.shape[-1]))
    return output, key.new_empty(key.shape), value.new_empty(value.shape)
