"""``target="onnxruntime"``: the com.microsoft fusions fire only under it, and onnxruntime computes
the same numbers; the default graph stays standard ONNX. Also the export keywords that choose
the optimizer's forms (``target``, ``strict_clamps``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from torch import nn

import dynexport
from dynexport.passes.onnx import optimize_model
from tests.equivalence import assert_exports_equivalent, op_histogram
from tests.passes.graphs import assert_same_results, model, ops, run

Dim = torch.export.Dim
rng = np.random.default_rng(0)

# Two heads of size 4 between projections of a (batch, sequence, 8) input, the way PyTorch's
# attention layers translate: a boolean key mask, Softmax guarded against rows of -inf only.
_HEADS = """
    qh = Reshape(q, split)
    qt = Transpose<perm = [0, 2, 1, 3]>(qh)
    qs = Mul(qt, scale)
    kh = Reshape(k, split)
    kt = Transpose<perm = [0, 2, 3, 1]>(kh)
    vh = Reshape(v, split)
    vt = Transpose<perm = [0, 2, 1, 3]>(vh)
    s = MatMul(qs, kt)
"""
_MERGE = """
    o = MatMul(p, vt)
    ot = Transpose<perm = [0, 2, 1, 3]>(o)
    y = Reshape(ot, merged)
"""
_TYPES = """float[B, S, 2, 4] qh, float[B, S, 2, 4] kh, float[B, S, 2, 4] vh, float[B, 2, S, 4] o,
    float[B, S, 2, 4] ot, int64[4] split = {0, 0, 2, 4}, int64[3] merged = {0, 0, 8}, float scale = {0.5}"""


def _masked(opset: int) -> str:
    """The masked attention, its ReduceMax in the form of ``opset`` (axes an input from 18)."""
    largest = "ReduceMax<keepdims = 1>(w, last)" if opset >= 18 else "ReduceMax<keepdims = 1, axes = [-1]>(w)"
    return f"""g (float[B, S, 8] q, float[B, S, 8] k, float[B, S, 8] v, bool[B, 1, S, S] mask) => (float[B, S, 8] y)
    <{_TYPES}, float ninf = {{-inf}}, float zero = {{0.0}}, int64[1] last = {{-1}}> {{
    {_HEADS}
    w = Where(mask, s, ninf)
    soft = Softmax<axis = -1>(w)
    largest = {largest}
    empty = Equal(largest, ninf)
    p = Where(empty, zero, soft)
    {_MERGE}
}}"""


# Whisper's and BART's: the query projection scaled before its split into heads.
_BIASED = f"""g (float[B, S, 8] q, float[B, S, 8] k, float[B, S, 8] v, float[B, 2, S, S] bias) => (float[B, S, 8] y)
    <{_TYPES}, float[B, S, 8] qp> {{
    qp = Mul(q, scale)
    qh = Reshape(qp, split)
    qt = Transpose<perm = [0, 2, 1, 3]>(qh)
    kh = Reshape(k, split)
    kt = Transpose<perm = [0, 2, 3, 1]>(kh)
    vh = Reshape(v, split)
    vt = Transpose<perm = [0, 2, 1, 3]>(vh)
    s = MatMul(qt, kt)
    w = Add(s, bias)
    p = Softmax<axis = -1>(w)
    {_MERGE}
}}"""


def _projections(batch=2, sequence=5):
    return {name: rng.standard_normal((batch, sequence, 8)).astype(np.float32) for name in "qkv"}


def _fused(text: str, opset: int = 20, **feeds: np.ndarray):
    before = run(model(text, opset), **feeds)
    portable = model(text, opset)
    optimize_model(portable)
    assert "MultiHeadAttention" not in ops(portable) and "com.microsoft" not in portable.opset_imports
    fused = model(text, opset)
    optimize_model(fused, target="onnxruntime")
    onnx.checker.check_model(ir.serde.serialize_model(fused), full_check=True)
    assert_same_results(before, run(fused, **feeds), rtol=1e-5, atol=1e-6)
    return fused


@pytest.mark.parametrize("opset", [13, 17, 20])
def test_masked_attention_between_projections_becomes_multi_head_attention(opset):
    mask = rng.random((2, 1, 5, 5)) > 0.3
    mask[1, 0, 2] = False  # a row with every key masked: 0, as in PyTorch, not NaN
    fused = _fused(_masked(opset), opset, **_projections(), mask=mask)
    (attention,) = [node for node in fused.graph if node.op_type == "MultiHeadAttention"]
    assert attention.domain == "com.microsoft" and fused.opset_imports["com.microsoft"] == 1
    assert attention.attributes["num_heads"].as_int() == 2 and attention.attributes["scale"].as_float() == 0.5
    assert "Softmax" not in ops(fused) and "Transpose" not in ops(fused)


def test_additive_bias_attention_becomes_multi_head_attention():
    fused = _fused(_BIASED, **_projections(), bias=rng.standard_normal((2, 2, 5, 5)).astype(np.float32))
    assert ops(fused) == ["MultiHeadAttention"]
    assert fused.graph.node(0).attributes["scale"].as_float() == 0.5


class SelfAttention(nn.Module):
    """BERT's: q, k, v projections split into heads, attention over the keys a padding mask
    keeps, heads merged."""

    def __init__(self, width=16, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x, keep):
        batch, sequence, width = x.shape

        def split(t):
            return t.view(batch, sequence, self.heads, width // self.heads).transpose(1, 2)

        mask = keep[:, None, None, :].expand(batch, 1, sequence, sequence)
        heads = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), mask)
        return heads.transpose(1, 2).reshape(batch, sequence, width)


def test_exported_attention_with_a_padding_mask_under_the_onnxruntime_target():
    torch.manual_seed(0)
    calls = []
    for batch, sequence in [(2, 6), (3, 4), (1, 9)]:
        keep = torch.rand(batch, sequence) > 0.3
        keep[0, :] = False  # every key masked: PyTorch's attention gives 0 there
        calls.append((torch.randn(batch, sequence, 16), keep))
    dims = ({0: Dim("batch"), 1: Dim("sequence")}, {0: Dim("batch"), 1: Dim("sequence")})
    program = assert_exports_equivalent(
        SelfAttention().eval(), calls[0], dynamic_shapes=dims, resized=calls[1:], atol=1e-5, target="onnxruntime"
    )
    assert op_histogram(program)["MultiHeadAttention"] == 1


def test_export_keywords_choose_the_optimizers_forms():
    def clamped(x):
        return torch.clamp(x, -1.0, 2.0) * 3

    x = torch.tensor([float("nan"), -5.0, 0.5, 5.0])
    assert op_histogram(assert_exports_equivalent(clamped, (x,)))["Clip"] == 1
    strict = assert_exports_equivalent(clamped, (x,), strict_clamps=True)
    assert "Clip" not in op_histogram(strict) and {"Max", "Min"} <= set(op_histogram(strict))
    with pytest.raises(ValueError, match="target='tensorrt' is not supported"):
        dynexport.export(clamped, (x,), target="tensorrt")
    with pytest.raises(TypeError, match="strict_clamps"):
        dynexport.export(clamped, (x,), strict_clamps="yes")
    with pytest.raises(TypeError, match="exact_norms"):
        dynexport.export(clamped, (x,), exact_norms="yes")
