"""Small matchers the fusion passes share: operand trees of one associative op, and constants
close to an expected number."""

from __future__ import annotations

import math

import onnx_ir as ir
from dynexport.passes.onnx.values import constant_scalar, single_consumer

__all__ = ["is_number", "leaves", "smallest_root"]


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
