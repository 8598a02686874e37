"""TorchScript models as ExportedPrograms: the front end of ``export(..., dynamo=False)``.

A ``ScriptModule`` or ``ScriptFunction`` (or, with ``dynamo=False``, any module, first traced by
``torch.jit.trace``: loops unroll, shapes are those of the trace) is converted node by node into
an FX GraphModule by torch's TorchScript converter (``torch._export.converter``); torch.export then
captures that GraphModule like any other model, so the rest of the pipeline sees an ordinary
ExportedProgram.

torch's converter turns ``prim::If`` into ``torch.cond`` but unrolls ``prim::Loop`` while it builds
the graph, which needs a trip count known before any input is seen. Here ``prim::Loop`` becomes a
call of :func:`run_loop` instead, which decides while torch.export traces, when the trip count
is known: a Python int unrolls, a symbolic one (``int(tensor)``, a dynamic size) becomes
``torch.while_loop``, and so does every loop whose condition the body computes (``while``,
``break``).
"""

from __future__ import annotations

import inspect
import itertools
import linecache
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._export import converter as ts_converter
from torch._higher_order_ops.while_loop import while_loop

from dynexport.errors import CaptureError, TorchScriptConversionError

__all__ = ["capture", "graph_module", "is_torchscript", "run_loop"]

_STRATEGY = "torch.export(strict=False) of the TorchScript graph"


def is_torchscript(model: Any) -> bool:
    """Whether ``model`` is compiled TorchScript (scripted or traced)."""
    return isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction))


def graph_module(model: Any, args: tuple, kwargs: dict) -> tuple[torch.fx.GraphModule, tuple]:
    """``model``'s TorchScript graph as an FX GraphModule whose ``forward`` takes the model's
    arguments (same names), with the call's arguments bound to them: TorchScript passes every
    argument positionally, defaults included. A model that is not TorchScript is traced first.

    Raises:
        CaptureError: ``torch.jit.trace`` failed on the model.
        TorchScriptConversionError: the graph holds a construct with no FX form.
    """
    if not is_torchscript(model):
        model = _traced(model, args, kwargs)
    arguments = _schema(model).arguments
    if isinstance(model, torch.jit.ScriptModule):
        arguments = arguments[1:]  # self
    positional = _bind(arguments, args, kwargs)
    module = _ScriptConverter(model, positional).graph_module()
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    for node, argument in zip(placeholders, arguments):
        node.name = node.target = argument.name
    module.recompile()
    return module, positional


def capture(
    module: torch.fx.GraphModule, args: tuple, kwargs: dict, dynamic_shapes: Any
) -> tuple[torch.export.ExportedProgram, str]:
    """Capture the GraphModule made by :func:`graph_module` with torch.export (non-strict: the
    graph is already ATen, there is no Python left to analyse)."""
    try:
        program = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except TorchScriptConversionError:
        raise
    except Exception as error:
        raise CaptureError({_STRATEGY: error}) from error
    return program, _STRATEGY


def _traced(model: Any, args: tuple, kwargs: dict) -> torch.jit.ScriptModule:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"dynamo=False exports an nn.Module or TorchScript, got {type(model).__name__}; "
            "wrap the function in an nn.Module or drop dynamo=False"
        )
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    for name, value in bound.arguments.items():
        if any(not isinstance(leaf, torch.Tensor) for leaf in torch.utils._pytree.tree_leaves(value)):
            raise TypeError(
                f"dynamo=False traces the model with torch.jit.trace, which takes tensors only; "
                f"argument {name!r} is {type(value).__name__}: pass it as a tensor, or drop dynamo=False"
            )
    try:
        return torch.jit.trace(model, tuple(bound.arguments.values()), check_trace=False, strict=False)
    except Exception as error:
        raise CaptureError(
            {"torch.jit.trace": error},
            hint="dynamo=False traces the model with torch.jit.trace, which takes tensors (and "
            "tuples, lists and dicts of them) only.",
        ) from error


