"""MatMul (+ Add) -> Gemm, for a 2-D left operand: ``MatMul(a, b) + c`` with ``c`` broadcasting
one way to the result, and ``MatMul(a, Transpose(w))`` with ``transB``."""

from __future__ import annotations

import onnx_ir as ir

from dynexport.passes.onnx.values import insert_replacement, nodes_of, producer, single_consumer

__all__ = ["fuse_gemm"]

_GEMM_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


def fuse_gemm(graph: ir.Graph) -> int:
    """Fuse every eligible MatMul of ``graph``; return how many."""
    fused = 0
    for matmul in nodes_of(graph, "MatMul"):
        a, b = matmul.inputs
        attributes = []
        transpose = producer(b, "Transpose")
        if transpose is not None and list(transpose.attributes["perm"].as_ints()) == [1, 0]:
            b = transpose.inputs[0]
            attributes.append(ir.AttrInt64("transB", 1))
        if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2 or a.dtype not in _GEMM_TYPES:
            continue
        add = single_consumer(matmul.outputs[0])
        columns = b.shape[0] if attributes else b.shape[1]
        bias = _bias(add, matmul.outputs[0], a.dtype, (a.shape[0], columns)) if add is not None else None
        if bias is not None:
            gemm = ir.Node("", "Gemm", [a, b, bias], attributes)
            fused += insert_replacement(graph, add, gemm, add.outputs[0])
        elif attributes:
            gemm = ir.Node("", "Gemm", [a, b], attributes)
            fused += insert_replacement(graph, matmul, gemm, matmul.outputs[0])
    return fused


def _bias(add: ir.Node, product: ir.Value, dtype: ir.DataType, dims: tuple) -> ir.Value | None:
    """The Add's other operand when Gemm's one-way broadcast of C gives the same result."""
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    bias = add.inputs[1] if add.inputs[0] is product else add.inputs[0]
    if bias is product or bias.shape is None or len(bias.shape) > 2 or bias.dtype != dtype:
        return None
    for bias_dim, dim in zip(reversed(bias.shape), reversed(dims)):
        if bias_dim != 1 and bias_dim != dim:
            return None
    return bias
