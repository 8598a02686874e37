"""The ONNX graph builder the translation table writes into.

It is onnxscript's ``GraphBuilder`` (through :mod:`dynexport.onnxscript_hooks`, the one module
that overrides its private hooks) with three choices of ours:
- types of new values come from a cheap element-type rule here (shapes and exact types of rule
  outputs come from the FX node's ``meta["val"]`` afterwards), so no per-node ONNX shape
  inference or constant propagation runs while translating;
- every node carries the FX node, module path, module class and model source line it came from
  in ``metadata_props``;
- node and value names are derived from the FX node being translated.

It also writes rules in torch.onnx's forms: onnxscript ops called outside any script
(``onnxscript.opset18.Add(x, y)``) become nodes of the graph while
:meth:`ModelBuilder.evaluating_onnxscript` is active, and ``@onnxscript.script()`` functions are
inlined (:meth:`ModelBuilder.inline_function`). Ops of the default domain written for another
opset than the model's are kept when their meaning is the same at the model's opset.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import onnxscript
import onnxscript.evaluator
import torch

from dynexport.errors import source_line
from dynexport.onnxscript_hooks import HookedGraphBuilder

__all__ = ["ModelBuilder", "OnnxScriptError", "OperatorNotInOpset", "module_calls", "origin_metadata"]

_BOOL_RESULT = frozenset(
    {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor",
     "IsNaN", "IsInf"}
)
_INT64_RESULT = frozenset({"Shape", "Size", "NonZero", "ArgMax", "ArgMin", "NonMaxSuppression"})


def _element_type(node: ir.Node) -> list[ir.DataType | None]:
    """Element types of ``node``'s outputs, derived from its inputs and attributes."""
    op = node.op_type
    attrs = node.attributes
    first = next((v.dtype for v in node.inputs if v is not None and v.dtype is not None), None)
    if op == "Cast":
        dtype = ir.DataType(attrs["to"].as_int())
    elif op == "CastLike":
        dtype = node.inputs[1].dtype
    elif op == "Constant":
        if "value" in attrs:
            dtype = attrs["value"].as_tensor().dtype
        elif "value_int" in attrs or "value_ints" in attrs:
            dtype = ir.DataType.INT64
        else:
            dtype = ir.DataType.FLOAT
    elif op == "ConstantOfShape":
        dtype = attrs["value"].as_tensor().dtype if "value" in attrs else ir.DataType.FLOAT
    elif op in _BOOL_RESULT:
        dtype = ir.DataType.BOOL
    elif op in _INT64_RESULT:
        dtype = ir.DataType.INT64
    elif op == "Where":
        dtype = node.inputs[1].dtype
    elif op == "QuantizeLinear":
        # The zero point's type, uint8 without one.
        dtype = node.inputs[2].dtype if len(node.inputs) > 2 and node.inputs[2] is not None else ir.DataType.UINT8
    elif op == "DequantizeLinear":
        dtype = node.inputs[1].dtype
    elif op in ("TopK", "MaxPool"):
        return [first, ir.DataType.INT64][: len(node.outputs)]
    elif op == "Unique":
        return [first, ir.DataType.INT64, ir.DataType.INT64, ir.DataType.INT64][: len(node.outputs)]
    elif op == "LayerNormalization":
        # Mean and InvStdDev are kept in stash_type, float32 by default.
        stash = ir.DataType(attrs["stash_type"].as_int()) if "stash_type" in attrs else ir.DataType.FLOAT
        return [first, stash, stash][: len(node.outputs)]
    elif "dtype" in attrs:
        dtype = ir.DataType(attrs["dtype"].as_int())
    else:
        dtype = first
    return [dtype] * len(node.outputs)