def _schema(model: Any) -> torch.FunctionSchema:
    if isinstance(model, torch.jit.ScriptFunction):
        return model.schema
    forward = getattr(model, "forward", None)
    if not hasattr(forward, "schema"):
        raise TypeError(f"{type(model).__name__} has no scripted forward method; script or trace its forward")
    return forward.schema


def _bind(arguments: Sequence[torch.Argument], args: tuple, kwargs: dict) -> tuple:
    """All of a TorchScript call's arguments, in order: TorchScript graphs take every argument
    positionally, defaults included."""
    if len(args) > len(arguments):
        raise TypeError(f"the model takes {len(arguments)} arguments, got {len(args)} positional ones")
    known = {argument.name for argument in arguments}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"the model has no argument(s) {unknown}; its arguments are {sorted(known)}")
    values = list(args)
    for argument in arguments[len(args):]:
        if argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            raise TypeError(f"missing the model's argument {argument.name!r}")
    return tuple(values)


class _ScriptConverter(ts_converter.TS2EPConverter):
    """torch's converter with our graph converter; the capture is :func:`capture`'s."""

    def graph_module(self) -> torch.fx.GraphModule:
        lifted_attributes, attribute_names = ts_converter.get_block_to_lifted_attrs(self.ts_graph)
        converter = _GraphConverter(
            self.ts_graph,
            self.name_to_param,
            self.name_to_buffer,
            lifted_attributes,
            self.name_to_non_tensor_attributes,
            self.name_to_constant,
            attribute_names,
        )
        return converter.convert()


class _GraphConverter(ts_converter.TS2FXGraphConverter):
    """Converts one TorchScript graph or block; ``prim::Loop`` becomes a :func:`run_loop` call and
    every FX node records its TorchScript source line as its stack trace."""

    def convert_node(self, node: torch._C.Node) -> None:
        before = len(self.fx_graph.nodes)
        try:
            super().convert_node(node)
        except RuntimeError as error:
            cause = error
            while cause.__cause__ is not None and not isinstance(cause, TorchScriptConversionError):
                cause = cause.__cause__
            if isinstance(cause, TorchScriptConversionError):
                raise cause from None
            raise TorchScriptConversionError(node.kind(), script_source(node), str(cause), _HINT) from error
        trace = _stack_trace(node)
        if trace:
            for added in itertools.islice(reversed(self.fx_graph.nodes), len(self.fx_graph.nodes) - before):
                added.meta.setdefault("stack_trace", trace)

    def convert_call_function_op(self, node: torch._C.Node) -> None:
        python_operator = _SCALAR_OPERATORS.get(node.kind())
        if python_operator is None or any(
            value.type().isSubtypeOf(torch._C.TensorType.get()) for value in node.inputs()
        ):
            super().convert_call_function_op(node)
            return
        # Scalar arithmetic on ints that may be symbolic (`int(t) > 0`): aten's int overloads
        # take no SymInt, Python's operators do.
        inputs = [self.get_fx_value_by_ir_value(value) for value in node.inputs()]
        self.name_to_node[node.output().debugName()] = self.fx_graph.call_function(python_operator, tuple(inputs))

    def _convert_block_to_subgraph(
        self, node: torch._C.Node, arguments: list[str]
    ) -> tuple[list[torch.fx.Node], list[_GraphConverter]]:
        # torch's version converts blocks with its own converter class, not this one.
        graphs, converters = [], []
        for block in node.blocks():
            converter = _GraphConverter(
                block,
                self.name_to_param,
                self.name_to_buffer,
                self.blocks_to_lifted_attrs,
                {},
                self.name_to_constant,
                self.name_to_attribute_fqn,
            )
            for name in arguments:
                converter.name_to_node[name] = converter.fx_graph.placeholder(ts_converter.normalize_name(name))
            graphs.append(self.fx_graph.get_attr(self.add_subgraph(converter.convert())))
            converters.append(converter)
        return graphs, converters

    def convert_prim_Loop(self, node: torch._C.Node) -> None:
        trip_count, condition, *carried = node.inputs()
        body = next(node.blocks())
        captured = sorted(self._identify_inputs_as_arguments(node) | self.blocks_to_lifted_attrs[body])
        (body_graph,), (body_converter,) = self._convert_block_to_subgraph(node, captured)
        updated = list(body_converter.name_update_from_subblock_to_parent)
        if not self.is_top_level_graph():
            self.name_update_from_subblock_to_parent |= body_converter.name_update_from_subblock_to_parent

        # A counted loop (`for`, no `break`) needs no condition: None stands for "always true".
        counted = all(_is_true(value) for value in (condition, next(body.outputs())))
        source = trip_count.node()
        if (
            source.kind() == "aten::Int"
            and source.input().type().isSubtypeOf(torch._C.TensorType.get())
            and source.input().debugName() in self.name_to_node
        ):
            # `range(int(t))`: the tensor itself bounds the loop, no data-dependent Python int.
            trip_count_arg = self.get_fx_value_by_ir_value(source.input())
        else:
            trip_count_arg = self.get_fx_value_by_ir_value(trip_count)
        loop = self.fx_graph.call_function(
            run_loop,
            (
                body_graph,
                trip_count_arg,
                None if counted else self.get_fx_value_by_ir_value(condition),
                len(carried),
                tuple(captured.index(name) if name in captured else -1 for name in updated),
                script_source(node) or "",
                *(self.get_fx_value_by_ir_value(value) for value in carried),
                *(self.get_fx_value_by_fqn(name) for name in captured),
            ),
        )
        for index, output in enumerate(node.outputs()):
            self.name_to_node[output.debugName()] = self.fx_graph.call_function(operator.getitem, (loop, index))
        for index, name in enumerate(updated, start=len(carried)):
            if name in captured:
                self.name_to_node[name] = self.fx_graph.call_function(operator.getitem, (loop, index))


