"""Every fusion at opsets 17 and 13: it fires where the op it emits exists, in that opset's form,
and leaves the graph unfused where it does not; onnx's checker accepts the result at the model's
opset and onnxruntime computes the same numbers before and after."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from dynexport.passes.onnx import optimize_model
from tests.passes.graphs import assert_same_results, model, ops, run

rng = np.random.default_rng(0)


def _floats(*shape):
    return ", ".join(f"{v:.4f}" for v in rng.standard_normal(int(np.prod(shape))))


def _optimized(text: str, opset: int, shifted_norms: bool = False, **feeds: np.ndarray) -> ir.Model:
    before = run(model(text, opset), **feeds)
    optimized = model(text, opset)
    optimize_model(optimized, shifted_norms=shifted_norms)
    onnx.checker.check_model(ir.serde.serialize_model(optimized), full_check=True)
    assert_same_results(before, run(optimized, **feeds), rtol=1e-4, atol=1e-5)
    return optimized


def _x(*shape):
    return rng.standard_normal(shape).astype(np.float32)


_GEMM = f"""g (float[N, 3] x) => (float[N, 2] y) <float[2, 3] w = {{{_floats(2, 3)}}}, float[2] b = {{1.0, -1.0}}> {{
    t = Transpose<perm = [1, 0]>(w)
    m = MatMul(x, t)
    y = Add(m, b)
}}"""

_CONV_BATCHNORM = f"""g (float[N, 2, 5, 5] x) => (float[N, 3, 5, 5] y) <float[3, 2, 3, 3] w = {{{_floats(3, 2, 3, 3)}}},
    float[3] s = {{1.5, 0.5, -1.0}}, float[3] b = {{0.1, 0.2, 0.3}}, float[3] mean = {{0.3, -0.2, 0.1}},
    float[3] var = {{0.5, 1.5, 2.0}}> {{
    c = Conv<pads = [1, 1, 1, 1]>(x, w)
    y = BatchNormalization<epsilon = 0.001>(c, s, b, mean, var)
}}"""

_CONV_CHANNEL_AFFINE = f"""g (float[N, 2, 5, 5] x) => (float[N, 3, 5, 5] y) <float[3, 2, 3, 3] w = {{{_floats(3, 2, 3, 3)}}},
    float[3, 1, 1] s = {{1.5, 0.5, -1.0}}, float[1, 3, 1, 1] b = {{0.1, 0.2, 0.3}}, float[N, 3, 5, 5] c,
    float[N, 3, 5, 5] o, float[N, 3, 5, 5] r, float[N, 3, 5, 5] m, float[N, 3, 5, 5] n> {{
    c = Conv<pads = [1, 1, 1, 1]>(x, w)
    n = Mul(c, s)
    o = Add(n, b)
    r = Relu(o)
    m = Mul(r, s)
    y = Add(m, b)
}}"""

_CLAMP = """g (float[N] x) => (float[N] y) <float low = {0.0}, float high = {6.0}> {
    m = Max(x, low)
    y = Min(m, high)
}"""

# Pad before opset 18 has no axes input: the amounts cover every dim.
_PADDED_CONV = f"""g (float[N, 2, 5, 5] x) => (float[N, 3, 4, 4] y) <float[3, 2, 3, 3] w = {{{_floats(3, 2, 3, 3)}}},
    int64[8] amounts = {{0, 0, 0, 1, 0, 0, 1, 0}}, float zero = {{0.0}}> {{
    p = Pad(x, amounts, zero)
    y = Conv(p, w)
}}"""

# ReduceMean before opset 18 takes its axes as an attribute.
_LAYER_NORM = """g (float[N, 4] x) => (float[N, 4] y) <float[4] gamma = {1.0, 2.0, 0.5, -1.0},
    float[4] beta = {0.0, 1.0, 0.0, 1.0}, float eps = {0.00001}, float two = {2.0}> {
    m = ReduceMean<axes = [-1]>(x)
    d = Sub(x, m)
    p = Pow(d, two)
    v = ReduceMean<axes = [-1]>(p)
    e = Add(v, eps)
    s = Sqrt(e)
    n = Div(d, s)
    g = Mul(n, gamma)
    y = Add(g, beta)
}"""

_GELU = f"""g (float[N] x) => (float[N] y)
    <float half = {{0.5}}, float one = {{1.0}}, float root2 = {{{math.sqrt(2):.8f}}}> {{
    d = Div(x, root2)
    e = Erf(d)
    a = Add(e, one)
    h = Mul(x, half)
    y = Mul(h, a)
}}"""

_RMS_NORM = """g (float[N, 4] x) => (float[N, 4] y)
    <float[4] w = {1.0, 2.0, 0.5, -1.0}, float eps = {0.000001}, float two = {2.0}> {
    p = Pow(x, two)
    m = ReduceMean<axes = [-1]>(p)
    e = Add(m, eps)
    s = Sqrt(e)
    n = Div(x, s)
    y = Mul(n, w)
}"""

_ATTENTION = """g (float[B, 2, S, 4] q, float[B, 2, S, 4] k, float[B, 2, S, 4] v) => (float[B, 2, S, 4] y)
    <float scale = {0.5}> {
    qs = Mul(q, scale)
    kt = Transpose<perm = [0, 1, 3, 2]>(k)
    s = MatMul(qs, kt)
    p = Softmax<axis = -1>(s)
    y = MatMul(p, v)
}"""

_CASES = {
    "gemm": (_GEMM, {"x": (4, 3)}, {13: ["Gemm"], 17: ["Gemm"]}),
    "conv_batchnorm": (_CONV_BATCHNORM, {"x": (2, 2, 5, 5)}, {13: ["Conv"], 17: ["Conv"]}),
    "channel_affine": (
        _CONV_CHANNEL_AFFINE,
        {"x": (2, 2, 5, 5)},
        {opset: ["Conv", "Relu", "BatchNormalization"] for opset in (13, 17)},
    ),
    "clip": (_CLAMP, {"x": (16,)}, {13: ["Clip"], 17: ["Clip"]}),
    "pad": (_PADDED_CONV, {"x": (2, 2, 5, 5)}, {13: ["Conv"], 17: ["Conv"]}),
    "layer_norm": (
        _LAYER_NORM,
        {"x": (3, 4)},
        {
            13: ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"],
            17: ["LayerNormalization"],
        },
    ),
    "gelu": (_GELU, {"x": (16,)}, {13: ["Div", "Erf", "Add", "Mul", "Mul"], 17: ["Div", "Erf", "Add", "Mul", "Mul"]}),
    "rms_norm": (
        _RMS_NORM,
        {"x": (3, 4)},
        {opset: ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"] for opset in (13, 17)},
    ),
    "attention": (
        _ATTENTION,
        {"q": (2, 2, 3, 4), "k": (2, 2, 3, 4), "v": (2, 2, 3, 4)},
        {opset: ["Mul", "Transpose", "MatMul", "Softmax", "MatMul"] for opset in (13, 17)},
    ),
}


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_fusion_emits_only_ops_of_the_opset(case, opset):
    text, shapes, expected = _CASES[case]
    optimized = _optimized(text, opset, **{name: _x(*shape) for name, shape in shapes.items()})
    assert ops(optimized) == expected[opset]


_UNAFFINE_INSTANCE_NORM = """g (float[N, 3, H, W] x) => (float[N, 3, H, W] y)
    <float[1] one = {1.0}, float[1] zero = {0.0},
    float[3, 1, 1] s = {1.5, 0.5, -1.0}, float[3, 1, 1] b = {0.1, 0.2, 0.3}, float[N, 3, H, W] n> {
    n = LayerNormalization<axis = 2, epsilon = 0.00001>(x, one, zero)
    m = Mul(n, s)
    y = Add(m, b)
}"""


# The op rules' instance norm below opset 17: LayerNormalization's formula, written out.
_WRITTEN_OUT_INSTANCE_NORM = """g (float[N, 3, H, W] x) => (float[N, 3, H, W] y)
    <float eps = {0.00001}, float[3, 1, 1] s = {1.5, 0.5, -1.0}, float[3, 1, 1] b = {0.1, 0.2, 0.3},
    float[N, 3, H, W] n> {
    mean = ReduceMean<axes = [2, 3]>(x)
    centered = Sub(x, mean)
    square = Mul(centered, centered)
    variance = ReduceMean<axes = [2, 3]>(square)
    shifted = Add(variance, eps)
    deviation = Sqrt(shifted)
    inverse = Reciprocal(deviation)
    n = Mul(centered, inverse)
    m = Mul(n, s)
    y = Add(m, b)
}"""


_NORM_FORMS = [("formula", 13), ("formula", 16), ("layer_norm", 17), ("layer_norm", 18)]


@pytest.mark.parametrize(("form", "opset"), _NORM_FORMS)
def test_instance_norm_is_instance_normalization_at_every_opset(form, opset):
    """LayerNormalization exists from opset 17, its formula before: both, with the channel affine
    after them, become one InstanceNormalization (torch.onnx's form)."""
    text = _WRITTEN_OUT_INSTANCE_NORM if form == "formula" else _UNAFFINE_INSTANCE_NORM
    optimized = _optimized(text, opset, x=_x(2, 3, 5, 7) * 3 + 10)
    assert ops(optimized) == ["InstanceNormalization"]


@pytest.mark.parametrize(("form", "opset"), _NORM_FORMS)
def test_shifted_instance_norm_is_exact_at_every_opset(form, opset):
    """With ``shifted_norms``, InstanceNormalization of x minus its first element (Slice and Sub,
    the same at every opset), accurate where the mean is large against the spread."""
    text = _WRITTEN_OUT_INSTANCE_NORM if form == "formula" else _UNAFFINE_INSTANCE_NORM
    optimized = _optimized(text, opset, shifted_norms=True, x=_x(2, 3, 5, 7) * 3 + 10)
    assert ops(optimized) == ["Slice", "Sub", "InstanceNormalization"]
    # The float32 formula itself is 3e-3 off here (its mean's rounding, in every x - mean).
    x = (1000 + 0.05 * _x(2, 3, 5, 7)).astype(np.float32)
    wide = x.astype(np.float64)
    centered = wide - wide.mean((2, 3), keepdims=True)
    scale, shift = np.array([1.5, 0.5, -1.0]).reshape(3, 1, 1), np.array([0.1, 0.2, 0.3]).reshape(3, 1, 1)
    expected = centered / np.sqrt((centered**2).mean((2, 3), keepdims=True) + 1e-5) * scale + shift
    np.testing.assert_allclose(run(optimized, x=x)[0], expected, atol=1e-5)


_IF_WITH_GELU = f"""g (bool c, float[N] x) => (float[N] y) <float half = {{0.5}}, float one = {{1.0}},
    float root2 = {{{math.sqrt(2):.8f}}}> {{
    y = If(c) <then_branch = t () => (float[N] z) {{
        d = Div(x, root2)
        e = Erf(d)
        a = Add(e, one)
        h = Mul(x, half)
        z = Mul(h, a)
    }}, else_branch = f () => (float[N] r) {{ r = Relu(x) }}>
}}"""


@pytest.mark.parametrize("opset", [17, 20])
def test_a_subgraph_is_fused_at_the_models_opset(opset):
    """Subgraphs import no opset of their own: an If branch fuses Gelu when the model is at 20."""
    optimized = _optimized(_IF_WITH_GELU, opset, c=np.array(True), x=_x(8))
    (branch, _) = optimized.graph.subgraphs()
    assert [node.op_type for node in branch] == (["Gelu"] if opset >= 20 else ["Div", "Erf", "Add", "Mul", "Mul"])
