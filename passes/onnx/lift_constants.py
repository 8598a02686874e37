"""Turn ``Constant`` nodes of a graph into initializers, so every later pass sees one
kind of constant (and they cost no node)."""

from __future__ import annotations

import onnx_ir as ir

from dynexport.passes.onnx.values import add_initializer

__all__ = ["lift_constants"]

_TENSOR_ATTRIBUTES = ("value", "value_float", "value_floats", "value_int", "value_ints")


def lift_constants(graph: ir.Graph) -> int:
    """Replace each tensor-valued ``Constant`` node with an initializer; return how many."""
    lifted = 0
    for node in list(graph):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attributes) != 1:
            continue
        output = node.outputs[0]
        name = next(iter(node.attributes))
        if name not in _TENSOR_ATTRIBUTES or output.is_graph_output():
            continue
        tensor = ir.convenience.get_const_tensor(output)
        if tensor is None:
            continue
        initializer = add_initializer(graph, tensor.numpy(), output.name or "const")
        output.replace_all_uses_with(initializer)
        graph.remove(node, safe=True)
        lifted += 1
    return lifted