def _sequence_types(node: ir.Node) -> list[ir.SequenceType | None]:
    """The types of ``node``'s outputs that are ONNX sequences (None for the others): the FX
    node's ``meta["val"]`` of a sequence is a tensor handle, which cannot say so."""
    op, inputs, attrs = node.op_type, node.inputs, node.attributes
    if op == "SequenceEmpty":
        dtype = ir.DataType(attrs["dtype"].as_int()) if "dtype" in attrs else ir.DataType.FLOAT
        return [ir.SequenceType(ir.TensorType(dtype))]
    if op in ("SequenceConstruct", "SplitToSequence"):
        return [ir.SequenceType(ir.TensorType(inputs[0].dtype))]
    if op == "SequenceInsert":
        return [ir.SequenceType(ir.TensorType(inputs[1].dtype))]
    if op == "SequenceErase":
        return [inputs[0].type]
    if op == "Loop":
        sources = list(inputs[2:])  # the carried values' initial values, in output order
    elif op == "If" and "then_branch" in attrs:
        sources = list(attrs["then_branch"].as_graph().outputs)
    else:
        sources = []
    types = [v.type if v is not None and isinstance(v.type, ir.SequenceType) else None for v in sources]
    return (types + [None] * len(node.outputs))[: len(node.outputs)]


def module_calls(fx_node: torch.fx.Node) -> tuple[tuple[str, str, str], ...]:
    """The module calls an FX node runs inside, outermost first, without the root module: one
    ``(call key, module path, qualified class name)`` per call (a module called twice has two
    keys)."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    return tuple(
        (key, path, _qualified_class(cls))
        for key, (path, cls) in stack.items()
        if path
    )


def _qualified_class(cls: str | type) -> str:
    """A module class as ``nn_module_stack`` gives it (a qualified name, or the class itself) as
    its qualified name; graph_text.module_label shortens it for display."""
    return cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"


def origin_metadata(fx_node: torch.fx.Node) -> dict[str, str]:
    """The ``metadata_props`` that map an ONNX node back to the model."""
    props = {"pkg.dynexport.fx_node": fx_node.name}
    stack = fx_node.meta.get("nn_module_stack")
    if stack:
        path, cls = list(stack.values())[-1]
        props["pkg.dynexport.module"] = path
        props["pkg.dynexport.module_class"] = _qualified_class(cls)
        props["namespace"] = "/".join(
            f"{p}: {c if isinstance(c, str) else c.__qualname__}" for p, c in stack.values()
        )
    source = source_line(fx_node)
    if source:
        props["pkg.dynexport.source"] = source
    return props


@functools.lru_cache(maxsize=None)
def _schema(op_type: str, domain: str, version: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


@functools.lru_cache(maxsize=None)
def _first_version(op_type: str) -> int | None:
    """The opset the default-domain op ``op_type`` first appears in (None: it never does)."""
    schemas = onnx.defs.get_all_schemas_with_history()
    versions = [s.since_version for s in schemas if s.name == op_type and s.domain == ""]
    return min(versions, default=None)


class OnnxScriptError(ValueError):
    """An onnxscript op or function that a rule calls cannot be written into the model."""

    def __init__(self, reason: str, hint: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


class OperatorNotInOpset(OnnxScriptError):
    """A rule wrote the default-domain op ``op_type`` (or its ``feature``, an attribute or a
    mode), which ONNX defines only from opset ``since``, into a model of opset ``opset``."""

    def __init__(self, op_type: str, opset: int, since: int, feature: str | None = None):
        self.what = f"ONNX {op_type}" + (f"'s {feature}" if feature else "") + f" exists from opset {since}"
        super().__init__(f"{self.what}; the model is opset {opset}", f"export with opset_version={since} (or later)")
        self.op_type, self.opset, self.since = op_type, opset, since


@functools.lru_cache(maxsize=None)
def _attribute_since(op_type: str, attribute: str, opset: int) -> int | None:
    """The first opset after ``opset`` whose ``op_type`` (default domain) has ``attribute``."""
    versions = sorted(
        s.since_version for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op_type and s.domain == "" and s.since_version > opset and attribute in s.attributes
    )
    return versions[0] if versions else None


# Ops whose meaning changed between opsets 18 and 23, not only their types or optional
# attributes: GridSample renamed its modes, DFT took its axis as an input, GroupNormalization's
# scale and bias became per channel.
_REDEFINED_AT = {"GridSample": 20, "DFT": 20, "GroupNormalization": 21}


def _check_default_domain_op(op_type: str, written_for: int, opset: int) -> None:
    """Raise unless the default-domain op ``op_type`` written for opset ``written_for`` means
    the same in a model of opset ``opset``."""
    written = _schema(op_type, "", written_for)
    if written is None:
        raise OnnxScriptError(f"ONNX has no operator {op_type} at opset {written_for}")
    if written.since_version > opset:
        raise OnnxScriptError(
            f"{op_type} (onnxscript.opset{written_for}) is defined from opset {written.since_version}; "
            f"the model is opset {opset}",
            f"export with opset_version={written.since_version} or later",
        )
    redefined = _REDEFINED_AT.get(op_type)
    if redefined is not None and written.since_version < redefined <= opset:
        raise OnnxScriptError(
            f"{op_type} means something else at opset {redefined} than at opset {written_for}, which "
            f"the rule writes it for; the model is opset {opset}",
            f"write it with onnxscript.opset{opset} or export with opset_version={written_for}",
        )


def _bind_op_arguments(
    op: onnxscript.values.Op, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Split an onnxscript op call's arguments into the node's inputs and attributes:
    positional arguments and keywords named after a formal input are inputs, other keywords
    attributes (None ones left out)."""
    schema = op.op_schema
    if schema is None:
        return list(args), {k: v for k, v in kwargs.items() if v is not None}
    formal = [i.name for i in schema.inputs]
    inputs = list(args)
    attributes = {}
    for name, value in kwargs.items():
        if name in formal:
            index = formal.index(name)
            inputs.extend([None] * (index + 1 - len(inputs)))
            inputs[index] = value
        elif name not in schema.attributes:
            raise OnnxScriptError(f"{op.name} has no input or attribute named {name!r}")
        elif value is not None:
            attributes[name] = value
    return inputs, attributes