_SCALAR_OPERATORS: dict[str, Callable[..., Any]] = {
    "aten::add": operator.add,
    "aten::sub": operator.sub,
    "aten::mul": operator.mul,
    "aten::floordiv": operator.floordiv,
    "aten::remainder": operator.mod,
    "aten::neg": operator.neg,
    "aten::lt": operator.lt,
    "aten::le": operator.le,
    "aten::gt": operator.gt,
    "aten::ge": operator.ge,
    "aten::eq": operator.eq,
    "aten::ne": operator.ne,
    "aten::__and__": operator.and_,
    "aten::__or__": operator.or_,
}

_HINT = (
    "export the model from its Python source instead (drop dynamo=False, or pass the module "
    "rather than its torch.jit.script), using torch.cond / torch.while_loop for control flow"
)


def run_loop(
    body: Callable[..., Any],
    trip_count: int | torch.SymInt | torch.Tensor,
    condition: bool | torch.Tensor | None,
    carried_count: int,
    updated_captures: tuple[int, ...],
    source: str,
    *values: Any,
) -> list[Any]:
    """TorchScript's ``prim::Loop`` while torch.export traces it: ``body(*captured, i, *carried)``
    returns ``(condition, *carried, *updated captured lists)``; the loop runs while
    ``i < trip_count`` and the condition (None: a counted loop) holds. Returns the carried values, then the captured
    values the body updated in place (lists it appended to)."""
    carried, captured = list(values[:carried_count]), list(values[carried_count:])
    if isinstance(trip_count, int) and (condition is None or isinstance(condition, (bool, int))):
        return _unrolled(body, trip_count, condition is None or bool(condition), carried, captured, updated_captures, source)
    return _while_loop(body, trip_count, condition, carried, captured, updated_captures, source)


def _unrolled(body, trip_count, condition, carried, captured, updated_captures, source) -> list[Any]:
    iteration = 0
    while iteration < trip_count and condition:
        outputs = _as_list(body(*captured, iteration, *carried))
        condition, carried = outputs[0], outputs[1 : 1 + len(carried)]
        for position, value in zip(updated_captures, outputs[1 + len(carried) :]):
            if position >= 0:
                captured[position] = value
        if isinstance(condition, torch.Tensor):
            raise TorchScriptConversionError(
                "prim::Loop",
                source or None,
                "the loop runs a trip count known at export, but its condition (a `while` "
                "test or a `break`) depends on tensor values",
                "compute the condition from Python ints, or give the loop a tensor trip count",
            )
        iteration += 1
    return [*carried, *(captured[position] if position >= 0 else None for position in updated_captures)]


