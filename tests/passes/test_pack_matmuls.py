"""passes/onnx/pack_matmuls.py, run by weight quantization: products of one input by constant
weights of their own become one quantized product of the weights side by side and a Split (their
bias Adds one bias), checked in onnxruntime against the float graph and eager at other batch
sizes; weights read elsewhere, other inputs and output projections left float stay apart; float
graphs are not packed."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dynexport.passes.onnx.pack_matmuls import ConcatenatedTensor, pack_matmuls
from tests.equivalence import assert_exports_equivalent, op_histogram

Dim = torch.export.Dim


class Projections(nn.Module):
    """q, k, v projections of one input (k and v narrower), optionally with biases, and a
    product of another input by a weight of the same shape."""

    def __init__(self, bias: bool = False, mixed_bias: bool = False, shared_weight: bool = False):
        super().__init__()
        self.q = nn.Linear(16, 16, bias=bias)
        self.k = nn.Linear(16, 8, bias=bias or mixed_bias)
        self.v = nn.Linear(16, 8, bias=bias)
        self.other = nn.Linear(16, 8, bias=False)
        if shared_weight:
            self.other.weight = self.v.weight  # v's weight is also read by another product

    def forward(self, x, y):
        return self.q(x), self.k(x).relu(), self.v(x) * 2, self.other(y)


def _calls(*batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(b, 3, 16), torch.randn(b, 3, 16)) for b in batches]


def _export(module: nn.Module, **options):
    torch.manual_seed(0)
    batch = {0: Dim("batch")}
    (call, *resized) = _calls(2, 1, 5)
    return assert_exports_equivalent(module.eval(), call, dynamic_shapes=(batch, batch), resized=resized, **options)


def _quantized(program, **options):
    quantized = program.quantize_weights(4, block_size=16, **options)
    report = quantized.verify(*_calls(2)[0], resized=_calls(1, 5))
    assert report.passed, report
    return quantized


def _initializer_names(program) -> set[str]:
    return {initializer.name for initializer in program.model_proto.graph.initializer}


def test_float_graphs_are_not_packed():
    assert "Split" not in op_histogram(_export(Projections()))


def test_products_of_one_input_quantize_as_one_matmul_nbits_and_a_split():
    quantized = _quantized(_export(Projections()))
    assert op_histogram(quantized) == {"MatMulNBits": 2, "Split": 1, "Relu": 1, "Mul": 1}  # q|k|v, other
    # Named after the modules they were packed from.
    assert {"q_k_v.weight.nbits.quantized", "other.weight.nbits.quantized"} <= _initializer_names(quantized)


def test_the_packed_weight_is_concatenated_only_when_read():
    # No float copy of the packed weights: quantization reads the parts (the parameters' views).
    model = _export(Projections()).model.clone()
    weights_of_x = lambda: [
        node.inputs[1].const_value for node in model.graph if node.op_type == "MatMul" and node.inputs[0].name == "x"
    ]
    q_k_v = weights_of_x()
    assert pack_matmuls(model.graph, opset=model.opset_imports[""]) == 3
    (packed,) = weights_of_x()
    assert isinstance(packed, ConcatenatedTensor) and packed.axis == 1 and list(packed.shape) == [16, 32]
    assert len(packed.parts) == 3 and all(part is weight for part, weight in zip(packed.parts, q_k_v))
    np.testing.assert_array_equal(packed.numpy(), np.concatenate([weight.numpy() for weight in q_k_v], axis=1))


def test_the_portable_form_dequantizes_the_packed_weight_once():
    quantized = _quantized(_export(Projections(), opset_version=21), target="portable")
    histogram = op_histogram(quantized)
    assert histogram["DequantizeLinear"] == 2 and histogram["MatMul"] == 2 and histogram["Split"] == 1


def test_bias_adds_are_packed_with_their_products():
    quantized = _quantized(_export(Projections(bias=True)))
    # The packed bias is MatMulNBits' bias input; the other product has none.
    assert op_histogram(quantized) == {"MatMulNBits": 2, "Split": 1, "Relu": 1, "Mul": 1}


def test_products_whose_biases_differ_in_kind_keep_their_adds():
    histogram = op_histogram(_quantized(_export(Projections(mixed_bias=True))))
    assert histogram["MatMulNBits"] == 2 and histogram["Split"] == 1 and histogram["Add"] == 1  # k's alone


def test_a_weight_read_by_another_product_stays_apart():
    histogram = op_histogram(_quantized(_export(Projections(shared_weight=True))))
    # q and k packed; v's weight is also the other product's, which would store it twice.
    assert histogram["MatMulNBits"] == 3 and histogram["Split"] == 1


class TwoHeads(nn.Module):
    """Two output projections of one hidden state."""

    def __init__(self):
        super().__init__()
        self.hidden, self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8, bias=False), nn.Linear(16, 8, bias=False)

    def forward(self, x, y):
        hidden = self.hidden(x + y).relu()
        return self.a(hidden), self.b(hidden)


def test_output_projections_left_float_are_not_packed():
    program = _export(TwoHeads())
    kept = _quantized(program, lm_head=False)
    assert op_histogram(kept) == {"Add": 1, "MatMulNBits": 1, "Relu": 1, "MatMul": 2}
    assert op_histogram(_quantized(program))["Split"] == 1
