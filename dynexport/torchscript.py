"""TorchScript models as ExportedPrograms: the front end of ``export(..., dynamo=False)``.

A ``ScriptModule`` or ``ScriptFunction`` (or, with ``dynamo=False``, any module, first traced by
``torch.jit.trace``: loops unroll, shapes are those of the trace) is converted node by node into
an FX GraphModule by torch's TorchScript converter (``torch._export.converter``); torch.export then
captures that GraphModule like any other model, so the rest of the pipeline sees an ordinary
ExportedProgram.

torch's converter unrolls ``prim::Loop`` while it builds the graph, which needs a trip count
known before any input is seen, and its ``prim::If`` loses the lists a branch appends to. Here
both become calls of :mod:`dynexport.script_control_flow`'s ``run_loop`` and ``run_if``, which
decide while torch.export traces, when the values are known; lists whose length only the run
knows become ONNX sequences (:mod:`dynexport.sequences`): ``len``, ``stack``, ``cat``,
``split`` and ``unbind`` are converted to calls that handle both lists and sequences.
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

from dynexport import sequences
from dynexport.errors import CaptureError, TorchScriptConversionError
from dynexport.script_control_flow import run_if, run_loop

__all__ = ["capture", "graph_module", "is_torchscript"]

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
    output = next(node for node in reversed(module.graph.nodes) if node.op == "output")
    with module.graph.inserting_before(output):
        # A returned list whose length is only known at run time is an ONNX sequence output.
        output.args = torch.fx.node.map_arg(
            output.args, lambda value: module.graph.call_function(sequences.as_output, (value,))
        )
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
    """Converts one TorchScript graph or block; ``prim::Loop`` and ``prim::If`` become
    :func:`run_loop` and :func:`run_if` calls, and every FX node records its TorchScript source
    line as its stack trace."""

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

    def convert_prim_unchecked_cast(self, node: torch._C.Node) -> None:
        # `Optional[Tensor]` to `Tensor` after an `is not None` test: nothing to compute.
        self._convert_as_noop(node)

    def _identify_inputs_as_arguments(self, entry: torch._C.Node) -> set[str]:
        arguments = super()._identify_inputs_as_arguments(entry)
        # A block may also return a value of the enclosing graph it does not read (`else: y = x`).
        for block in entry.blocks():
            for value in block.outputs():
                name = value.debugName()
                if name in self.name_to_node and name not in self.name_to_attribute_fqn:
                    arguments.add(name)
        return arguments

    def _convert_block_to_subgraph(
        self, node: torch._C.Node, arguments: list[str], updated: Sequence[str] = ()
    ) -> list[torch.fx.Node]:
        # torch's version converts blocks with its own converter class, not this one. Each
        # block returns its outputs, then ``updated``, the lists appended to in the node's blocks
        # (torch's converter collects them as it goes, in a set: branches would disagree on
        # which and in what order).
        graphs = []
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
            converter.name_update_from_subblock_to_parent = list(updated)
            for name in arguments:
                converter.name_to_node[name] = converter.fx_graph.placeholder(ts_converter.normalize_name(name))
            graphs.append(self.fx_graph.get_attr(self.add_subgraph(converter.convert())))
        return graphs

    def convert_aten_append(self, node: torch._C.Node) -> None:
        # torch's version, without its warning that appending mutates: run_loop and run_if
        # return the lists their blocks append to (_lists_appended_within).
        container, element = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        appended = self.fx_graph.call_function(sequences.append, (container, element, script_source(node)))
        self.name_to_node[node.output().debugName()] = self.name_to_node[node.inputsAt(0).debugName()] = appended

    # Lists whose length may only be known at run time: these call dynexport.sequences, which
    # decides while torch.export traces whether a Python list or an ONNX sequence is needed.

    def _convert_standard_operators(self, node: torch._C.Node) -> None:
        # torch's converter installs these (`len` among them) as instance attributes.
        if node.kind() == "aten::len":
            self._call(node, sequences.length, self.get_fx_value_by_ir_value(node.input()))
        else:
            super()._convert_standard_operators(node)

    def convert_aten_stack(self, node: torch._C.Node) -> None:
        self._convert_concat(node, new_axis=True)

    def convert_aten_cat(self, node: torch._C.Node) -> None:
        self._convert_concat(node, new_axis=False)

    def _convert_concat(self, node: torch._C.Node, new_axis: bool) -> None:
        tensors, dim = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        self._call(node, sequences.concat, tensors, dim, new_axis)

    def convert_aten_split(self, node: torch._C.Node) -> None:
        self_, split_size, dim = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        if not node.inputsAt(1).type().isSubtypeOf(torch._C.IntType.get()):
            super().convert_call_function_op(node)  # split by a list of sizes: as many pieces
            return
        self._call(node, sequences.split, self_, split_size, dim, script_source(node))

    def convert_aten_unbind(self, node: torch._C.Node) -> None:
        self_, dim = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        self._call(node, sequences.unbind, self_, dim, script_source(node))

    def _call(self, node: torch._C.Node, function: Callable[..., Any], *args: Any) -> None:
        self.name_to_node[node.output().debugName()] = self.fx_graph.call_function(function, args)

    def _block_arguments(self, node: torch._C.Node) -> list[str]:
        """The values of this graph that ``node``'s blocks read, and the attributes they lift."""
        arguments = set(self._identify_inputs_as_arguments(node))
        for block in node.blocks():
            arguments |= self.blocks_to_lifted_attrs[block]
        return sorted(arguments)

    def _bind_outputs(self, node: torch._C.Node, call: torch.fx.Node, updated: list[str]) -> None:
        """``node``'s outputs, then the lists ``updated`` it appended to, as ``call``'s results."""
        names = [output.debugName() for output in node.outputs()] + updated
        for index, name in enumerate(names):
            self.name_to_node[name] = self.fx_graph.call_function(operator.getitem, (call, index))

    def convert_prim_If(self, node: torch._C.Node) -> None:
        self._check_set_attr_in_if_block(node)
        updated = _lists_appended_within(node)
        arguments = self._block_arguments(node)
        branches = self._convert_block_to_subgraph(node, arguments, updated)
        branch = self.fx_graph.call_function(
            run_if,
            (
                self.get_fx_value_by_ir_value(node.input()),
                *branches,
                tuple(arguments.index(name) for name in updated),
                tuple(_SCALAR_TYPES.get(output.type().kind()) for output in node.outputs()),
                script_source(node) or "",
                *(self.get_fx_value_by_fqn(name) for name in arguments),
            ),
        )
        self._bind_outputs(node, branch, updated)

    def convert_prim_Loop(self, node: torch._C.Node) -> None:
        trip_count, condition, *carried = node.inputs()
        body = next(node.blocks())
        updated = _lists_appended_within(node)
        captured = self._block_arguments(node)
        (body_graph,) = self._convert_block_to_subgraph(node, captured, updated)

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
                tuple(captured.index(name) for name in updated),
                script_source(node) or "",
                *(self.get_fx_value_by_ir_value(value) for value in carried),
                *(self.get_fx_value_by_fqn(name) for name in captured),
            ),
        )
        self._bind_outputs(node, loop, updated)


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


_SCALAR_TYPES = {"BoolType": torch.bool, "IntType": torch.int64, "FloatType": torch.float64}


def _lists_appended_within(node: torch._C.Node) -> list[str]:
    """The lists defined outside ``node``'s blocks that they append to, by name."""
    defined, appended = set(), []
    pending = list(node.blocks())
    while pending:
        block = pending.pop()
        defined.update(value.debugName() for value in block.inputs())
        for inner in block.nodes():
            defined.update(value.debugName() for value in inner.outputs())
            if inner.kind() == "aten::append":
                appended.append(inner.inputsAt(0).debugName())
            pending += inner.blocks()
    return sorted(set(appended) - defined)


def _is_true(value: torch._C.Value) -> bool:
    node = value.node()
    return (
        node.kind() == "prim::Constant" and node.hasAttribute("value") and node.kindOf("value") == "i" and bool(node.i("value"))
    )


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