def _while_loop(body, trip_count, condition, carried, captured, updated_captures, source) -> list[Any]:
    unsupported = [_kind(value) for value in carried if not isinstance(value, (torch.Tensor, int))]
    if unsupported or any(position >= 0 for position in updated_captures):
        what = f"carries {', '.join(sorted(set(unsupported)))} values" if unsupported else "appends to a list"
        raise TorchScriptConversionError(
            "prim::Loop",
            source or None,
            f"the loop's trip count is only known at run time and it {what}; torch.while_loop "
            "carries tensors and ints only",
            "build the result in a preallocated tensor (index_copy, or torch.cat onto a carried "
            "tensor), or make the trip count a Python int known at export",
        )
    if isinstance(trip_count, torch.Tensor):
        bound = trip_count.to(torch.int64)  # int(t) truncates a float t
    else:
        bound = torch.scalar_tensor(trip_count, dtype=torch.int64)
    counted = condition is None
    # while_loop cannot close over unbacked SymInts (`int(t)`): they enter as 0-d tensors.
    symbolic = [type(value) in _SYMBOLIC_DTYPES for value in captured]
    captured = [
        torch.scalar_tensor(value, dtype=_SYMBOLIC_DTYPES[type(value)]) if scalar else value
        for value, scalar in zip(captured, symbolic)
    ]

    def run_condition(iteration, *state):
        return iteration < bound if counted else torch.logical_and(iteration < bound, state[0])

    def run_body(iteration, *state):
        if not counted:
            state = state[1:]
        # while_loop forbids mutating its carried inputs, which TorchScript bodies do (`x += 1`).
        state = [value.clone() if isinstance(value, torch.Tensor) else value for value in state]
        inputs = [value.item() if scalar else value for value, scalar in zip(captured, symbolic)]
        outputs = _as_list(body(*inputs, iteration.item(), *state))
        next_state = outputs[1 : 1 + len(state)]
        return (iteration + 1, *next_state) if counted else (iteration + 1, _as_bool(outputs[0]), *next_state)

    start = torch.zeros((), dtype=torch.int64)
    if counted:
        _, *final = while_loop(run_condition, run_body, (start, *carried))
    else:
        _, _, *final = while_loop(run_condition, run_body, (start, _as_bool(condition), *carried))
    return final


_SYMBOLIC_DTYPES = {torch.SymInt: torch.int64, torch.SymFloat: torch.float64, torch.SymBool: torch.bool}


def _as_bool(condition: bool | torch.SymBool | torch.Tensor) -> torch.Tensor:
    if isinstance(condition, torch.Tensor):
        return condition.to(torch.bool).reshape(())
    return torch.scalar_tensor(condition, dtype=torch.bool)


def _is_true(value: torch._C.Value) -> bool:
    node = value.node()
    return (
        node.kind() == "prim::Constant" and node.hasAttribute("value") and node.kindOf("value") == "i" and bool(node.i("value"))
    )


def _kind(value: Any) -> str:
    return "list" if isinstance(value, (list, tuple)) else type(value).__name__


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


_LOCATION = re.compile(r"# (?P<file>.+):(?P<line>\d+):\d+$")


def script_source(node: torch._C.Node) -> str | None:
    """``File "model.py", line 12: x = x + i``: the source line of a TorchScript node."""
    location = _location(node)
    if location is None:
        return None
    file, line = location
    code = linecache.getline(file, line).strip()
    return f'File "{file}", line {line}: {code}' if code else f'File "{file}", line {line}'


def _stack_trace(node: torch._C.Node) -> str | None:
    """A one-frame stack trace in Python's format, for FX nodes' ``stack_trace`` meta."""
    location = _location(node)
    if location is None:
        return None
    file, line = location
    return f'  File "{file}", line {line}, in forward\n    {linecache.getline(file, line).strip()}\n'


def _location(node: torch._C.Node) -> tuple[str, int] | None:
    match = _LOCATION.search(str(node).splitlines()[0])
    if match is None:
        return None
    return match["file"], int(match["line"])
