import numpy as np

from dynexport.passes.onnx.remove_no_ops import remove_no_ops
from tests.passes.graphs import model, ops, run


def test_identity_same_type_cast_identity_transpose_and_neutral_arithmetic_go():
    m = model("""g (float[2, 3] x) => (float[2, 3] y) <float zero = {0.0}, float one = {1.0}> {
        a = Identity(x)
        b = Cast<to = 1>(a)
        c = Transpose<perm = [0, 1]>(b)
        d = Add(zero, c)
        e = Mul(d, one)
        y = Relu(e)
    }""")
    x = np.random.rand(2, 3).astype(np.float32) - 0.5
    assert remove_no_ops(m.graph) == 5
    assert ops(m) == ["Relu"]
    np.testing.assert_array_equal(run(m, x=x)[0], np.maximum(x, 0))


def test_arithmetic_that_broadcasts_or_casts_stays():
    m = model("""g (float[3] x) => (float[2, 3] y, int32[3] z) <float[2, 1] zeros = {0.0, 0.0}> {
        y = Add(x, zeros)
        z = Cast<to = 6>(x)
    }""")
    assert remove_no_ops(m.graph) == 0
    assert ops(m) == ["Add", "Cast"]


def test_and_with_true_and_or_with_false_go_but_not_the_absorbing_constants():
    m = model("""g (bool[2, 3] x) => (bool[2, 3] y, bool[2, 3] z) <bool yes = {1}, bool no = {0}> {
        a = And(yes, x)
        b = Or(a, no)
        y = Not(b)
        c = And(x, no)
        z = Or(c, yes)
    }""")
    x = np.random.rand(2, 3) > 0.5
    assert remove_no_ops(m.graph) == 2
    assert ops(m) == ["Not", "And", "Or"]
    y, z = run(m, x=x)
    np.testing.assert_array_equal(y, ~x)
    np.testing.assert_array_equal(z, np.ones_like(x))
