import numpy as np
import onnx_ir as ir
import torch

from dynexport.passes.onnx.dead_code import remove_dead_code
from dynexport.passes.onnx.fold_shapes import fold_shapes
from dynexport.passes.onnx.lift_constants import lift_constants
from tests.equivalence import assert_exports_equivalent, op_histogram
from tests.passes.graphs import assert_same_results, model, ops, run


def _folded(text: str):
    m = model(text)
    lift_constants(m.graph)
    fold_shapes(m.graph)
    remove_dead_code(m.graph)
    return m


def test_static_dims_of_a_partially_known_shape_fold_to_a_constant():
    m = _folded("""g (float[N, 4, 6] x) => (float[N, 4, 6] y) {
        s = Shape<start = 1>(x)
        n = Constant<value = int64[1] {-1}>()
        t = Concat<axis = 0>(n, s)
        y = Reshape(x, t)
    }""")
    assert ops(m) == ["Reshape"]
    np.testing.assert_array_equal(m.graph.node(0).inputs[1].const_value.numpy(), [-1, 4, 6])


def test_reshape_target_built_from_symbolic_dims_becomes_a_copying_constant():
    text = """g (float[N, S, 8] x) => (float[N, S, 2, 4] y) {
        a = Shape<start = 0, end = 1>(x)
        b = Shape<start = 1, end = 2>(x)
        c = Constant<value = int64[2] {2, 4}>()
        t = Concat<axis = 0>(a, b, c)
        y = Reshape<allowzero = 1>(x, t)
    }"""
    x = np.random.rand(3, 5, 8).astype(np.float32)
    before = run(model(text), x=x)
    m = _folded(text)
    assert ops(m) == ["Reshape"]
    np.testing.assert_array_equal(m.graph.node(0).inputs[1].const_value.numpy(), [0, 0, 2, 4])
    assert_same_results(before, run(m, x=x))


def test_the_same_dim_read_from_two_tensors_is_one_value():
    m = _folded("""g (float[N, 4] x, float[N, 2] z) => (int64[N] y, int64[N] w) {
        a = Shape<start = 0, end = 1>(x)
        b = Shape<start = 0, end = 1>(z)
        sa = Squeeze(a)
        sb = Squeeze(b)
        zero = Constant<value = int64 {0}>()
        one = Constant<value = int64 {1}>()
        y = Range(zero, sa, one)
        w = Range(zero, sb, one)
    }""")
    first, second = [n for n in m.graph if n.op_type == "Range"]
    assert first.inputs[1] is second.inputs[1]
    assert ops(m) == ["Shape", "Squeeze", "Range", "Range"]


def test_an_expand_to_the_input_shape_is_removed():
    text = """g (float[N, 1, S] x) => (float[N, 1, S] y) {
        a = Shape<start = 0, end = 1>(x)
        b = Shape<start = 2, end = 3>(x)
        one = Constant<value = int64[1] {1}>()
        t = Concat<axis = 0>(a, one, b)
        e = Expand(x, t)
        y = Relu(e)
    }"""
    m = _folded(text)
    assert ops(m) == ["Relu"]
    x = np.random.rand(2, 1, 3).astype(np.float32) - 0.5
    assert_same_results(run(model(text), x=x), run(m, x=x))


def test_dynamic_views_of_a_real_model_need_no_shape_ops():
    def heads(x):
        batch, seq, _ = x.shape
        return x.view(batch, seq, 4, 2).transpose(1, 2).relu().transpose(1, 2).reshape(batch, seq, 8)

    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    program = assert_exports_equivalent(heads, (torch.randn(2, 3, 8),), dynamic_shapes=(dims,), resized=[(torch.randn(4, 5, 8),)])
    histogram = op_histogram(program)
    assert "Concat" not in histogram and "Shape" not in histogram


def test_flattened_dynamic_dims_need_no_shape_ops():
    # LeViT's flatten(0, 1) of [batch, 16, 256]: the product of the merged dims (Shape,
    # ReduceProd) folds, and the target becomes [-1, 8], right at a zero batch too. (flatten(1)
    # would be [0, -1], which onnxruntime cannot infer at a zero batch: that one keeps its target.)
    def merged(x):
        return x.flatten(0, 1).relu()

    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    program = assert_exports_equivalent(
        merged, (torch.randn(2, 3, 8),), dynamic_shapes=(dims,), resized=[(torch.randn(4, 5, 8),), (torch.randn(0, 2, 8),)]
    )
    histogram = op_histogram(program)
    assert not {"Shape", "ReduceProd", "Concat"} & set(histogram), histogram


def test_a_reshape_of_a_reshape_is_one_reshape_where_its_result_shape_makes_a_constant_target():
    # LeViT's attention: [16 * batch, 256] back to [batch, 16, 256], then split into heads.
    def heads(x):
        flat = x.flatten(0, 1) * 2
        return flat.reshape_as(x).view(x.shape[0], 16, 4, 64)

    program = assert_exports_equivalent(
        heads, (torch.randn(2, 16, 256),), dynamic_shapes=({0: torch.export.Dim("batch")},),
        resized=[(torch.randn(5, 16, 256),), (torch.randn(0, 16, 256),)],
    )
    assert op_histogram(program) == {"Reshape": 2, "Mul": 1}


