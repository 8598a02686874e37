import numpy as np

from dynexport.passes.onnx.common_subexpressions import eliminate_common_subexpressions
from dynexport.passes.onnx.deduplicate_initializers import deduplicate_initializers
from tests.passes.graphs import model, ops, run


def test_repeated_computations_are_computed_once():
    m = model("""g (float[3] x) => (float[3] y) {
        a = Relu(x)
        b = Relu(x)
        c = Softmax<axis = 0>(a)
        d = Softmax<axis = 0>(b)
        e = Softmax<axis = -1>(b)
        s = Add(c, d)
        y = Add(s, e)
    }""")
    assert eliminate_common_subexpressions(m.graph) == 2
    assert ops(m) == ["Relu", "Softmax", "Softmax", "Add", "Add"]
    x = np.array([1.0, -2.0, 3.0], np.float32)
    assert run(m, x=x)[0].shape == (3,)


def test_random_ops_are_never_merged():
    m = model("""g (float[2] x) => (float[2] y) {
        a = RandomUniform<shape = [2]>()
        b = RandomUniform<shape = [2]>()
        y = Add(a, b)
    }""")
    assert eliminate_common_subexpressions(m.graph) == 0


def test_equal_initializers_merge_then_their_readers_merge():
    m = model("""g (float[2] x) => (float[2] y) <float[2] p = {1.0, 2.0}, float[2] q = {1.0, 2.0}, float[2] r = {2.0, 1.0}> {
        a = Add(x, p)
        b = Add(x, q)
        c = Add(a, b)
        y = Add(c, r)
    }""")
    assert deduplicate_initializers(m.graph) == 1
    assert sorted(m.graph.initializers) == ["p", "r"]
    assert eliminate_common_subexpressions(m.graph) == 1
    np.testing.assert_allclose(run(m, x=np.zeros(2, np.float32))[0], [4.0, 5.0])


def test_deduplicate_initializers_compares_views_and_samples_exactly():
    import numpy as np
    import onnx_ir as ir
    import torch
    from onnx_ir.tensor_adapters import TorchTensor

    from dynexport.passes.onnx.deduplicate_initializers import deduplicate_initializers

    base = torch.randn(100, 80)
    almost = base.t().clone()
    almost[57, 3] += 1.0  # differs outside every sampled element
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 20})
    names = {"a": base.t(), "b": base.t().contiguous(), "c": almost}
    for name, data in names.items():
        value = ir.Value(name=name, shape=ir.Shape(data.shape), type=ir.TensorType(ir.DataType.FLOAT), const_value=TorchTensor(data))
        graph.register_initializer(value)
    users = [ir.node("Identity", [graph.initializers[n]]) for n in names]
    for user in users:
        graph.append(user)
        graph.outputs.append(user.outputs[0])
    assert deduplicate_initializers(graph) == 1
    assert sorted(graph.initializers) == ["a", "c"]
    np.testing.assert_array_equal(users[1].inputs[0].const_value.numpy(), base.t().numpy())
