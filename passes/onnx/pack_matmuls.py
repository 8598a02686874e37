"""MatMuls of one input by constant weights -> one MatMul by the weights side by side, then Split:
``MatMul(x, Wq), MatMul(x, Wk), MatMul(x, Wv)`` (a decoder's query, key and value projections;
its MLP's gate and up ones) become ``Split(MatMul(x, [Wq | Wk | Wv]), axis=-1)``, and, when each
product is read only by the Add of a constant bias ``[N_i]``, ``Split(MatMul(x, W) + [bq | bk |
bv])``. One product reads x once and the weights in one stream (one MatMulNBits once quantized).

Each weight must be a 2-D initializer ``[K, N_i]`` of x's dtype read by its product alone, so that
the packed weight replaces them without storing any twice.

Weight quantization (dynexport/quantize/graph.py) runs it before it stores the weights, so that a
group becomes one MatMulNBits: measured faster there (one quantization of the activations per
group at accuracy level 4). The optimizer does not run it on float graphs: one fp32 MatMul and a
Split measured no faster at decode and slower at a 128-token prefill (docs/optimizer.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import add_initializer, constant_array, nodes_of, replace_value, single_consumer

__all__ = ["ConcatenatedTensor", "pack_matmuls"]

_MODULE = "pkg.dynexport.module"  # the module a node was translated from (dynexport/translate.py)


def pack_matmuls(graph: ir.Graph, *, opset: int, accept: Callable[[ir.Node], bool] = lambda matmul: True) -> int:
    """Pack each group of MatMuls that read one input by their own constant weights (those
    ``accept`` takes); return how many products were packed."""
    if opset < 13:  # Split takes its sizes as an input from opset 13
        return 0
    groups: dict[int, list[ir.Node]] = {}
    for matmul in nodes_of(graph, "MatMul"):
        if _packable(matmul) and accept(matmul):
            groups.setdefault(id(matmul.inputs[0]), []).append(matmul)
    packed = 0
    for products in groups.values():
        by_rows: dict[int, list[ir.Node]] = {}
        for matmul in products:
            by_rows.setdefault(matmul.inputs[1].shape[0], []).append(matmul)
        for group in by_rows.values():
            if len(group) > 1:
                _pack(graph, group)
                packed += len(group)
    return packed


def _packable(matmul: ir.Node) -> bool:
    x, weight = matmul.inputs
    if x is None or x.shape is None or len(x.shape) < 2 or x.dtype is None:
        return False
    if constant_array(weight) is None or weight.shape is None or len(weight.shape) != 2 or weight.dtype != x.dtype:
        return False
    return len(list(weight.uses())) == 1 and not weight.is_graph_output()


def _bias(matmul: ir.Node) -> tuple[ir.Node, ir.Value] | None:
    """(the Add, its constant ``[N]`` bias) when ``matmul``'s product is read only by that Add."""
    product = matmul.outputs[0]
    add = single_consumer(product)
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    bias = add.inputs[1] if add.inputs[0] is product else add.inputs[0]
    array = constant_array(bias)
    if bias is product or array is None or array.shape != (matmul.inputs[1].shape[1],) or bias.dtype != product.dtype:
        return None
    return add, bias


def _pack(graph: ir.Graph, group: list[ir.Node]) -> None:
    x = group[0].inputs[0]
    weights = [matmul.inputs[1] for matmul in group]
    sizes = [weight.shape[1] for weight in weights]
    modules = [matmul.metadata_props.get(_MODULE) for matmul in group]
    module = _packed_name(modules) if None not in modules else None
    # Named after the modules (``...self_attn.q_proj_k_proj_v_proj.weight``) where the
    # translation recorded them: a quantized weight is named after its reader's module.
    names = [f"{module}.weight", f"{module}.bias"] if module else [None, None]
    packed = _concatenated(graph, weights, 1, names[0])
    nodes = [ir.Node("", "MatMul", [x, packed])]
    biases = [_bias(matmul) for matmul in group]
    replaced = group
    if None not in biases:
        packed_bias = _concatenated(graph, [bias for _, bias in biases], 0, names[1])
        nodes.append(ir.Node("", "Add", [nodes[0].outputs[0], packed_bias]))
        replaced = [add for add, _ in biases]
    for product in (node.outputs[0] for node in nodes):
        product.type = x.type
        if x.shape is not None:
            product.shape = ir.Shape([*x.shape[:-1], sum(sizes)])
    split_sizes = add_initializer(graph, np.array(sizes, np.int64), "split_sizes")
    axis = ir.AttrInt64("axis", -1)
    split = ir.Node("", "Split", [nodes[-1].outputs[0], split_sizes], [axis], num_outputs=len(group))
    nodes.append(split)
    for node in nodes:
        node.metadata_props.update(group[0].metadata_props)
        if module:
            node.metadata_props[_MODULE] = module
    graph.insert_before(group[0], nodes)
    for old, new in zip(replaced, split.outputs):
        replace_value(old.outputs[0], new)
    graph.remove(list(dict.fromkeys([*replaced, *group])), safe=True)


class ConcatenatedTensor(ir.LazyTensor):
    """Constant tensors side by side along ``axis``, concatenated only when read: weight
    quantization reads a packed weight from its parts (views of the model's parameters) and
    never makes the float copy."""

    def __init__(self, parts: list[ir.TensorProtocol], axis: int):
        shape = list(parts[0].shape)
        shape[axis] = sum(part.shape[axis] for part in parts)
        super().__init__(functools.partial(_concatenation, parts, axis), parts[0].dtype, ir.Shape(shape))
        self.parts, self.axis = parts, axis


def _concatenation(parts: list[ir.TensorProtocol], axis: int) -> ir.Tensor:
    return ir.tensor(np.concatenate([part.numpy() for part in parts], axis=axis))


def _concatenated(graph: ir.Graph, values: list[ir.Value], axis: int, name: str | None) -> ir.Value:
    tensor = ConcatenatedTensor([v.const_value for v in values], axis)
    return add_initializer(graph, tensor, name or _packed_name([v.name or "" for v in values]))


def _packed_name(names: list[str]) -> str:
    """``a.q.weight``, ``a.k.weight`` -> ``a.q_k.weight``: the names' shared dotted prefix and
    suffix around their differing parts."""
    parts = [name.split(".") for name in names]
    prefix = 0
    while all(len(p) > prefix + 1 for p in parts) and len({p[prefix] for p in parts}) == 1:
        prefix += 1
    suffix = 0
    while all(len(p) > prefix + suffix + 1 for p in parts) and len({p[-1 - suffix] for p in parts}) == 1:
        suffix += 1
    middles = ["_".join(p[prefix : len(p) - suffix]) for p in parts]
    return ".".join([*parts[0][:prefix], "_".join(middles), *parts[0][len(parts[0]) - suffix :]])
