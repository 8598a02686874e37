"""passes/onnx/pack_matmuls.py: products of one input by constant weights of their own become
one MatMul by the weights side by side and a Split (their bias Adds one Add), checked in
onnxruntime against eager at other batch sizes; weights read elsewhere, other inputs and other
row counts stay apart; packed weights quantize to one MatMulNBits."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

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


def _export(module: nn.Module, **options):
    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 16), torch.randn(2, 3, 16))
    batch = {0: Dim("batch")}
    resized = [(torch.randn(b, 3, 16), torch.randn(b, 3, 16)) for b in (1, 5)]
    return assert_exports_equivalent(module, inputs, dynamic_shapes=(batch, batch), resized=resized, **options)


def _nodes(program, op_type: str) -> list[onnx.NodeProto]:
    return [node for node in program.model_proto.graph.node if node.op_type == op_type]


def _initializer_shape(program, name: str) -> list[int]:
    (initializer,) = [i for i in program.model_proto.graph.initializer if i.name == name]
    return list(initializer.dims)


def test_products_of_one_input_become_one_matmul_and_a_split():
    program = _export(Projections().eval())
    histogram = op_histogram(program)
    assert histogram["MatMul"] == 2 and histogram["Split"] == 1  # q|k|v, and the other input's
    packed = [n for n in _nodes(program, "MatMul") if n.input[0] == "x"]
    assert len(packed) == 1 and _initializer_shape(program, packed[0].input[1]) == [16, 32]
    assert packed[0].input[1] == "q_k_v.weight"  # named after the modules it reads for


def test_bias_adds_are_packed_with_their_products():
    program = _export(Projections(bias=True).eval())
    histogram = op_histogram(program)
    assert histogram["MatMul"] == 2 and histogram["Add"] == 1 and histogram["Split"] == 1


def test_products_whose_biases_differ_in_kind_keep_their_adds():
    program = _export(Projections(mixed_bias=True).eval())
    histogram = op_histogram(program)
    assert histogram["MatMul"] == 2 and histogram["Split"] == 1 and histogram["Add"] == 1  # k's alone


def test_a_weight_read_by_another_product_stays_apart():
    program = _export(Projections(shared_weight=True).eval())
    # q and k packed; v's weight is also the other product's, which would store it twice.
    assert op_histogram(program)["MatMul"] == 3 and len(_nodes(program, "Split")) == 1


@pytest.mark.parametrize("opset", [13, 23])
def test_packing_at_the_lowest_and_highest_opsets(opset):
    program = _export(Projections(bias=True).eval(), opset_version=opset)
    assert op_histogram(program)["Split"] == 1


def test_without_optimization_nothing_is_packed():
    program = _export(Projections().eval(), optimize=False)
    assert "Split" not in op_histogram(program)


def test_packed_weights_quantize_to_one_matmul_nbits():
    program = _export(Projections().eval())
    quantized = program.quantize_weights(4, block_size=16)
    histogram = op_histogram(quantized)
    assert histogram["MatMulNBits"] == 2 and histogram["Split"] == 1 and "MatMul" not in histogram
    names = {i.name for i in quantized.model_proto.graph.initializer}
    assert {"q_k_v.weight.nbits.quantized", "other.weight.nbits.quantized"} <= names
    assert quantized.verify(torch.randn(2, 3, 16), torch.randn(2, 3, 16)).passed
