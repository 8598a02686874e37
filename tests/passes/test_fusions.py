"""Each fusion on a small hand-built graph: the fused op appears, and onnxruntime computes the
same numbers before and after."""

import math

import numpy as np
import torch

from dynexport.passes.onnx.dead_code import remove_dead_code
from dynexport.passes.onnx.fold_constants import fold_constants
from dynexport.passes.onnx.fuse_attention import fuse_attention
from dynexport.passes.onnx.fuse_channel_affine import fuse_channel_affine
from dynexport.passes.onnx.fuse_conv_batchnorm import fuse_conv_batchnorm
from dynexport.passes.onnx.fuse_division import fuse_division
from dynexport.passes.onnx.fuse_gelu import fuse_gelu
from dynexport.passes.onnx.fuse_gemm import fuse_gemm
from dynexport.passes.onnx.fuse_layer_norm import fuse_layer_norm
from dynexport.passes.onnx.fuse_rms_norm import fuse_rms_norm
from tests.equivalence import assert_exports_equivalent, op_histogram
from tests.passes.graphs import assert_same_results, model, ops, run

rng = np.random.default_rng(0)
_OPSET_DEPENDENT = (fuse_attention, fuse_gelu, fuse_layer_norm, fuse_rms_norm)


def _fused(fuse, text, opset=20, **feeds):
    before = run(model(text, opset), **feeds)
    m = model(text, opset)
    count = fuse(m.graph, opset=opset) if fuse in _OPSET_DEPENDENT else fuse(m.graph)
    remove_dead_code(m.graph)
    fold_constants(m.graph, opset=opset)
    remove_dead_code(m.graph)
    assert_same_results(before, run(m, **feeds), rtol=1e-4, atol=1e-5)
    return count, ops(m)


def _floats(*shape):
    return ", ".join(f"{v:.4f}" for v in rng.standard_normal(int(np.prod(shape))))


def test_matmul_add_becomes_gemm_and_a_transposed_weight_becomes_trans_b():
    text = f"""g (float[N, 3] x) => (float[N, 2] y, float[N, 2] z) <float[2, 3] w = {{{_floats(2, 3)}}}, float[2] b = {{1.0, -1.0}}> {{
        t = Transpose<perm = [1, 0]>(w)
        m = MatMul(x, t)
        y = Add(m, b)
        z = MatMul(x, t)
    }}"""
    count, fused = _fused(fuse_gemm, text, x=rng.standard_normal((4, 3)).astype(np.float32))
    assert count == 2 and fused == ["Gemm", "Gemm"]


def test_matmul_add_on_3d_input_or_broadcasting_bias_stays():
    text = """g (float[2, N, 3] x, float[3, 2] w, float[N, 1, 2] b) => (float[2, N, 2] y) {
        m = MatMul(x, w)
        y = Add(m, b)
    }"""
    assert fuse_gemm(model(text).graph) == 0


def test_conv_batchnorm_becomes_one_conv_with_folded_weights():
    text = f"""g (float[N, 2, 5, 5] x) => (float[N, 3, 5, 5] y) <float[3, 2, 3, 3] w = {{{_floats(3, 2, 3, 3)}}},
        float[3] s = {{1.5, 0.5, -1.0}}, float[3] b = {{0.1, 0.2, 0.3}}, float[3] mean = {{0.3, -0.2, 0.1}}, float[3] var = {{0.5, 1.5, 2.0}}> {{
        c = Conv<pads = [1, 1, 1, 1]>(x, w)
        y = BatchNormalization<epsilon = 0.001>(c, s, b, mean, var)
    }}"""
    count, fused = _fused(fuse_conv_batchnorm, text, x=rng.standard_normal((2, 2, 5, 5)).astype(np.float32))
    assert count == 1 and fused == ["Conv"]


def test_per_channel_scale_and_shift_become_batch_normalization():
    """x * s + b with s and b varying along dim 1 only: one BatchNormalization (mean 0, variance
    1, epsilon 0), bit for bit the same; a constant varying along another dim stays, and so does
    a matrix's affine (Gemm's to fuse)."""
    text = """g (double[N, 3, H, 4] x, double[N, 3] t) => (double[N, 3, H, 4] y, double[N, 3, H, 4] z, double[N, 3] v)
        <double[3, 1, 1] s = {1.5, 0.5, -1.0}, double[1, 3, 1, 1] b = {0.1, 0.2, 0.3}, double[4] row = {1.0, 2.0, 3.0, 4.0},
        double[3] ts = {1.5, 0.5, -1.0}, double[3] tb = {0.1, 0.2, 0.3}, double[N, 3, H, 4] m, double[N, 3, H, 4] n,
        double[N, 3] k> {
        m = Mul(s, x)
        y = Add(m, b)
        n = Mul(x, row)
        z = Add(n, b)
        k = Mul(t, ts)
        v = Add(k, tb)
    }"""
    feeds = {"x": rng.standard_normal((2, 3, 5, 4)), "t": rng.standard_normal((2, 3))}
    before = run(model(text), **feeds)
    m = model(text)
    assert fuse_channel_affine(m.graph) == 1
    remove_dead_code(m.graph)
    assert ops(m) == ["BatchNormalization", "Mul", "Add", "Mul", "Add"]
    for expected, actual in zip(before, run(m, **feeds)):
        np.testing.assert_array_equal(actual, expected)


