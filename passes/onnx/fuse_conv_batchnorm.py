"""Conv -> BatchNormalization (inference) with constant parameters -> one Conv.

The new weights are written as ONNX arithmetic on the old ones (``W * scale / sqrt(var + eps)``
and the matching bias); constant folding, which runs after the fusions, evaluates them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import (
    add_initializer,
    constant_array,
    insert_replacement,
    nodes_of,
    producer,
    single_consumer,
)

__all__ = ["fuse_conv_batchnorm"]


def fuse_conv_batchnorm(graph: ir.Graph) -> int:
    """Fold each eligible BatchNormalization into the Conv before it; return how many."""
    fused = 0
    for norm in nodes_of(graph, "BatchNormalization"):
        if any(v.uses() or v.is_graph_output() for v in norm.outputs[1:]):
            continue
        if "training_mode" in norm.attributes and norm.attributes["training_mode"].as_int():
            continue
        conv = producer(norm.inputs[0], "Conv")
        if conv is None or single_consumer(conv.outputs[0]) is not norm:
            continue
        weight = conv.inputs[1]
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        parameters = [weight, bias, *norm.inputs[1:5]]
        if any(constant_array(v) is None for v in parameters if v is not None):
            continue
        fused += _fuse(graph, conv, norm)
    return fused


def _fuse(graph: ir.Graph, conv: ir.Node, norm: ir.Node) -> bool:
    weight = conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    scale, shift, mean, var = norm.inputs[1:5]
    dtype = var.dtype.numpy()
    epsilon = norm.attributes["epsilon"].as_float() if "epsilon" in norm.attributes else 1e-5
    eps = add_initializer(graph, np.array(epsilon, dtype=dtype), "bn_epsilon")
    weight_shape = add_initializer(graph, np.array([-1] + [1] * (len(weight.shape) - 1), dtype=np.int64), "bn_weight_shape")
    nodes = []

    def op(op_type: str, *inputs: ir.Value) -> ir.Value:
        nodes.append(ir.Node("", op_type, inputs))
        return nodes[-1].outputs[0]

    factor = op("Div", scale, op("Sqrt", op("Add", var, eps)))
    new_weight = op("Mul", weight, op("Reshape", factor, weight_shape))
    centered = op("Sub", bias, mean) if bias is not None else op("Neg", mean)
    new_bias = op("Add", op("Mul", centered, factor), shift)
    for node in nodes:
        node.metadata_props.update(norm.metadata_props)
    graph.insert_before(norm, nodes)
    fused_conv = ir.Node("", "Conv", [conv.inputs[0], new_weight, new_bias], conv.attributes.values())
    if insert_replacement(graph, norm, fused_conv, norm.outputs[0]):
        return True
    graph.remove(nodes)
    return False
