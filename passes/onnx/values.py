"""Reading constants and replacing values: what every pass over the onnx_ir graph needs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

__all__ = [
    "MICROSOFT_DOMAIN",
    "NONDETERMINISTIC_OPS",
    "add_initializer",
    "constant_array",
    "constant_scalar",
    "insert_replacement",
    "nodes_of",
    "producer",
    "reduction",
    "replace_value",
    "single_consumer",
    "values_by_name",
]

# onnxruntime's contrib operators, written only for target="onnxruntime".
MICROSOFT_DOMAIN = "com.microsoft"

# Ops whose result differs from run to run: never folded, never merged.
NONDETERMINISTIC_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)


def nodes_of(graph: ir.Graph, op_type: str) -> Iterator[ir.Node]:
    """The ``op_type`` nodes (default domain) of ``graph``, listed first so that a rewrite may
    change the graph; a node an earlier rewrite took out of the graph is skipped."""
    for node in list(graph):
        if node.op_type == op_type and node.domain in ("", "ai.onnx") and node.graph is not None:
            yield node


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's contents when it is a constant (an initializer that is not also a graph
    input, which a caller could override), else None."""
    if value is None or value.const_value is None or value.is_graph_input():
        return None
    return value.const_value.numpy()


def add_initializer(graph: ir.Graph, array: np.ndarray | ir.LazyTensor, name: str) -> ir.Value:
    """Register ``array`` (or a tensor made when it is read) as a new initializer named
    ``name`` (suffixed when taken)."""
    base, suffix = name or "folded", 0
    while name in graph.initializers or not name:
        suffix += 1
        name = f"{base}_{suffix}"
    if isinstance(array, ir.LazyTensor):
        tensor = array
        tensor.name = name
    else:
        # Copies only what is not already a C-contiguous array (a folded weight is one: 47 MB
        # for resnet18, whose copies were half of the optimizer's time). ir.Tensor, not
        # ir.tensor: its protocol checks took a tenth of weight quantization's time.
        tensor = ir.Tensor(np.asarray(array, order="C"), name=name)
    value = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def reduction(graph: ir.Graph, op_type: str, x: ir.Value, axes: list[int], opset: int) -> ir.Node:
    """A ReduceMean, ReduceMax, ... of ``x`` over ``axes`` keeping dims, not yet in the graph:
    axes as an input from opset 18, as an attribute before (ReduceSum, an input from 13, is not
    for this)."""
    keepdims = ir.AttrInt64("keepdims", 1)
    if opset < 18:
        return ir.Node("", op_type, [x], [ir.AttrInt64s("axes", axes), keepdims])
    return ir.Node("", op_type, [x, add_initializer(graph, np.array(axes, np.int64), "reduced_axes")], [keepdims])


def replace_value(old: ir.Value, new: ir.Value) -> bool:
    """Make every reader of ``old`` read ``new``; False (and nothing done) when ``old`` is a
    graph output that ``new`` cannot stand in for without an extra node."""
    # ``new`` computes the same tensor: whatever ``old`` was known to be, it is too.
    if new.type is None:
        new.type = old.type
    if new.shape is None:
        new.shape = old.shape
    if old.is_graph_output():
        if new.is_graph_input() or new.is_graph_output() or new.is_initializer() or new.graph is not old.graph:
            # A subgraph's output must come from one of its own nodes (see translate's
            # _subgraph_output), not from an enclosing graph.
            return False
        # An output's name and shape are the model's interface: its dims carry the names users
        # gave them (dynamic_axes), where ``new``'s carry the sizes they stand for.
        new.name, new.shape = old.name, old.shape
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        return True
    old.replace_all_uses_with(new)
    return True


def single_consumer(value: ir.Value) -> ir.Node | None:
    """The one node reading ``value``, when it has exactly one use and is no graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def constant_scalar(value: ir.Value | None) -> float | None:
    """The number a one-element constant holds, else None."""
    array = constant_array(value)
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    """The node of type ``op_type`` (default domain) that produces ``value``, else None."""
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def insert_replacement(graph: ir.Graph, anchor: ir.Node, node: ir.Node, old: ir.Value) -> bool:
    """Insert ``node`` before ``anchor`` and make its first output stand in for ``old`` (same
    type, shape and provenance metadata); False, and nothing changed, when it cannot."""
    output = node.outputs[0]
    output.type, output.shape = old.type, old.shape
    node.metadata_props.update(anchor.metadata_props)
    graph.insert_before(anchor, node)
    if replace_value(old, output):
        return True
    graph.remove(node)
    return False


def values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    """Every value of ``graph`` (node outputs, inputs, initializers) by its name."""
    values = {value.name: value for node in graph for value in node.outputs}
    values.update({value.name: value for value in graph.inputs})
    values.update(graph.initializers)
    return values
