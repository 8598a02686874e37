"""TorchScript models as ExportedPrograms: the front end of ``export(..., dynamo=False)``.

A ``ScriptModule`` or ``ScriptFunction`` (or, with ``dynamo=False``, any module, first traced by
``torch.jit.trace``: loops unroll, shapes are those of the trace) is converted node by node into
an FX GraphModule by torch's TorchScript converter (``torch._export.converter``); torch.export then
captures that GraphModule like any other model, so the rest of the pipeline sees an ordinary
ExportedProgram.

torch's converter unrolls ``prim::Loop`` while it builds the graph, which needs a trip count
known before any input is seen, and its ``prim::If`` loses the lists a branch appends to. Here
both become calls of :mod:`dynexport.torchscript.control_flow`'s ``run_loop`` and ``run_if``, which
decide while torch.export traces, when the values are known; lists whose length only the run
knows become ONNX sequences (:mod:`dynexport.torchscript.lists`): ``len``, ``stack``, ``cat``,
``split`` and ``unbind`` are converted to calls that handle both lists and sequences.
"""

from __future__ import annotations

import inspect
import itertools
import linecache
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch._export import converter as ts_converter

from dynexport.dim_names import dynamic_dims_sized_0_or_1
from dynexport.errors import CaptureError, TorchScriptConversionError
from dynexport.signature import bind_arguments
from dynexport.torchscript import lists
from dynexport.torchscript.control_flow import block_output, run_if, run_loop

__all__ = ["capture", "graph_module", "is_torchscript", "trace"]

_STRATEGY = "torch.export(strict=False) of the TorchScript graph"


def is_torchscript(model: Any) -> bool:
    """Whether ``model`` is compiled TorchScript (scripted or traced)."""
    return isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction))


def graph_module(model: Any, args: tuple, kwargs: dict) -> tuple[torch.fx.GraphModule, tuple]:
    """``model``'s TorchScript graph as an FX GraphModule whose ``forward`` takes the model's
    arguments (same names), with the call's arguments bound to them: TorchScript passes every
    argument positionally, defaults included. An argument that is None (an ``Optional[Tensor]``
    left at its default) or left at a default tensor is a constant of the graph, not an
    argument: the caller never gives it. A model that is not TorchScript is traced first.

    Raises:
        CaptureError: ``torch.jit.trace`` failed on the model.
        TorchScriptConversionError: the graph holds a construct with no FX form.
    """
    if not is_torchscript(model):
        model, args, kwargs = trace(model, args, kwargs)
    arguments = _schema(model).arguments
    if isinstance(model, torch.jit.ScriptModule):
        arguments = arguments[1:]  # self
    positional, defaulted = _bind(arguments, args, kwargs)
    constants = {
        i: value
        for i, value in enumerate(positional)
        if value is None or (i in defaulted and isinstance(value, torch.Tensor))
    }
    module = _ScriptConverter(model, positional, constants).graph_module()
    given = [(argument, value) for i, (argument, value) in enumerate(zip(arguments, positional)) if i not in constants]
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    for node, (argument, _) in zip(placeholders, given):
        node.name = node.target = argument.name
    output = next(node for node in reversed(module.graph.nodes) if node.op == "output")
    with module.graph.inserting_before(output):
        # A returned list whose length is only known at run time is an ONNX sequence output.
        output.args = torch.fx.node.map_arg(
            output.args, lambda value: module.graph.call_function(lists.as_output, (value,))
        )
    module.recompile()
    return module, tuple(value for _, value in given)


def capture(
    module: torch.fx.GraphModule, args: tuple, kwargs: dict, dynamic_shapes: Any
) -> tuple[torch.export.ExportedProgram, str]:
    """Capture the GraphModule made by :func:`graph_module` with torch.export (non-strict: the
    graph is already ATen, there is no Python left to analyse). A dim declared dynamic whose
    example size is 0 or 1 stays dynamic, as torch.onnx's TorchScript exporter keeps it: torch
    reasons about sizes obliviously to those two values then."""
    oblivious = dynamic_dims_sized_0_or_1(dynamic_shapes, bind_arguments(module.forward, args, kwargs))
    try:
        with fx_config.patch(backed_size_oblivious=oblivious):
            program = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except TorchScriptConversionError:
        raise
    except Exception as error:
        raise CaptureError({_STRATEGY: error}) from error
    return program, _STRATEGY


