"""Scaled dot-product attention rules against onnxruntime: composed (opsets 18-22, and where the
Attention op does not fit) and ONNX's Attention op (opset 23)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynexport.registry import default_table
from tests.equivalence import assert_exports_equivalent, op_histogram

aten = torch.ops.aten
BATCH = torch.export.Dim("batch", min=2)
QUERIES = torch.export.Dim("queries", min=2)
KEYS = torch.export.Dim("keys", min=2)
OPSETS = [18, 20, 23]


def _qkv(batch, heads, queries, keys, size=8, kv_heads=None, value_size=None, dtype=torch.float32):
    kv_heads = kv_heads or heads
    return (
        torch.randn(batch, heads, queries, size, dtype=dtype),
        torch.randn(batch, kv_heads, keys, size, dtype=dtype),
        torch.randn(batch, kv_heads, keys, value_size or size, dtype=dtype),
    )


def _check(fn, inputs, resized, *, mask_dims=None, **options):
    """Export with dynamic batch, query and key lengths (and mask dims) and compare each input set."""
    dynamic = [{0: BATCH, 2: QUERIES}, {0: BATCH, 2: KEYS}, {0: BATCH, 2: KEYS}]
    if mask_dims is not None:
        dynamic.append(mask_dims)
    return assert_exports_equivalent(fn, inputs, dynamic_shapes=tuple(dynamic), resized=resized, **options)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_plain_attention_follows_batch_and_sequence_lengths(opset, dtype):
    tolerance = {"rtol": 2e-3, "atol": 2e-3} if dtype == torch.float16 else {}
    program = _check(
        F.scaled_dot_product_attention,
        _qkv(2, 3, 4, 6, dtype=dtype),
        [_qkv(3, 3, 7, 2, dtype=dtype), _qkv(2, 3, 5, 5, dtype=dtype)],
        opset_version=opset,
        **tolerance,
    )
    histogram = op_histogram(program)
    assert (histogram["Attention"], histogram["Softmax"]) == ((1, 0) if opset >= 23 else (0, 1))


@pytest.mark.parametrize("opset", range(18, 24))
def test_causal_mask_is_top_left_aligned_when_lengths_differ(opset):
    _check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        _qkv(2, 2, 3, 5),
        [_qkv(3, 2, 6, 2), _qkv(2, 2, 4, 4), _qkv(2, 2, 2, 9)],
        opset_version=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_mask_over_queries_and_keys(opset, mask_dtype):
    def mask(queries, keys):
        m = torch.rand(queries, keys) > 0.3
        m[:, 0] = True
        return m if mask_dtype == torch.bool else torch.randn(queries, keys).masked_fill(~m, float("-inf"))

    _check(
        F.scaled_dot_product_attention,
        (*_qkv(2, 2, 3, 5), mask(3, 5)),
        [(*_qkv(3, 2, 6, 2), mask(6, 2)), (*_qkv(2, 2, 4, 4), mask(4, 4))],
        mask_dims={0: QUERIES, 1: KEYS},
        opset_version=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_broadcast_padding_mask_with_fully_masked_rows(opset, mask_dtype):
    def padding(batch, keys):
        keep = torch.arange(keys).expand(batch, keys) < torch.arange(batch).view(batch, 1)
        mask = keep.view(batch, 1, 1, keys)
        return mask if mask_dtype == torch.bool else torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))

    _check(
        F.scaled_dot_product_attention,
        (*_qkv(3, 2, 3, 5), padding(3, 5)),
        [(*_qkv(4, 2, 6, 2), padding(4, 2))],
        mask_dims={0: BATCH, 3: KEYS},
        opset_version=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_float_mask_per_head_and_custom_scale(opset):
    _check(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=0.3),
        (*_qkv(2, 3, 4, 5), torch.randn(1, 3, 4, 5)),
        [(*_qkv(3, 3, 6, 2), torch.randn(1, 3, 6, 2))],
        mask_dims={2: QUERIES, 3: KEYS},
        opset_version=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("is_causal", [False, True])
def test_grouped_query_attention(opset, kv_heads, is_causal):
    program = _check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True),
        _qkv(2, 4, 3, 5, kv_heads=kv_heads, value_size=6),
        [_qkv(3, 4, 6, 2, kv_heads=kv_heads, value_size=6)],
        opset_version=opset,
    )
    assert op_histogram(program)["Attention"] == (1 if opset >= 23 else 0)


def test_grouped_query_attention_with_mask():
    _check(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, enable_gqa=True),
        (*_qkv(2, 6, 3, 5, kv_heads=2), torch.rand(2, 1, 3, 5) > 0.5),
        [(*_qkv(3, 6, 4, 2, kv_heads=2), torch.rand(3, 1, 4, 2) > 0.5)],
        mask_dims={0: BATCH, 2: QUERIES, 3: KEYS},
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_three_dim_inputs_are_composed(opset):
    q, k, v = (torch.randn(2, n, 8) for n in (3, 5, 5))
    program = assert_exports_equivalent(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (q, k, v),
        dynamic_shapes=({0: BATCH, 1: QUERIES}, {0: BATCH, 1: KEYS}, {0: BATCH, 1: KEYS}),
        resized=[tuple(torch.randn(4, n, 8) for n in (6, 2, 2))],
        opset_version=opset,
    )
    assert op_histogram(program)["Attention"] == 0


def test_extra_batch_dims():
    q, k, v = (torch.randn(2, 3, 2, n, 4) for n in (3, 5, 5))
    assert_exports_equivalent(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v), opset_version=23
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_for_cpu_with_logsumexp(is_causal):
    def fn(q, k, v, m):
        mask = None if is_causal else m
        output, logsumexp = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=is_causal, attn_mask=mask, scale=0.5
        )
        return output, logsumexp

    _check(
        fn,
        (*_qkv(2, 2, 3, 5), torch.randn(2, 1, 3, 5)),
        [(*_qkv(3, 2, 4, 7), torch.randn(3, 1, 4, 7))],
        mask_dims={0: BATCH, 2: QUERIES, 3: KEYS},
    )


def _sdpa_node(dropout_p):
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    exported = torch.export.export(Attention(), _qkv(1, 2, 3, 3), strict=False)
    return next(n for n in exported.graph.nodes if n.target is aten.scaled_dot_product_attention.default)


@pytest.mark.parametrize("opset", OPSETS)
def test_dropout_is_declined(opset):
    assert default_table.lookup(aten.scaled_dot_product_attention.default, _sdpa_node(0.5), opset) is None
    rule = default_table.lookup(aten.scaled_dot_product_attention.default, _sdpa_node(0.0), opset)
    assert rule.fn.__name__ == ("scaled_dot_product_attention_23" if opset >= 23 else "scaled_dot_product_attention")


def test_bfloat16_attention_computes_in_float32_as_pytorch_does():
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.bfloat16) * 3 for _ in range(3))
    program = assert_exports_equivalent(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), runtime="onnxruntime"
    )
    assert op_histogram(program)["Softmax"] == 1