def test_layer_norm_formula_becomes_layer_normalization():
    text = """g (float[N, 4] x) => (float[N, 4] y) <float[4] gamma = {1.0, 2.0, 0.5, -1.0}, float[4] beta = {0.0, 1.0, 0.0, 1.0},
        int64[1] axes = {-1}, float eps = {0.00001}, float two = {2.0}> {
        m = ReduceMean(x, axes)
        d = Sub(x, m)
        p = Pow(d, two)
        v = ReduceMean(p, axes)
        e = Add(v, eps)
        s = Sqrt(e)
        n = Div(d, s)
        g = Mul(n, gamma)
        y = Add(g, beta)
    }"""
    count, fused = _fused(fuse_layer_norm, text, x=rng.standard_normal((3, 4)).astype(np.float32))
    assert count == 1 and fused == ["LayerNormalization"]


def test_erf_and_tanh_gelu_formulas_become_gelu():
    text = f"""g (float[N] x) => (float[N] y, float[N] z) <float half = {{0.5}}, float one = {{1.0}}, float root2 = {{{math.sqrt(2):.8f}}},
        float c = {{{math.sqrt(2 / math.pi):.8f}}}, float k = {{0.044715}}, float three = {{3.0}}> {{
        d = Div(x, root2)
        e = Erf(d)
        a = Add(e, one)
        h = Mul(x, half)
        y = Mul(h, a)
        p = Pow(x, three)
        kp = Mul(k, p)
        s = Add(x, kp)
        cs = Mul(c, s)
        t = Tanh(cs)
        a2 = Add(one, t)
        h2 = Mul(half, x)
        z = Mul(a2, h2)
    }}"""
    count, fused = _fused(fuse_gelu, text, x=rng.standard_normal(16).astype(np.float32))
    assert count == 2 and fused == ["Gelu", "Gelu"]
    assert fuse_gelu(model(text, opset=18).graph, opset=18) == 0


def test_rms_norm_formula_becomes_rms_normalization_at_opset_23():
    text = """g (float[N, 4] x) => (float[N, 4] y) <float[4] w = {1.0, 2.0, 0.5, -1.0}, int64[1] axes = {-1}, float eps = {0.000001}, float two = {2.0}> {
        p = Pow(x, two)
        m = ReduceMean(p, axes)
        e = Add(m, eps)
        s = Sqrt(e)
        r = Reciprocal(s)
        n = Mul(x, r)
        y = Mul(w, n)
    }"""
    count, fused = _fused(fuse_rms_norm, text, opset=23, x=rng.standard_normal((3, 4)).astype(np.float32))
    assert count == 1 and fused == ["RMSNormalization"]
    assert fuse_rms_norm(model(text, opset=20).graph, opset=20) == 0


def test_masked_attention_becomes_attention_at_opset_23():
    text = """g (float[B, 2, S, 4] q, float[B, 2, S, 4] k, float[B, 2, S, 4] v, bool[S, S] mask) => (float[B, 2, S, 4] y) <float scale = {0.5}, float ninf = {-inf}> {
        qs = Mul(q, scale)
        kt = Transpose<perm = [0, 1, 3, 2]>(k)
        s = MatMul(qs, kt)
        w = Where(mask, s, ninf)
        p = Softmax<axis = -1>(w)
        y = MatMul(p, v)
    }"""
    q, k, v = (rng.standard_normal((2, 2, 3, 4)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((3, 3), bool))
    count, fused = _fused(fuse_attention, text, opset=23, q=q, k=k, v=v, mask=mask)
    assert count == 1 and fused == ["Attention"]


def test_fusions_on_real_models():
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    conv[1].running_mean.uniform_(-1, 1)
    conv[1].running_var.uniform_(0.5, 2)
    program = assert_exports_equivalent(conv, (torch.randn(2, 3, 8, 8),))
    assert "BatchNormalization" not in op_histogram(program)

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    program = assert_exports_equivalent(gelu_tanh, (torch.randn(4, 8),))
    assert list(op_histogram(program)) == ["Gelu"]

    def rms_norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    program = assert_exports_equivalent(rms_norm, (torch.randn(2, 3, 8), torch.nn.Parameter(torch.randn(8))), opset_version=23)
    assert "RMSNormalization" in op_histogram(program)


def test_product_with_a_reciprocal_becomes_a_division():
    """The same on zeros, infinities and NaN; an RMS norm then reads x / sqrt(...), the form
    onnxruntime fuses into SimplifiedLayerNormalization itself."""
    text = """g (float[N] x, float[N] y) => (float[N] z) {
        r = Reciprocal(y)
        z = Mul(x, r)
    }"""
    x = np.array([1.0, 0.0, -2.0, np.inf, 3.0, np.nan, 0.0], np.float32)
    y = np.array([0.0, 0.0, np.inf, np.inf, -4.0, 1.0, -0.0], np.float32)
    before = run(model(text), x=x, y=y)
    m = model(text)
    assert fuse_division(m.graph) == 1
    remove_dead_code(m.graph)
    assert ops(m) == ["Div"]
    np.testing.assert_array_equal(run(m, x=x, y=y)[0], before[0])

    def rms_norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    program = assert_exports_equivalent(rms_norm, (torch.randn(2, 3, 8), torch.nn.Parameter(torch.randn(8))))
    assert list(op_histogram(program)) == ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
