import numpy as np

from dynexport.passes.onnx.lift_constants import lift_constants
from tests.passes.graphs import model, ops, run


def test_constant_nodes_become_initializers():
    m = model("""g (float[2] x) => (float[2] y) {
        c = Constant<value = float[2] {1.0, 2.0}>()
        k = Constant<value_int = 3>()
        kf = Cast<to = 1>(k)
        s = Add(x, c)
        y = Mul(s, kf)
    }""")
    assert lift_constants(m.graph) == 2
    assert ops(m) == ["Cast", "Add", "Mul"]
    assert np.array_equal(m.graph.initializers["c"].const_value.numpy(), [1.0, 2.0])
    assert m.graph.initializers["k"].const_value.numpy() == 3
    np.testing.assert_allclose(run(m, x=np.array([1.0, 1.0], np.float32))[0], [6.0, 9.0])


def test_a_constant_that_is_a_graph_output_stays_a_node():
    m = model("""g (float[2] x) => (float[2] y) { y = Constant<value = float[2] {1.0, 2.0}>() }""")
    assert lift_constants(m.graph) == 0
    assert ops(m) == ["Constant"]