def _holds_values(argument: Any) -> bool:
    return isinstance(argument, (list, tuple)) and any(isinstance(a, ir.Value) for a in argument)


def _output_count(op: onnxscript.values.Op, attributes: Mapping[str, Any]) -> int:
    """How many outputs an onnxscript op call returns: all its schema's outputs, as torch.onnx."""
    schema = op.op_schema
    if schema is None:
        return 1
    if op.domain == "" and op.name == "BatchNormalization" and not attributes.get("training_mode"):
        return 1  # the running statistics are outputs in training mode only
    variadic = schema.outputs and schema.outputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    if not variadic:
        return len(schema.outputs)
    if "num_outputs" in attributes:
        return int(attributes["num_outputs"])
    raise OnnxScriptError(f"{op.name} has a variable number of outputs", f"pass _outputs=<count> to {op.name}")


def _attribute_as(attr_type: ir.AttributeType, name: str, value: Any) -> ir.Attr:
    """``value`` (a Python value passed for a function's attribute) as an attribute of the type
    the function's body reads it as (an int passed for a float attribute becomes a float)."""
    convert = {
        ir.AttributeType.FLOAT: float,
        ir.AttributeType.INT: int,
        ir.AttributeType.STRING: str,
        ir.AttributeType.FLOATS: lambda v: [float(x) for x in v],
        ir.AttributeType.INTS: lambda v: [int(x) for x in v],
        ir.AttributeType.STRINGS: lambda v: [str(x) for x in v],
    }.get(attr_type)
    if convert is None:
        return ir.convenience.convert_attribute(name, value)
    return ir.Attr(name, attr_type, convert(value))


