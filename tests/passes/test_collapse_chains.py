import numpy as np

from dynexport.passes.onnx.collapse_chains import collapse_chains
from dynexport.passes.onnx.dead_code import remove_dead_code
from tests.passes.graphs import model, ops, run


def test_transpose_of_transpose_becomes_one_transpose():
    text = """g (float[2, 3, 4] x) => (float[4, 2, 3] y) {
        a = Transpose<perm = [0, 2, 1]>(x)
        y = Transpose<perm = [1, 0, 2]>(a)
    }"""
    x = np.random.rand(2, 3, 4).astype(np.float32)
    m = model(text)
    assert collapse_chains(m.graph) == 1
    remove_dead_code(m.graph)
    assert ops(m) == ["Transpose"]
    assert list(m.graph.node(0).attributes["perm"].as_ints()) == [2, 0, 1]
    np.testing.assert_array_equal(run(m, x=x)[0], run(model(text), x=x)[0])


def test_reshape_chain_and_lossless_cast_chain_collapse_but_lossy_casts_do_not():
    m = model("""g (float[2, 6] x, int64[3] i) => (float[3, 4] y, float[3] f, float[3] g) <int64[2] a = {4, 3}, int64[2] b = {3, 4}> {
        r = Reshape(x, a)
        y = Reshape(r, b)
        d = Cast<to = 11>(x)
        e = Cast<to = 1>(d)
        f = ReduceSum<keepdims = 0>(e)
        h = Cast<to = 1>(i)
        k = Cast<to = 6>(h)
        g = Cast<to = 1>(k)
    }""")
    assert collapse_chains(m.graph) == 2
    remove_dead_code(m.graph)
    assert ops(m) == ["Reshape", "Cast", "ReduceSum", "Cast", "Cast", "Cast"]
    assert m.graph.node(0).inputs[0] is m.graph.inputs[0]


def test_squeeze_of_unsqueeze_on_the_same_axes_goes():
    m = model("""g (float[3] x) => (float[3] y) <int64[1] axes = {0}> {
        u = Unsqueeze(x, axes)
        s = Squeeze(u, axes)
        y = Relu(s)
    }""")
    assert collapse_chains(m.graph) == 1
    remove_dead_code(m.graph)
    assert ops(m) == ["Relu"]


def test_unsqueeze_of_unsqueeze_becomes_one_unsqueeze_with_both_axes():
    text = """g (float[2, 3] x) => (float[1, 2, 1, 1, 3, 1] y, float[2, 1, 3, 1, 1, 1] z) <int64[2] inner = {1, 3}, int64[2] outer = {0, 2}, int64[1] last = {2}, int64[1] again = {3}> {
        u = Unsqueeze(x, inner)
        y = Unsqueeze(u, outer)
        v = Unsqueeze(x, last)
        w = Unsqueeze(v, again)
        z = Unsqueeze(w, inner)
    }"""
    x = np.random.rand(2, 3).astype(np.float32)
    m = model(text)
    assert collapse_chains(m.graph) == 3
    remove_dead_code(m.graph)
    assert ops(m) == ["Unsqueeze", "Unsqueeze"]  # the chain of three too: its middle node went first
    expected = run(model(text), x=x)
    for got, want in zip(run(m, x=x), expected):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_unsqueeze_chains_with_negative_axes_are_left():
    m = model("""g (float[2, 3] x) => (float[2, 3, 1, 1] y) <int64[1] end = {-1}> {
        u = Unsqueeze(x, end)
        y = Unsqueeze(u, end)
    }""")
    assert collapse_chains(m.graph) == 0


def test_unsqueeze_of_a_squeeze_that_puts_the_axes_back_reads_the_squeeze_input():
    text = """g (float[2, 1, 3] x) => (float[2, 1, 1, 3] y, float[2, 1, 3] z, float[1, 2, 3] w) <int64[1] one = {1}, int64[2] spread = {1, 2}, int64[1] first = {0}> {
        s = Squeeze(x, one)
        y = Unsqueeze(s, spread)
        u = Unsqueeze(s, one)
        z = Relu(u)
        w = Unsqueeze(s, first)
    }"""
    x = np.random.rand(2, 1, 3).astype(np.float32)
    m = model(text)
    # y: x with one new axis; z: x itself; w moves the size-1 axis to the front: left alone.
    assert collapse_chains(m.graph) == 2
    remove_dead_code(m.graph)
    assert sorted(ops(m)) == ["Relu", "Squeeze", "Unsqueeze", "Unsqueeze"]
    for got, want in zip(run(m, x=x), run(model(text), x=x)):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
