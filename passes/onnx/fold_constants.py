"""Evaluate nodes whose inputs are all constants, with onnx's reference implementation.

A folded result becomes an initializer. Folding must never make the file larger: a result is
kept only when it is small (``small_bytes``) or no larger than the constant inputs that die
with the node (a transposed weight replaces the weight).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx_ir.tensor_adapters import TorchTensor

from dynexport.passes.onnx.values import (
    NONDETERMINISTIC_OPS,
    add_initializer,
    constant_array,
    replace_value,
)

__all__ = ["SMALL_BYTES", "fold_constants"]

SMALL_BYTES = 1024


def fold_constants(graph: ir.Graph, *, small_bytes: int = SMALL_BYTES) -> int:
    """Fold every foldable node of ``graph`` (in one forward sweep, so chains fold whole);
    return how many nodes were folded."""
    opset = graph.opset_imports.get("", 20)
    folded = 0
    for node in list(graph):
        if not _is_foldable(node):
            continue
        view = _torch_view(node)
        if view is not None:
            if replace_value(node.outputs[0], _add_torch_initializer(graph, view, node.outputs[0])):
                graph.remove(node, safe=True)
                folded += 1
            continue
        inputs = [constant_array(v) if v is not None else None for v in node.inputs]
        if any(a is None for a, v in zip(inputs, node.inputs) if v is not None):
            continue
        results = _evaluate(node, inputs, opset)
        if results is None or sum(r.nbytes for r in results) > max(small_bytes, _freed_bytes(node)):
            continue
        for output, result in zip(node.outputs, results):
            replacement = add_initializer(graph, result, output.name or f"{node.op_type}_folded")
            if not replace_value(output, replacement):
                del graph.initializers[replacement.name]
                break
        else:
            graph.remove(node, safe=True)
            folded += 1
    return folded


def _torch_view(node: ir.Node):
    """A weight's transpose or reshape as a torch view of it, when the weight is a torch tensor
    that nothing else reads: folding it then copies nothing until the file is written."""
    if node.op_type not in ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten"):
        return None
    source = node.inputs[0]
    tensor = source.const_value if source is not None else None
    if not isinstance(tensor, TorchTensor) or source.is_graph_input() or len(source.uses()) != 1:
        return None
    data = tensor.raw
    if node.op_type == "Transpose":
        perm = node.attributes["perm"].as_ints() if "perm" in node.attributes else list(reversed(range(data.dim())))
        return data.permute(*perm)
    shape = node.outputs[0].shape
    if shape is None or not all(isinstance(d, int) for d in shape) or any(
        v is not None and constant_array(v) is None for v in node.inputs[1:]
    ):
        return None
    return data.reshape(tuple(shape))


def _add_torch_initializer(graph: ir.Graph, data, output: ir.Value) -> ir.Value:
    name, suffix = output.name or "folded", 0
    while name in graph.initializers:
        suffix += 1
        name = f"{output.name}_{suffix}"
    value = ir.Value(name=name, shape=ir.Shape(data.shape), type=output.type, const_value=TorchTensor(data, name=name))
    graph.register_initializer(value)
    return value


def _is_foldable(node: ir.Node) -> bool:
    return (
        node.domain in ("", "ai.onnx")
        and node.op_type not in NONDETERMINISTIC_OPS
        and node.op_type != "Constant"
        and any(v is not None for v in node.inputs)
        and not any(isinstance(v.type, ir.SequenceType) for v in node.outputs)
        and not any(a.type == ir.AttributeType.GRAPH or a.type == ir.AttributeType.GRAPHS for a in node.attributes.values())
    )


def _freed_bytes(node: ir.Node) -> int:
    """Bytes of the node's constant inputs that nothing else reads."""
    seen, total = set(), 0
    for value in node.inputs:
        if value is None or id(value) in seen:
            continue
        seen.add(id(value))
        if all(use.node is node for use in value.uses()) and not value.is_graph_output():
            total += value.const_value.nbytes
    return total


def _evaluate(node: ir.Node, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    proto = ir.serde.serialize_node(node)
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(node.inputs)]
    del proto.input[:]
    proto.input.extend(names)
    try:
        evaluator = ReferenceEvaluator(proto, opsets={"": opset})
        results = evaluator.run(None, {n: a for n, a in zip(names, inputs) if n})
    except Exception:  # an op or dtype the reference implementation lacks: leave the node be
        return None
    results = [np.asarray(r) for r in results]
    if any(r.dtype == object for r in results) or len(results) != len(node.outputs):
        return None
    for output, result in zip(node.outputs, results):
        if output.dtype is not None and result.dtype != output.dtype.numpy():
            return None
    return results