def trace(model: Any, args: tuple, kwargs: dict) -> tuple[torch.jit.ScriptModule, tuple, dict]:
    """``model`` traced by ``torch.jit.trace``, and the call's arguments for it: arguments left at
    None are left out of the trace (its graph takes the others only)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"dynamo=False exports an nn.Module or TorchScript, got {type(model).__name__}; "
            "wrap the function in an nn.Module or drop dynamo=False"
        )
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    for name, value in bound.arguments.items():
        if value is not None and any(
            not isinstance(leaf, torch.Tensor) for leaf in torch.utils._pytree.tree_leaves(value)
        ):
            raise TypeError(
                f"dynamo=False traces the model with torch.jit.trace, which takes tensors only; "
                f"argument {name!r} is {type(value).__name__}: pass it as a tensor, or drop dynamo=False"
            )
    # An empty *args or **kwargs of forward is no argument of the trace.
    parameters = inspect.signature(model.forward).parameters
    arguments = {
        name: value
        for name, value in bound.arguments.items()
        if parameters[name].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) or value
    }
    given = {name: value for name, value in arguments.items() if value is not None}
    try:
        if len(given) == len(arguments):
            traced = torch.jit.trace(model, tuple(given.values()), check_trace=False, strict=False)
            return traced, tuple(given.values()), {}
        traced = torch.jit.trace(model, example_kwarg_inputs=given, check_trace=False, strict=False)
        return traced, (), given
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


def _bind(arguments: Sequence[torch.Argument], args: tuple, kwargs: dict) -> tuple[tuple, set[int]]:
    """All of a TorchScript call's arguments, in order (TorchScript graphs take every argument
    positionally, defaults included), and the positions of those left at their defaults."""
    if len(args) > len(arguments):
        raise TypeError(f"the model takes {len(arguments)} arguments, got {len(args)} positional ones")
    known = {argument.name for argument in arguments}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"the model has no argument(s) {unknown}; its arguments are {sorted(known)}")
    values, defaulted = list(args), set()
    for argument in arguments[len(args):]:
        if argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            defaulted.add(len(values))
            values.append(argument.default_value)
        else:
            raise TypeError(f"missing the model's argument {argument.name!r}")
    for argument, value in zip(arguments, values):
        if isinstance(value, (tuple, list)) and any(leaf is None for leaf in torch.utils._pytree.tree_leaves(value)):
            raise TypeError(
                f"argument {argument.name!r} holds None inside a {type(value).__name__}; TorchScript "
                "models are exported with None only as a whole Optional argument"
            )
    return tuple(values), defaulted


_NO_TENSOR = torch.empty(0)


class _ScriptConverter(ts_converter.TS2EPConverter):
    """torch's converter with our graph converter; the capture is :func:`capture`'s. The
    arguments at the positions of ``constants`` are bound to the graph as constants."""

    def __init__(
        self, model: torch.jit.ScriptModule | torch.jit.ScriptFunction, positional: tuple, constants: dict[int, Any]
    ):
        # torch's converter gives every argument's example to TorchScript's shape propagation,
        # which takes tensors only; a None argument's input is bound to None below instead.
        super().__init__(model, tuple(_NO_TENSOR if value is None else value for value in positional))
        inputs = [
            value
            for value in self.ts_graph.inputs()
            if not isinstance(value.type(), torch.ClassType)
            and value.debugName() not in self.name_to_param
            and value.debugName() not in self.name_to_buffer
        ]
        self.constant_inputs = {inputs[i].debugName(): value for i, value in constants.items()}

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
        converter.constant_inputs = self.constant_inputs
        return converter.convert()


class _GraphConverter(ts_converter.TS2FXGraphConverter):
    """Converts one TorchScript graph or block; ``prim::Loop`` and ``prim::If`` become
    :func:`run_loop` and :func:`run_if` calls, and every FX node records its TorchScript source
    line as its stack trace."""

    constant_inputs: Mapping[str, Any] = MappingProxyType({})

    def convert_graph_inputs(self) -> None:
        super().convert_graph_inputs()
        for name, value in self.constant_inputs.items():
            self.fx_graph.erase_node(self.name_to_node.pop(name))
            if value is None:
                self.name_to_constant[name] = None
            else:
                attribute = f"default_{ts_converter.normalize_name(name)}"
                self.name_to_constant[attribute] = value
                self.name_to_node[name] = self.fx_graph.get_attr(attribute)

    def convert_graph_outputs(self) -> None:
        super().convert_graph_outputs()
        # torch's version copies an input a block returns with torch.clone, which takes tensors
        # only (`else: i = i` of a loop's counter) and hides writes to the output from the input
        # in a branch picked at export.
        for node in self.fx_graph.find_nodes(op="call_function", target=torch.clone):
            node.target = block_output

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

    def convert_aten_Int(self, node: torch._C.Node) -> None:
        # torch's version reads a tensor through int32 and calls tensor methods on numbers
        # (`int(t.item())`).
        self._call(node, _number, self.get_fx_value_by_ir_value(node.input()), torch.int64)

    def convert_aten_Float(self, node: torch._C.Node) -> None:
        # torch's version reads a tensor through float32 and calls tensor methods on numbers
        # (`float(flag)`).
        self._call(node, _number, self.get_fx_value_by_ir_value(node.input()), torch.float64)

    def convert_aten_slice(self, node: torch._C.Node) -> None:
        if not isinstance(node.inputsAt(0).type(), torch.ListType):
            super().convert_call_function_op(node)
            return
        # `x.shape[:2]`: aten::slice.t of a list, which no ATen kernel takes.
        self._call(node, _list_slice, *(self.get_fx_value_by_ir_value(value) for value in node.inputs()))

    def convert_aten_tensor(self, node: torch._C.Node) -> None:
        # torch's version calls a function local to it, which the code FX writes for a block's
        # graph looks up as torch._export.converter.target (`x[mask] = 0.0` in a branch).
        args, kwargs = self.get_args_kwargs(node, torch.ops.aten.tensor.default._schema)
        self.name_to_node[node.output().debugName()] = self.fx_graph.call_function(_tensor, args, kwargs)

    def convert_aten__shape_as_tensor(self, node: torch._C.Node) -> None:
        # torch's kernel writes the sizes into a new tensor's data, which capture's fake tensors
        # do not have (ultralytics' NMSModel reads its input's shape so).
        self._call(node, _shape_as_tensor, self.get_fx_value_by_ir_value(node.input()))

    def convert_prim_device(self, node: torch._C.Node) -> None:
        # torch's version reads the device from the TorchScript type, unknown (None) for a
        # computed tensor: `(x + 1).device == y.device` would be False.
        self._call(node, _device, self.get_fx_value_by_ir_value(node.input()))

    def convert_prim_Constant(self, node: torch._C.Node) -> None:
        name = node.output().debugName()
        if node.output().type().kind() == "DeviceObjType":
            # torch's version keeps the device's name, a str no device equals.
            self.name_to_constant[name] = torch.device(node.s("value"))
        elif node.hasAttribute("value") and node.kindOf("value") == "ival" and _holds_tensors(node.ival("value")):
            # A frozen module's list of tensors (`x[self.index] = v`): torch's version puts the
            # tensors in the FX graph's code, which cannot spell them.
            elements = []
            for i, element in enumerate(node.ival("value")):
                if isinstance(element, torch.Tensor):
                    attribute = f"lifted_tensor_{ts_converter.normalize_name(name)}_{i}"
                    self.name_to_constant[attribute] = element
                    element = self.fx_graph.get_attr(attribute)
                elements.append(element)
            self.name_to_node[name] = elements
        elif node.hasAttribute("value") and node.kindOf("value") == "t" and not isinstance(node.output().toIValue(), torch.Tensor):
            # A Python number the trace recorded as a 0-dim tensor (`x * 0.5`): kept a number, it
            # takes part in type promotion as one (float32 * 0.5 stays float32, not float64).
            self.name_to_node[name] = node.output().toIValue()
        else:
            super().convert_prim_Constant(node)

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
        # block returns its outputs, then ``updated``, the lists appended to and the tensors
        # written to in the node's blocks (torch's converter collects the lists as it goes, in a
        # set: branches would disagree on which and in what order, and it loses the tensors).
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

    def convert_aten__set_item(self, node: torch._C.Node) -> None:
        # `list[i] = t`: as for append, a new list or sequence replaces the old.
        container, index, element = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        updated = self.fx_graph.call_function(lists.set_item, (container, index, element, script_source(node)))
        self.name_to_node[node.output().debugName()] = self.name_to_node[node.inputsAt(0).debugName()] = updated

    def convert_aten_append(self, node: torch._C.Node) -> None:
        # torch's version, without its warning that appending mutates: run_loop and run_if
        # return the lists their blocks append to (_updated_within).
        container, element = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        appended = self.fx_graph.call_function(lists.append, (container, element, script_source(node)))
        self.name_to_node[node.output().debugName()] = self.name_to_node[node.inputsAt(0).debugName()] = appended

    # Lists whose length may only be known at run time: these call dynexport.torchscript.lists, which
    # decides while torch.export traces whether a Python list or an ONNX sequence is needed.

    def _convert_standard_operators(self, node: torch._C.Node) -> None:
        # torch's converter installs these (`len` among them) as instance attributes.
        if node.kind() == "aten::len":
            self._call(node, lists.length, self.get_fx_value_by_ir_value(node.input()))
        else:
            super()._convert_standard_operators(node)

    def convert_aten_stack(self, node: torch._C.Node) -> None:
        self._convert_concat(node, new_axis=True)

    def convert_aten_cat(self, node: torch._C.Node) -> None:
        self._convert_concat(node, new_axis=False)

    def _convert_concat(self, node: torch._C.Node, new_axis: bool) -> None:
        tensors, dim = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        self._call(node, lists.concat, tensors, dim, new_axis)

    def convert_aten_split(self, node: torch._C.Node) -> None:
        self_, split_size, dim = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        if not node.inputsAt(1).type().isSubtypeOf(torch._C.IntType.get()):
            super().convert_call_function_op(node)  # split by a list of sizes: as many pieces
            return
        self._call(node, lists.split, self_, split_size, dim, script_source(node))

    def convert_aten_unbind(self, node: torch._C.Node) -> None:
        self_, dim = (self.get_fx_value_by_ir_value(value) for value in node.inputs())
        self._call(node, lists.unbind, self_, dim, script_source(node))

    def _call(self, node: torch._C.Node, function: Callable[..., Any], *args: Any) -> None:
        self.name_to_node[node.output().debugName()] = self.fx_graph.call_function(function, args)

    def _block_arguments(self, node: torch._C.Node) -> list[str]:
        """The values of this graph that ``node``'s blocks read, and the attributes they lift."""
        arguments = set(self._identify_inputs_as_arguments(node))
        for block in node.blocks():
            arguments |= self.blocks_to_lifted_attrs[block]
        return sorted(arguments)

    def _bind_outputs(self, node: torch._C.Node, call: torch.fx.Node, updated: list[str]) -> None:
        """``node``'s outputs, then the values ``updated`` it updated, as ``call``'s results."""
        names = [output.debugName() for output in node.outputs()] + updated
        for index, name in enumerate(names):
            self.name_to_node[name] = self.fx_graph.call_function(operator.getitem, (call, index))

    def convert_prim_If(self, node: torch._C.Node) -> None:
        self._check_set_attr_in_if_block(node)
        updated, write_refusal = _updated_within(node)
        refusal = "; ".join(filter(None, (write_refusal, _aliased_output_refusal(node))))
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
                refusal,
                *(self.get_fx_value_by_fqn(name) for name in arguments),
            ),
        )
        self._bind_outputs(node, branch, updated)

    def convert_prim_Loop(self, node: torch._C.Node) -> None:
        trip_count, condition, *carried = node.inputs()
        body = next(node.blocks())
        updated, write_refusal = _updated_within(node)
        refusal = "; ".join(filter(None, (write_refusal, _carried_write_refusal(node))))
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
                refusal,
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


