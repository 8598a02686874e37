import numpy as np
import onnx
import torch

from dynexport.passes.onnx.fold_constants import fold_constants
from dynexport.passes.onnx.lift_constants import lift_constants
from tests.equivalence import assert_exports_equivalent, op_histogram
from tests.passes.graphs import model, ops, run

WEIGHT = "<float[2, 3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}>"


def test_a_chain_of_constant_nodes_folds_into_one_initializer():
    m = model("""g (float[3, 2] x) => (float[3, 2] y) """ + WEIGHT + """ {
        t = Transpose<perm = [1, 0]>(w)
        two = Constant<value = float {2.0}>()
        d = Mul(t, two)
        y = Add(x, d)
    }""")
    lift_constants(m.graph)
    assert fold_constants(m.graph, opset=20) == 2
    assert ops(m) == ["Add"]
    folded = m.graph.node(0).inputs[1].const_value.numpy()
    np.testing.assert_array_equal(folded, [[2, 8], [4, 10], [6, 12]])
    np.testing.assert_allclose(run(m, x=np.zeros((3, 2), np.float32))[0], folded)


def test_folding_never_duplicates_a_large_weight_that_stays_in_use():
    weight = ", ".join(["1.0"] * 1024)
    m = model(f"""g (float[1024] x) => (float[1024] y, float[1024] z) <float[1024] w = {{{weight}}}> {{
        n = Neg(w)
        y = Add(x, n)
        z = Mul(x, w)
    }}""")
    assert fold_constants(m.graph, opset=20) == 0
    assert ops(m) == ["Neg", "Add", "Mul"]
    assert fold_constants(m.graph, opset=20, small_bytes=1 << 20) == 1


def test_random_ops_and_non_constant_inputs_are_not_folded():
    m = model("""g (float[2] x) => (float[2] y) {
        r = RandomNormal<shape = [2]>()
        y = Add(x, r)
    }""")
    assert fold_constants(m.graph, opset=20) == 0
    assert ops(m) == ["RandomNormal", "Add"]


def test_a_small_weight_dequantization_is_kept_for_the_runtime_to_fuse():
    m = model("""g (float[2, 2] x) => (float[2, 3] y) <int8[2, 3] q = {1, -2, 3, 4, 5, -6}, float s = {0.5}> {
        w = DequantizeLinear(q, s)
        y = MatMul(x, w)
    }""")
    assert fold_constants(m.graph, opset=20) == 0
    assert ops(m) == ["DequantizeLinear", "MatMul"]


def test_transposed_weight_of_a_real_model_is_folded():
    model_ = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    x = torch.randn(2, 5, 4)
    program = assert_exports_equivalent(model_, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},), resized=[(torch.randn(3, 5, 4),)])
    assert "Transpose" not in op_histogram(program)
    unoptimized = assert_exports_equivalent(model_, (x,), do_constant_folding=False)
    assert op_histogram(unoptimized)["Transpose"] == 2


def test_transposed_torch_weight_folds_to_a_view_without_copying(tmp_path):
    linear = torch.nn.Linear(4, 8).eval()
    x = torch.randn(2, 5, 4)
    program = assert_exports_equivalent(linear, (x,))
    (weight,) = [v for v in program.model.graph.initializers.values() if v.const_value.shape == (4, 8)]
    assert weight.const_value.raw.data_ptr() == linear.weight.data_ptr()
    path = tmp_path / "linear.onnx"
    program.save(path)
    saved = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    np.testing.assert_array_equal(saved[weight.name], linear.weight.detach().numpy().T)


def test_folded_transpose_saved_as_external_data_in_row_blocks(tmp_path, monkeypatch):
    from dynexport import files as files_module

    monkeypatch.setattr(files_module, "_CHUNK_BYTES", 64)
    linear = torch.nn.Linear(64, 32).eval()
    program = assert_exports_equivalent(linear, (torch.randn(2, 5, 64),))
    path = tmp_path / "linear.onnx"
    program.save(path, external_data=True)
    loaded = onnx.load(str(path), load_external_data=False)
    (weight,) = [t for t in loaded.graph.initializer if tuple(t.dims) == (64, 32)]
    assert weight.data_location == onnx.TensorProto.EXTERNAL
    onnx.external_data_helper.load_external_data_for_tensor(weight, str(tmp_path))
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight), linear.weight.detach().numpy().T)


def test_many_strided_weights_saved_through_the_reused_blocks(tmp_path, monkeypatch):
    from dynexport import files as files_module

    monkeypatch.setattr(files_module, "_CHUNK_BYTES", 256)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(40, 40) for _ in range(4))).eval()
    program = assert_exports_equivalent(model, (torch.randn(2, 3, 40),))
    path = tmp_path / "stack.onnx"
    program.save(path, external_data=True)
    loaded = onnx.load(str(path))
    saved = sorted((t.name, onnx.numpy_helper.to_array(t)) for t in loaded.graph.initializer if tuple(t.dims) == (40, 40))
    expected = sorted(layer.weight.detach().numpy().T.tobytes() for layer in model)
    assert sorted(array.tobytes() for _, array in saved) == expected
