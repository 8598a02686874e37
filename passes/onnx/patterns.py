"""Small matchers the fusion passes share: operand trees of one associative op, constants close
to an expected number, and the pieces of normalization formulas."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import add_initializer, constant_array, constant_scalar, producer, single_consumer

__all__ = [
    "channel_vector",
    "is_number",
    "is_square_of",
    "last_axis_scale",
    "leaves",
    "mean_plus_epsilon",
    "per_channel_operand",
    "reduces_last_axis",
    "scaled_by_vector",
    "smallest_root",
]


def leaves(value: ir.Value, op_type: str, *, root: bool = True) -> list[ir.Value]:
    """The operands of the tree of ``op_type`` nodes (an associative, commutative op) that
    computes ``value``; inner nodes must have no other reader."""
    node = value.producer()
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return [value]
    if not root and single_consumer(value) is None:
        return [value]
    return [leaf for operand in node.inputs for leaf in leaves(operand, op_type, root=False)]


def smallest_root(start: ir.Value, op_type: str, accept, max_depth: int = 3) -> ir.Node | None:
    """Walk up from ``start`` through single readers of type ``op_type`` and return the first
    node whose operand tree ``accept`` approves."""
    value = start
    for _ in range(max_depth):
        node = single_consumer(value)
        if node is None or node.op_type != op_type:
            return None
        if accept(leaves(node.outputs[0], op_type)):
            return node
        value = node.outputs[0]
    return None


def is_number(value: ir.Value, expected: float, rel_tol: float = 1e-4) -> bool:
    """True when ``value`` is a one-element constant equal to ``expected`` up to ``rel_tol``."""
    number = constant_scalar(value)
    return number is not None and math.isclose(number, expected, rel_tol=rel_tol)


def reduces_last_axis(node: ir.Node | None, rank: int) -> bool:
    """True for a ReduceMean over the last axis only (of a rank-``rank`` input), keeping dims."""
    if node is None or node.op_type != "ReduceMean":
        return False
    if "keepdims" in node.attributes and not node.attributes["keepdims"].as_int():
        return False
    axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None and "axes" in node.attributes:
        axes = np.array(node.attributes["axes"].as_ints())
    return axes is not None and axes.size == 1 and int(axes.reshape(-1)[0]) in (-1, rank - 1)


def mean_plus_epsilon(sqrt: ir.Node | None) -> tuple[ir.Node, float] | None:
    """(the ReduceMean, eps) when ``sqrt`` computes ``Sqrt(ReduceMean(...) + eps)``."""
    add = producer(sqrt.inputs[0], "Add") if sqrt is not None else None
    if add is None:
        return None
    mean, epsilon = add.inputs if constant_scalar(add.inputs[1]) is not None else add.inputs[::-1]
    epsilon = constant_scalar(epsilon)
    mean = producer(mean, "ReduceMean")
    return (mean, epsilon) if mean is not None and epsilon is not None else None


def is_square_of(node: ir.Node | None, value: ir.Value) -> bool:
    """True when ``node`` computes ``value * value`` or ``value ** 2``."""
    if node is None:
        return False
    if node.op_type == "Mul":
        return node.inputs[0] is value and node.inputs[1] is value
    return node.op_type == "Pow" and node.inputs[0] is value and constant_scalar(node.inputs[1]) == 2.0


def scaled_by_vector(value: ir.Value, op_type: str = "Mul") -> tuple[ir.Node, ir.Value] | None:
    """(the node, the vector) when the one reader of ``value`` is ``op_type`` with a 1-D
    constant: a normalization's scale (Mul) or bias (Add)."""
    consumer = single_consumer(value)
    if consumer is None or consumer.op_type != op_type:
        return None
    other = consumer.inputs[1] if consumer.inputs[0] is value else consumer.inputs[0]
    array = constant_array(other)
    return (consumer, other) if array is not None and array.ndim == 1 else None


def last_axis_scale(graph: ir.Graph, x: ir.Value, name: str) -> ir.Value | None:
    """A scale of ones over ``x``'s last axis (for a fused norm that had none), or None when
    that axis is not static."""
    if x.shape is None or not isinstance(x.shape[-1], int):
        return None
    return add_initializer(graph, np.ones(x.shape[-1], dtype=x.dtype.numpy()), name)


def per_channel_operand(value: ir.Value, op_type: str, channels: int, rank: int) -> tuple[ir.Node, np.ndarray] | None:
    """(the node, the per-channel vector) when the one reader of ``value`` is ``op_type`` with a
    :func:`channel_vector` operand: a channel affine's scale (Mul) or shift (Add)."""
    node = single_consumer(value)
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        return None
    vector = channel_vector(node.inputs[1] if node.inputs[0] is value else node.inputs[0], channels, rank)
    return (node, vector) if vector is not None else None


def channel_vector(value: ir.Value, channels: int, rank: int) -> np.ndarray | None:
    """The ``channels`` numbers of a float32 or float64 constant that varies along dim 1 only of
    a rank-``rank`` tensor and broadcasts it to nothing larger, else None."""
    array = constant_array(value)
    if array is None or array.dtype not in (np.float32, np.float64) or array.ndim > rank or array.ndim < rank - 1:
        return None
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    if padded.shape[0] != 1 or padded.shape[1] not in (1, channels) or any(d != 1 for d in padded.shape[2:]):
        return None
    return np.broadcast_to(padded.reshape(-1), (channels,))
