"""The Gelu formulas -> one Gelu (opset 20): ``0.5 * x * (1 + erf(x / sqrt(2)))`` and its tanh
approximation ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, in any order of
the products."""

from __future__ import annotations

import math

import onnx_ir as ir

from dynexport.passes.onnx.patterns import is_number, leaves, smallest_root
from dynexport.passes.onnx.values import insert_replacement, producer, single_consumer

__all__ = ["fuse_gelu"]

_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def fuse_gelu(graph: ir.Graph, *, opset: int) -> int:
    """Replace every Gelu formula in ``graph`` (of a model at ``opset``); return how many (none
    below opset 20)."""
    if opset < 20:
        return 0
    fused = 0
    for node in list(graph):
        if node.op_type == "Erf":
            x, approximate = _erf_argument(node.inputs[0]), "none"
        elif node.op_type == "Tanh":
            x, approximate = _tanh_argument(node.inputs[0]), "tanh"
        else:
            continue
        if x is None or node.graph is None:
            continue
        one_plus = single_consumer(node.outputs[0])
        if one_plus is None or one_plus.op_type != "Add" or not any(is_number(v, 1.0) for v in one_plus.inputs):
            continue
        half = one_plus.outputs[0]

        def is_gelu(operands, x=x, half=half):
            rest = [v for v in operands if v is not x and v is not half]
            return len(operands) == 3 and len(rest) == 1 and x in operands and is_number(rest[0], 0.5)

        root = smallest_root(half, "Mul", is_gelu)
        if root is None:
            continue
        gelu = ir.Node("", "Gelu", [x], [ir.AttrString("approximate", approximate)])
        fused += insert_replacement(graph, root, gelu, root.outputs[0])
    return fused


def _erf_argument(value: ir.Value) -> ir.Value | None:
    """x, when ``value`` is ``x / sqrt(2)`` or ``x * (1 / sqrt(2))``."""
    divide = producer(value, "Div")
    if divide is not None and is_number(divide.inputs[1], _SQRT_2):
        return divide.inputs[0]
    operands = leaves(value, "Mul")
    if len(operands) == 2:
        for x, factor in (operands, operands[::-1]):
            if is_number(factor, 1 / _SQRT_2):
                return x
    return None


def _tanh_argument(value: ir.Value) -> ir.Value | None:
    """x, when ``value`` is ``sqrt(2 / pi) * (x + 0.044715 * x**3)``."""
    operands = leaves(value, "Mul")
    if len(operands) != 2:
        return None
    factor, inner = operands if is_number(operands[0], _SQRT_2_OVER_PI) else operands[::-1]
    add = producer(inner, "Add")
    if not is_number(factor, _SQRT_2_OVER_PI) or add is None:
        return None
    for x, cubic in (add.inputs, add.inputs[::-1]):
        terms = leaves(cubic, "Mul")
        coefficient = [v for v in terms if is_number(v, 0.044715)]
        powers = [v for v in terms if not is_number(v, 0.044715)]
        if len(coefficient) != 1:
            continue
        power = producer(powers[0], "Pow") if len(powers) == 1 else None
        if power is not None and power.inputs[0] is x and is_number(power.inputs[1], 3.0):
            return x
        if len(powers) == 3 and all(v is x for v in powers):
            return x
    return None
