"""Higher-order operators: ``torch.cond`` as ``If``, ``while_loop`` as ``Loop``, ``scan`` and
``map`` as ``Scan``.

Their FX subgraphs go through the same table: ``ctx.subgraph`` opens the ONNX graph of a graph
attribute and ``ctx.call_graph`` translates an FX subgraph into whatever graph is open. A value
of an enclosing graph (an operand of the branch, a loop's invariant input, a weight) is read
from inside by name, which ONNX calls the outer scope.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from dynexport.dtypes import scalar_dtype
from dynexport.ops._helpers import scalar
from dynexport.registry import translates

higher_order = torch.ops.higher_order

_BOOL = ir.DataType.BOOL


def _results(result: ir.Value | tuple[ir.Value, ...]) -> list[ir.Value]:
    # The builder returns a single output bare; the operators' FX nodes always return a tuple.
    return [result] if isinstance(result, ir.Value) else list(result)


def _input_vals(module: torch.fx.GraphModule) -> list[Any]:
    return [node.meta["val"] for node in module.graph.nodes if node.op == "placeholder"]


@translates(higher_order.cond)
def cond(ctx, pred, true_graph, false_graph, operands):
    operands = list(operands)
    then_branch = ctx.subgraph("then_branch", [], lambda: ctx.call_graph(true_graph, operands, "then_branch"))
    else_branch = ctx.subgraph("else_branch", [], lambda: ctx.call_graph(false_graph, operands, "else_branch"))
    result = ctx.op.If(
        scalar(ctx, pred, _BOOL),
        then_branch=then_branch,
        else_branch=else_branch,
        _outputs=len(then_branch.outputs),
    )
    return _results(result)


@translates(higher_order.while_loop)
def while_loop(ctx, cond_graph, body_graph, carried_inputs, additional_inputs):
    # ONNX Loop tests its condition before the first iteration (an input) and after each one
    # (a body output): the condition graph is translated in both places.
    carried_vals = _input_vals(body_graph)[: len(carried_inputs)]
    carried = [
        value if isinstance(value, ir.Value) else ctx.constant(value, scalar_dtype(val))
        for value, val in zip(carried_inputs, carried_vals)
    ]
    invariant = list(additional_inputs)
    first_test = ctx.call_graph(cond_graph, carried + invariant, "cond")[0]
    iteration = ctx.value("iteration", 0)
    condition = ctx.value("condition", True)
    state = [
        _carried_input(ctx.value(f"carried_{i}", val), value)
        for i, (val, value) in enumerate(zip(carried_vals, carried))
    ]

    def body():
        updated = ctx.call_graph(body_graph, state + invariant, "body")
        test = ctx.call_graph(cond_graph, updated + invariant, "body_cond")[0]
        return [scalar(ctx, test, _BOOL), *updated]

    graph = ctx.subgraph("body", [iteration, condition, *state], body)
    result = ctx.op.Loop(None, scalar(ctx, first_test, _BOOL), *carried, body=graph, _outputs=len(carried))
    return _results(result)


def _carried_input(value: ir.Value, source: ir.Value) -> ir.Value:
    """A loop body's input ``value`` typed as the carried value's initial value ``source`` when
    that is a sequence: the FX graph only has the sequence's handle (the builder types the
    Loop's outputs so)."""
    if isinstance(source.type, ir.SequenceType):
        value.type, value.shape = source.type, None  # not the handle's shape
    return value


@translates(higher_order.scan)
def scan(ctx, combine_graph, init, xs, additional_inputs):
    # torch's scan runs along dim 0 of every xs (the Python wrapper moves dim and flips for
    # reverse), returns the last carry and the stacked per-step outputs: ONNX Scan exactly.
    vals = _input_vals(combine_graph)
    state = [ctx.value(f"carried_{i}", val) for i, val in enumerate(vals[: len(init)])]
    slices = [ctx.value(f"slice_{i}", val) for i, val in enumerate(vals[len(init) : len(init) + len(xs)])]
    graph = ctx.subgraph(
        "body", state + slices, lambda: ctx.call_graph(combine_graph, state + slices + list(additional_inputs), "body")
    )
    result = ctx.op.Scan(*init, *xs, body=graph, num_scan_inputs=len(xs), _outputs=len(graph.outputs))
    return _results(result)


@translates(higher_order.map_impl)
def map_impl(ctx, body_graph, xs, args):
    vals = _input_vals(body_graph)
    slices = [ctx.value(f"slice_{i}", val) for i, val in enumerate(vals[: len(xs)])]
    graph = ctx.subgraph("body", slices, lambda: ctx.call_graph(body_graph, slices + list(args), "body"))
    result = ctx.op.Scan(*xs, body=graph, num_scan_inputs=len(xs), _outputs=len(graph.outputs))
    return _results(result)