class _ScriptEmitter:
    """An onnxscript evaluator that writes the ops and functions called into a builder's graph."""

    def __init__(self, builder: ModelBuilder):
        self._builder = builder

    def eval_op(self, op: onnxscript.values.Op, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return self._builder.call_script_op(op, args, kwargs)

    def eval_function(self, function: onnxscript.OnnxFunction, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return self._builder.inline_function(function, args, kwargs)


class ModelBuilder(HookedGraphBuilder):
    """A GraphBuilder that names and annotates what it builds after the current FX node."""

    def __init__(self, graph: ir.Graph, parent: ModelBuilder | None = None, scope: str = ""):
        # A subgraph's builder (``parent`` given) puts the constants it promotes in the main
        # graph, which every subgraph can read; ``scope`` prefixes the names it gives, which
        # must differ from those of every enclosing graph.
        super().__init__(graph, parent=parent)
        self._scope = scope
        self._origin_name = "graph"
        self._origin_props: dict[str, str] = {}
        self._origin_calls: tuple[tuple[str, str, str], ...] = ()
        self._origins: dict[torch.fx.Node, tuple[dict[str, str], tuple[tuple[str, str, str], ...]]] = {}
        # The module calls each emitted node belongs to, for export_modules_as_functions.
        self.node_module_calls: dict[ir.Node, tuple[tuple[str, str, str], ...]] = {}
        # The versions of custom domains that onnxscript Opsets named, kept by the root builder.
        self.domain_versions: dict[str, set[int]] = {}

    @property
    def origin_name(self) -> str:
        """The name of the FX node being translated, after the subgraph's scope (new value names
        start with it)."""
        return self._origin_name

    def set_origin(self, fx_node: torch.fx.Node, origin: torch.fx.Node | None = None) -> None:
        """Name and annotate what is built next after ``fx_node``; the metadata (module, source
        line) comes from ``origin``, the model's node that ``fx_node`` decomposes, if any."""
        self._origin_name = self._scope + fx_node.name
        source = origin or fx_node
        cached = self._origins.get(source)
        if cached is None:
            cached = self._origins[source] = (origin_metadata(source), module_calls(source))
        self._origin_props, self._origin_calls = cached

    @contextlib.contextmanager
    def evaluating_onnxscript(self) -> Iterator[None]:
        """While active, onnxscript ops and functions called outside a script
        (``onnxscript.opset18.Add(x, y)``) write nodes into this graph and return its values."""
        with onnxscript.evaluator.default_as(_ScriptEmitter(self)):
            yield

    def call_script_op(self, op: onnxscript.values.Op, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """One node for the onnxscript op call ``op(*args, **kwargs)``: ``_outputs`` gives the
        count of a variadic op's outputs, Python numbers become constants."""
        kwargs = dict(kwargs)
        outputs = kwargs.pop("_outputs", None)
        inputs, attributes = _bind_op_arguments(op, args, kwargs)
        inputs = [self._sequence_as_tensor(i) if _holds_values(i) else i for i in inputs]
        version = self._node_version(op.name, op.domain, op.opset.version)
        if outputs is None:
            outputs = _output_count(op, attributes)
        return self.call_op(op.name, inputs, attributes, domain=op.domain, version=version, outputs=outputs)

    def _sequence_as_tensor(self, items: Sequence[Any]) -> ir.Value:
        """A list of ints and int64 scalar values (a shape with symbolic sizes) as one 1-d
        int64 tensor, as torch.onnx passes such a list to an op's input."""
        parts = [
            self.op.Reshape(item, self.op.Constant(value_ints=[1])) if isinstance(item, ir.Value)
            else self.op.Constant(value_ints=[int(item)])
            for item in items
        ]
        return self.op.Concat(*parts, axis=0)

    def inline_function(self, function: onnxscript.OnnxFunction, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Write the body of the onnxscript function into this graph, its inputs and attributes
        bound to ``args`` and ``kwargs`` as Python binds its signature; return its outputs."""
        try:
            bound = inspect.signature(function.function).bind(*args, **kwargs)
        except TypeError as error:
            raise OnnxScriptError(
                f"the onnxscript function {function.name} cannot take the operator's arguments: {error}",
                "its parameters must match the operator's schema: tensors first, then its attributes",
            ) from None
        bound.apply_defaults()
        graph = function.function_ir.graph
        values: dict[ir.Value, Any] = {formal: bound.arguments[formal.name] for formal in graph.inputs}
        attributes = {a.name: bound.arguments.get(a.name) for a in function.function_ir.attrs}
        for node in graph:
            self._inline_node(node, values, attributes, graph.opset_imports)
        outputs = [values[v] for v in graph.outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _inline_node(
        self, node: ir.Node, values: dict[ir.Value, Any], attributes: Mapping[str, Any], opsets: Mapping[str, int]
    ) -> None:
        inputs = [values[v] if v is not None else None for v in node.inputs]
        callee = node.meta.get("callee")
        if isinstance(callee, onnxscript.OnnxFunction):
            resolved = {}
            for name, attr in node.attributes.items():
                if attr.is_ref():
                    if attributes.get(attr.ref_attr_name) is not None:
                        resolved[name] = attributes[attr.ref_attr_name]
                else:
                    resolved[name] = attr.value
            results = self.inline_function(callee, inputs, resolved)
            results = results if isinstance(results, tuple) else (results,)
            values.update(zip(node.outputs, results))
            return
        node_attributes = {}
        for name, attr in node.attributes.items():
            if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                raise OnnxScriptError(
                    f"{node.op_type} in an onnxscript function carries a subgraph, which dynexport does not inline",
                    "write the control flow as a dynexport rule (ctx.subgraph) or compute it without If/Loop/Scan",
                )
            if not attr.is_ref():
                node_attributes[name] = attr
            elif attributes.get(attr.ref_attr_name) is not None:
                node_attributes[name] = _attribute_as(attr.type, name, attributes[attr.ref_attr_name])
        version = self._node_version(node.op_type, node.domain, opsets.get(node.domain, 1))
        results = self.call_op(
            node.op_type, inputs, node_attributes, domain=node.domain, version=version, outputs=len(node.outputs)
        )
        results = results if isinstance(results, Sequence) else (results,)
        values.update(zip(node.outputs, results))

    def _node_version(self, op_type: str, domain: str, written_for: int) -> int:
        """The version a node written for ``domain``'s opset ``written_for`` is emitted at: the
        model's opset for the default domain (after checking it means the same there), else
        ``written_for``, recorded for the domain's import."""
        if domain == "":
            opset = self.graph.opset_imports[""]
            _check_default_domain_op(op_type, written_for, opset)
            return opset
        self.root.domain_versions.setdefault(domain, set()).add(written_for)
        return written_for

    def schema(self, op_type: str, domain: str, version: int | None) -> onnx.defs.OpSchema | None:
        if version is None:
            return None
        schema = _schema(op_type, domain, version)
        if schema is None and domain == "":
            since = _first_version(op_type)
            if since is not None and since > version:
                raise OperatorNotInOpset(op_type, version, since)
        return schema

    def node_inputs(self, inputs: list[ir.Value | None]) -> list[ir.Value | None]:
        # A trailing absent optional input is left out, not written as an empty name (some
        # onnxruntime kernels, e.g. LayerNormalization's bias, misread the empty name).
        while inputs and inputs[-1] is None:
            inputs.pop()
        return inputs

    def type_outputs(self, node: ir.Node) -> None:
        """Sequence types, and element types of tensors (see :func:`_element_type`): shapes and
        exact types of a rule's tensor results come from the FX node's ``meta["val"]`` once the
        rule returns."""
        if node.domain == "":
            self._check_attributes(node)
        for value, dtype, sequence in zip(node.outputs, _element_type(node), _sequence_types(node)):
            if value.type is not None:
                continue
            if sequence is not None:
                value.type = sequence
            elif dtype is not None:
                value.type = ir.TensorType(dtype)

    def _check_attributes(self, node: ir.Node) -> None:
        """Raise OperatorNotInOpset for an attribute that ``node``'s op takes only at a later
        opset than the node's (Split's num_outputs from 18, Reshape's allowzero from 14)."""
        schema = _schema(node.op_type, "", node.version or self.graph.opset_imports[""])
        if schema is None:
            return
        for name in node.attributes:
            if name not in schema.attributes:
                since = _attribute_since(node.op_type, name, schema.since_version)
                if since is not None:
                    raise OperatorNotInOpset(node.op_type, self.graph.opset_imports[""], since, name)

    def annotate_node(self, node: ir.Node) -> None:
        node.metadata_props.update(self._origin_props)
        self.node_module_calls[node] = self._origin_calls

    def node_name(self, op_type: str) -> str:
        return f"{self._origin_name}/{op_type}_{self.graph.num_nodes()}"

    def value_name(self, name: str) -> str:
        return f"{self._origin_name}.{name}"
