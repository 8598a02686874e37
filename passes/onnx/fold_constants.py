"""Evaluate nodes whose inputs are all constants, with onnx's reference implementation.

A folded result becomes an initializer. Folding must never make the file larger: results are
kept only when they are small (``small_bytes``) or no larger than the constant inputs that die
with them (a transposed weight replaces the weight; gate slices of a weight, concatenated in
another order, replace it together).
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


def fold_constants(graph: ir.Graph, *, opset: int, small_bytes: int = SMALL_BYTES) -> int:
    """Fold every foldable node of ``graph`` (of a model at ``opset``, whose form of each op
    the evaluation reads); return how many nodes were folded.

    One forward sweep evaluates every node computable from constants, so chains fold whole.
    The size rule is then applied to each connected region of evaluated nodes: a region folds
    when its large results (over ``small_bytes``) are paid for by the constants only it reads
    (an LSTM weight sliced into gates and concatenated back, a weight scaled and reshaped).
    Otherwise its nodes fold one by one, each paid for by the inputs that die with it alone.
    """
    results: dict[ir.Value, np.ndarray] = {}
    evaluated: list[ir.Node] = []
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
        inputs = [_known_array(v, results) for v in node.inputs]
        if any(a is None for a, v in zip(inputs, node.inputs) if v is not None):
            continue
        outputs = _evaluate(node, inputs, opset)
        if outputs is not None:
            results.update(zip(node.outputs, outputs))
            evaluated.append(node)
    for region in _regions(evaluated):
        if _large_result_bytes(region, results, small_bytes) <= _bytes_only_read_by(region):
            folded += sum(_replace_by_results(graph, node, results) for node in region)
            continue
        for node in region:
            if any(v is not None and constant_array(v) is None for v in node.inputs):
                continue
            if sum(results[v].nbytes for v in node.outputs) <= max(small_bytes, _bytes_only_read_by([node])):
                folded += _replace_by_results(graph, node, results)
    return folded


def _known_array(value: ir.Value | None, results: dict[ir.Value, np.ndarray]) -> np.ndarray | None:
    if value is None:
        return None
    return results[value] if value in results else constant_array(value)


def _regions(nodes: list[ir.Node]) -> list[list[ir.Node]]:
    """``nodes`` split into groups connected through the values they pass each other, each in
    graph order."""
    group = {node: i for i, node in enumerate(nodes)}

    def root(i: int) -> int:
        while group[nodes[i]] != i:
            i = group[nodes[i]]
        return i

    for node in nodes:
        for value in node.inputs:
            source = value.producer() if value is not None else None
            if source in group:
                group[nodes[root(group[node])]] = root(group[source])
    regions: dict[int, list[ir.Node]] = {}
    for i, node in enumerate(nodes):
        regions.setdefault(root(i), []).append(node)
    return list(regions.values())


def _large_result_bytes(region: list[ir.Node], results: dict[ir.Value, np.ndarray], small_bytes: int) -> int:
    """Bytes of the region's results read outside it (the initializers folding adds), counting
    only the results over ``small_bytes``."""
    inside = set(region)
    total = 0
    for node in region:
        for value in node.outputs:
            read_outside = value.is_graph_output() or any(use.node not in inside for use in value.uses())
            if read_outside and results[value].nbytes > small_bytes:
                total += results[value].nbytes
    return total


def _bytes_only_read_by(region: list[ir.Node]) -> int:
    """Bytes of the constants (not computed in ``region``) that nothing outside it reads."""
    inside = set(region)
    seen, total = set(), 0
    for node in region:
        for value in node.inputs:
            if value is None or value in seen or value.producer() in inside or value.const_value is None:
                continue
            seen.add(value)
            if all(use.node in inside for use in value.uses()) and not value.is_graph_output():
                total += value.const_value.nbytes
    return total


def _replace_by_results(graph: ir.Graph, node: ir.Node, results: dict[ir.Value, np.ndarray]) -> bool:
    for output in node.outputs:
        replacement = add_initializer(graph, results[output], output.name or f"{node.op_type}_folded")
        if not replace_value(output, replacement):
            del graph.initializers[replacement.name]
            return False
    graph.remove(node, safe=True)
    return True


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


# A constant's dequantization stays a node: runtimes fuse it with its consumer into an integer
# kernel (QLinearConv, QGemm, MatMulNBits), which a folded float weight would undo.
_KEPT_FOR_QUANTIZED_KERNELS = frozenset({"DequantizeLinear"})


def _is_foldable(node: ir.Node) -> bool:
    return (
        node.domain in ("", "ai.onnx")
        and node.op_type not in NONDETERMINISTIC_OPS
        and node.op_type not in _KEPT_FOR_QUANTIZED_KERNELS
        and node.op_type != "Constant"
        and any(v is not None for v in node.inputs)
        and not any(isinstance(v.type, ir.SequenceType) for v in node.outputs)
        and not any(a.type == ir.AttributeType.GRAPH or a.type == ir.AttributeType.GRAPHS for a in node.attributes.values())
    )


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
