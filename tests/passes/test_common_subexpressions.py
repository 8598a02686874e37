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


def _initializer_graph(tensors):
    """A graph whose outputs read each of ``tensors`` (name: torch tensor) through an Identity."""
    import onnx_ir as ir
    from onnx_ir.tensor_adapters import TorchTensor

    graph = ir.Graph([], [], nodes=[], opset_imports={"": 20})
    for name, data in tensors.items():
        dtype = ir.DataType.FLOAT if data.dtype.is_floating_point else ir.DataType.INT64
        value = ir.Value(name=name, shape=ir.Shape(data.shape), type=ir.TensorType(dtype), const_value=TorchTensor(data))
        graph.register_initializer(value)
        user = ir.node("Identity", [value])
        graph.append(user)
        graph.outputs.append(user.outputs[0])
    return graph


def test_deduplicate_initializers_merges_views_of_one_memory_and_compares_bits():
    import torch

    tied = torch.randn(64, 16)
    graph = _initializer_graph({
        "embedding": tied, "head": tied,  # a tied embedding and LM head: two names, one memory
        "zero": torch.zeros(8), "negative_zero": -torch.zeros(8),  # equal as numbers, not as bits
        "nan": torch.full((8,), float("nan")), "same_nan": torch.full((8,), float("nan")),
    })
    assert deduplicate_initializers(graph) == 2
    assert sorted(graph.initializers) == ["embedding", "nan", "negative_zero", "zero"]
    assert graph.outputs[1].producer().inputs[0].name == "embedding"


def test_deduplicate_initializers_compares_large_tensors_block_by_block(monkeypatch):
    import importlib

    import torch

    module = importlib.import_module("dynexport.passes.onnx.deduplicate_initializers")
    monkeypatch.setattr(module, "_BLOCK_BYTES", 1024)  # 4 rows of 64 floats per block
    monkeypatch.setattr(module, "_SAMPLE", 4)  # elements 0, 639, 1279 and 1919
    base = torch.randn(30, 64)
    last_row_differs = base.clone()
    last_row_differs[29, 62] += 1.0  # in the last, partial block; not sampled
    graph = _initializer_graph({"a": base, "b": base.clone(), "c": last_row_differs, "d": base.t().contiguous().t()})
    assert deduplicate_initializers(graph) == 2
    assert sorted(graph.initializers) == ["a", "c"]