def test_a_reduction_of_sizes_along_its_one_axis_is_their_product():
    text = """g (float[N, S, 8] x) => (float[M, 8] y) {
        s = Shape<end = 2>(x)
        n = ReduceProd<keepdims = 1>(s)
        eight = Constant<value = int64[1] {8}>()
        t = Concat<axis = 0>(n, eight)
        y = Reshape(x, t)
    }"""
    x = np.random.rand(3, 5, 8).astype(np.float32)
    m = _folded(text)
    assert ops(m) == ["Reshape"]
    np.testing.assert_array_equal(m.graph.node(0).inputs[1].const_value.numpy(), [-1, 8])
    assert_same_results(run(model(text), x=x), run(m, x=x))


def test_int64_arithmetic_past_its_range_is_left_to_the_runtime():
    # 0 - (-2**63) wraps to -2**63 in int64; an exact integer would not fit the initializer.
    m = model("""g (int64[1] x) => (int64[1] y) {
        zero = Constant<value = int64[1] {0}>()
        low = Constant<value = int64[1] {-9223372036854775808}>()
        wrapped = Sub(zero, low)
        y = Add(x, wrapped)
    }""")
    lift_constants(m.graph)
    fold_shapes(m.graph)
    assert "Sub" in ops(m)
    np.testing.assert_array_equal(run(m, x=np.array([1], np.int64))[0], [-(2**63) + 1])


def test_remainders_and_quotients_of_sizes_fold_where_they_reduce_exactly():
    # A window of 4 over a side of 8 * K: (4 - W % 4) % 4 is the constant 0; W / 4 (2 * K) is
    # computed, and W / 3 and W % 3, which do not reduce, are too.
    text = """g (float[N, W] x) => (int64[4] y) {
        w = Shape<start = 1, end = 2>(x)
        four = Constant<value = int64[1] {4}>()
        three = Constant<value = int64[1] {3}>()
        r = Mod(w, four)
        s = Sub(four, r)
        pad = Mod(s, four)
        q = Div(w, four)
        q3 = Div(w, three)
        r3 = Mod(w, three)
        y = Concat<axis = 0>(pad, q, q3, r3)
    }"""
    def windowed() -> ir.Model:
        m = model(text)
        m.graph.inputs[0].shape = ir.Shape(["N", "8*K"])  # ONNX's text format writes no expressions
        return m

    m = windowed()
    lift_constants(m.graph)
    fold_shapes(m.graph)
    remove_dead_code(m.graph)
    assert sorted(ops(m)) == ["Concat", "Div", "Div", "Mod", "Shape"]
    for k in (1, 2, 5):
        x = np.zeros((2, 8 * k), np.float32)
        assert_same_results(run(windowed(), x=x), run(m, x=x))
        np.testing.assert_array_equal(run(m, x=x)[0][:2], [0, 2 * k])


def test_window_padding_of_a_side_that_is_a_multiple_of_the_window_needs_no_pad():
    # torchvision's Swin pads each stage's map to whole windows: pad_r = (w - W % w) % w. With
    # sides of 32 * k after a stride-4 patch embedding, every pad is zero at every size.
    class Windows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Conv2d(3, 8, 4, stride=4)

        def forward(self, x):
            x = self.embed(x).permute(0, 2, 3, 1)
            _, h, w, c = x.shape
            pad_r, pad_b = (4 - w % 4) % 4, (4 - h % 4) % 4
            x = torch.nn.functional.pad(x, (0, 0, 0, pad_r, 0, pad_b))
            windows = x.view(-1, (h + pad_b) // 4, 4, (w + pad_r) // 4, 4, c)
            return windows.sum(dim=(2, 4))

    height, width = (32 * torch.export.Dim(name, min=1, max=32) for name in ("height", "width"))
    program = assert_exports_equivalent(
        Windows().eval(), (torch.randn(2, 3, 64, 96),), dynamic_shapes=({0: torch.export.Dim("batch"), 2: height, 3: width},),
        resized=[(torch.randn(1, 3, 96, 64),), (torch.randn(3, 3, 32, 32),)],
    )
    histogram = op_histogram(program)
    assert not {"Pad", "Mod", "Sub"} & set(histogram), histogram


def test_sides_read_one_by_one_and_concatenated_are_one_shape_of_the_run():
    """``F.interpolate(x, size=y.shape[-2:])``: y's sides read one by one and concatenated are
    one Shape of y from 2 to 4; a Concat of sizes that are no run of dims of the tensors they
    were read from (the sides swapped, a batch and a side) stays."""
    text = """g (float[N, C, H, W] y, float[N, C, W, H] z) => (int64[2] sides, int64[2] swapped, int64[2] mixed) {
        h = Shape<start = 2, end = 3>(y)
        w = Shape<start = 3, end = 4>(y)
        sides = Concat<axis = 0>(h, w)
        swapped = Concat<axis = 0>(w, h)
        n = Shape<start = 0, end = 1>(z)
        mixed = Concat<axis = 0>(n, h)
    }"""
    feeds = {"y": np.zeros((2, 3, 5, 7), np.float32), "z": np.zeros((4, 3, 7, 5), np.float32)}
    m = _folded(text)
    assert_same_results(run(model(text), **feeds), run(m, **feeds))
    shape_of_run = m.graph.outputs[0].producer()
    assert shape_of_run.op_type == "Shape" and shape_of_run.inputs[0] is m.graph.inputs[0]
    assert (shape_of_run.attributes["start"].as_int(), shape_of_run.attributes["end"].as_int()) == (2, 4)
    # Only the tensors the Concat's sizes were read from are looked at: z's last dims are
    # (W, H), but the swapped sides were read from y.
    assert [out.producer().op_type for out in m.graph.outputs[1:]] == ["Concat", "Concat"]