def _holds_tensors(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and any(isinstance(element, torch.Tensor) for element in value)


def _device(tensor: torch.Tensor) -> torch.device:
    return tensor.device


def _tensor(data: Any, dtype: int | None = None, device: Any = None, requires_grad: Any = False) -> torch.Tensor:
    """TorchScript's ``aten::tensor`` (``dtype``: a ScalarType number); ``torch._refs.tensor``
    takes symbolic numbers."""
    make = torch.tensor if isinstance(data, int) else torch._refs.tensor
    dtype = None if dtype is None else ts_converter._TORCH_ENUM_TO_DTYPE[dtype]
    return make(data, dtype=dtype, device=device, requires_grad=bool(requires_grad))


def _shape_as_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``torch._shape_as_tensor``: the sizes, symbolic ones included, as an int64 vector."""
    sizes = [torch.scalar_tensor(size, dtype=torch.int64) for size in tensor.shape]
    return torch.stack(sizes) if sizes else torch.empty(0, dtype=torch.int64)


def _list_slice(values: Any, start: int | None, end: int | None, step: int) -> Any:
    return values[start:end:step]


def _number(value: Any, dtype: torch.dtype) -> Any:
    """``int(value)`` or ``float(value)`` (``dtype``: int64 or float64) of a tensor or of a
    number that may be symbolic; ``bool(t)`` of a tensor stays a tensor in the converted graph."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype).item()
    return torch.sym_int(value) if dtype == torch.int64 else torch.sym_float(value)


_SCALAR_TYPES = {"BoolType": torch.bool, "IntType": torch.int64, "FloatType": torch.float64}


def _updated_within(node: torch._C.Node) -> tuple[list[str], str]:
    """The values defined outside ``node``'s blocks that they update, by name: the lists they
    append to and the tensors they write to in place (``x[i] = v``, ``x.index_add_(...)``).
    Then why ``node`` cannot become ``torch.cond`` / ``while_loop``, whose bodies write to
    copies of those tensors ("" if it can): a write the copy would hide from another name for
    the same memory. Run on the values themselves (a branch picked, a loop unrolled), every
    write reaches the memory it names."""
    inside = _defined_within(node)
    updated, refusals = set(), []
    for inner in _nodes_within(node):
        if inner.kind() in _LIST_UPDATES:
            updated.add(inner.inputsAt(0).debugName())
            continue
        for value in _written_inputs(inner):
            written, refusal = _outer_alias(value, inside)
            if written is not None:
                refusal = _other_alias_read(written, node, inside)
                updated.add(written.debugName())
            if refusal:
                refusals.append(f"the write at {script_source(inner) or inner.kind()} {refusal}")
    return sorted(updated - inside), "; ".join(refusals)


# The list operators converted into a new list (or sequence) that replaces the old.
_LIST_UPDATES = ("aten::append", "aten::_set_item")


def _nodes_within(node: torch._C.Node) -> Iterator[torch._C.Node]:
    pending = list(node.blocks())
    while pending:
        block = pending.pop()
        for inner in block.nodes():
            yield inner
            pending += inner.blocks()


def _defined_within(node: torch._C.Node) -> set[str]:
    """The names of the values ``node``'s blocks define, their parameters included."""
    inner_nodes = list(_nodes_within(node))
    blocks = [*node.blocks(), *(block for inner in inner_nodes for block in inner.blocks())]
    return {value.debugName() for block in blocks for value in block.inputs()} | {
        value.debugName() for inner in inner_nodes for value in inner.outputs()
    }


def _op_schema(node: torch._C.Node) -> torch.FunctionSchema | None:
    schema = node.schema()
    return None if schema == "(no schema)" else torch._C.parse_schema(schema)


def _written_inputs(node: torch._C.Node) -> list[torch._C.Value]:
    """The tensors ``node`` writes to, by its schema (``Tensor(a!) self``)."""
    schema = _op_schema(node)
    if schema is None:
        return []
    return [
        value
        for argument, value in zip(schema.arguments, node.inputs())
        if argument.alias_info is not None and argument.alias_info.is_write
    ]


def _aliased_input(value: torch._C.Value) -> torch._C.Value | None:
    """The input ``value`` is a view of or is, if any: ``select``'s or ``reshape``'s input,
    ``add_``'s (its result is its input), the list an element is taken from."""
    node = value.node()
    if node.kind() in ("prim::unchecked_cast", "prim::ListUnpack", "prim::TupleUnpack"):
        return node.inputsAt(0)
    schema = _op_schema(node)
    if schema is None or len(schema.returns) != node.outputsSize():
        return None
    if schema.returns[value.offset()].alias_info is None:
        return None
    return next(
        (value for argument, value in zip(schema.arguments, node.inputs()) if argument.alias_info is not None), None
    )


def _outer_alias(value: torch._C.Value, inside: set[str]) -> tuple[torch._C.Value | None, str]:
    """The tensor defined outside the blocks (names ``inside``) that writing to ``value``
    writes to (None if the write stays within them), or why it cannot be told."""
    while value.debugName() in inside:
        source = _aliased_input(value)
        if source is None:
            kind = value.node().kind()
            if kind in _UNTRACKED_ALIASES:
                return None, f"writes to a tensor taken from {kind}, which a copy cannot follow"
            return None, ""
        value = source
    if not value.type().isSubtypeOf(torch._C.TensorType.get()):
        return None, f"writes to an element of a {value.type()} made before it, which a copy cannot follow"
    return value, ""


# Values whose writes reach tensors they do not say: a module attribute, a container's elements.
_UNTRACKED_ALIASES = {"prim::GetAttr", "prim::ListConstruct", "prim::TupleConstruct", "prim::DictConstruct"}


def _other_alias_read(written: torch._C.Value, node: torch._C.Node, inside: set[str]) -> str:
    """Why a copy of ``written`` would be unsound: another view of the same memory made before
    ``node`` (``row = y[0]``, or ``written`` itself being a view) read within or after it would
    keep the old values where eager sees the write ("" if there is none)."""
    for alias in _same_memory(written):
        if alias is written or alias.debugName() in inside or _is_after(alias.node(), node):
            continue
        if any(use.user is node or use.user.isAfter(node) or _is_within(use.user, node) for use in alias.uses()):
            return (
                f"writes to %{written.debugName()}, and %{alias.debugName()}, another view of the same memory "
                "made before it, is read within or after it"
            )
    return ""


def _same_memory(value: torch._C.Value) -> list[torch._C.Value]:
    """``value``, the tensor it is a view of, and every view of that tensor."""
    base = value
    while (source := _aliased_input(base)) is not None:
        base = source
    family, pending = [], [base]
    while pending:
        value = pending.pop()
        family.append(value)
        pending += [output for use in value.uses() for output in use.user.outputs() if _aliased_input(output) is value]
    return family


def _aliased_output_refusal(node: torch._C.Node) -> str:
    """Why ``node``'s outputs, copies when it becomes ``torch.cond``, would be unsound: an output
    a branch takes from the enclosing graph (``z = y``, or a view of y) whose memory is written
    after ``node`` through one name and read through the other ("" if there is none)."""
    inside = _defined_within(node)
    for output in node.outputs():
        for block in node.blocks():
            outer, _ = _outer_alias(list(block.outputs())[output.offset()], inside)
            if outer is None:
                continue
            shared = _write_seen_through_another_name(node, _same_memory(outer), _same_memory(output))
            if shared:
                return f"its output %{output.debugName()} may be %{outer.debugName()}, and {shared}"
    return ""


def _write_seen_through_another_name(
    node: torch._C.Node, one: list[torch._C.Value], other: list[torch._C.Value]
) -> str:
    """A write after ``node`` to a value of ``one`` when a value of ``other`` is read after
    ``node``, or the reverse ("" if there is none)."""
    for written_side, read_side in ((one, other), (other, one)):
        for value in written_side:
            for use in value.uses():
                writer = use.user
                if not _runs_after(writer, node) or not any(input is value for input in _written_inputs(writer)):
                    continue
                reads = (read.user for alias in read_side for read in alias.uses())
                if any(reader is not writer and _runs_after(reader, node) for reader in reads):
                    return f"the write at {script_source(writer) or writer.kind()} would not reach the other"
    return ""


def _carried_write_refusal(loop: torch._C.Node) -> str:
    """Why ``loop``'s carried values, copies when it becomes ``while_loop``, would be unsound: the
    body writes in place to a carried value (``a += x``), which in eager writes to the tensor the
    loop starts from, and that tensor is read after the loop under another name (``a_ref = a``)
    ("" if there is none)."""
    body = next(loop.blocks())
    parameters = list(body.inputs())[1:]  # after the iteration
    initial = list(loop.inputs())[2:]  # after the trip count and the condition
    for inner in _nodes_within(loop):
        for value in _written_inputs(inner):
            root = value
            while (source := _aliased_input(root)) is not None:
                root = source
            if not any(root is parameter for parameter in parameters):
                continue
            start = initial[[parameter is root for parameter in parameters].index(True)]
            reads = (use.user for alias in _same_memory(start) for use in alias.uses())
            if any(_runs_after(reader, loop) for reader in reads):
                return (
                    f"the write at {script_source(inner) or inner.kind()} writes to the tensor the loop starts "
                    f"from, %{start.debugName()}, which is read after the loop"
                )
    return ""


def _runs_after(inner: torch._C.Node, node: torch._C.Node) -> bool:
    return inner.isAfter(node) and not _is_within(inner, node)


def _is_within(inner: torch._C.Node, node: torch._C.Node) -> bool:
    block = inner.owningBlock()
    while block is not None and block.owningNode() is not None:
        if block.owningNode() is node:
            return True
        block = block.owningNode().owningBlock()
    return False


def _is_after(defining: torch._C.Node, node: torch._C.Node) -> bool:
    return defining.kind() != "prim::Param" and defining.isAfter(node)


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
