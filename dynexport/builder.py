"""The ONNX graph builder the translation table writes into.

It is onnxscript's public ``GraphBuilder`` with three choices of ours:
- types of new values come from a cheap element-type rule here (shapes and exact types of rule
  outputs come from the FX node's ``meta["val"]`` afterwards), so no per-node ONNX shape
  inference or constant propagation runs while translating;
- every node carries the FX node, module path, module class and model source line it came from
  in ``metadata_props``;
- node and value names are derived from the FX node being translated.
"""

from __future__ import annotations

import functools

import onnx
import onnx_ir as ir
import torch
from onnxscript import BuilderFeature, GraphBuilder

from dynexport.errors import source_line

__all__ = ["ModelBuilder", "module_calls", "origin_metadata"]

_BOOL_RESULT = frozenset(
    {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor",
     "IsNaN", "IsInf"}
)
_INT64_RESULT = frozenset({"Shape", "Size", "NonZero", "ArgMax", "ArgMin"})


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


def module_calls(fx_node: torch.fx.Node) -> tuple[tuple[str, str, str], ...]:
    """The module calls an FX node runs inside, outermost first, without the root module: one
    ``(call key, module path, qualified class name)`` per call (a module called twice has two
    keys)."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    return tuple(
        (key, path, cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}")
        for key, (path, cls) in stack.items()
        if path
    )


def origin_metadata(fx_node: torch.fx.Node) -> dict[str, str]:
    """The ``metadata_props`` that map an ONNX node back to the model."""
    props = {"pkg.dynexport.fx_node": fx_node.name}
    stack = fx_node.meta.get("nn_module_stack")
    if stack:
        path, cls = list(stack.values())[-1]
        cls_name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
        props["pkg.dynexport.module"] = path
        props["pkg.dynexport.module_class"] = cls_name
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


class ModelBuilder(GraphBuilder):
    """A GraphBuilder that names and annotates what it builds after the current FX node."""

    def __init__(self, graph: ir.Graph, parent: ModelBuilder | None = None, scope: str = ""):
        # A subgraph's builder (``parent`` given) puts the constants it promotes in the main
        # graph, which every subgraph can read; ``scope`` prefixes the names it gives, which
        # must differ from those of every enclosing graph.
        super().__init__(graph, parent=parent)
        self._scope = scope
        # Python scalars passed to an op are cast to its type-bound inputs' type (CAST_INPUTS);
        # positional arguments are inputs and keywords are attributes.
        self._features = BuilderFeature.CAST_INPUTS | BuilderFeature.INFER_SHAPES
        self._origin_name = "graph"
        self._origin_props: dict[str, str] = {}
        self._origin_calls: tuple[tuple[str, str, str], ...] = ()
        self._origins: dict[torch.fx.Node, tuple[dict[str, str], tuple[tuple[str, str, str], ...]]] = {}
        # The module calls each emitted node belongs to, for export_modules_as_functions.
        self.node_module_calls: dict[ir.Node, tuple[tuple[str, str, str], ...]] = {}

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

    def _get_schema(self, op_type, domain, version):
        if version is None:
            return None
        return _schema(op_type, domain, version)

    def _cast_inputs(self, schema, inputs):
        inputs = list(super()._cast_inputs(schema, inputs))
        # A trailing absent optional input is left out, not written as an empty name (some
        # onnxruntime kernels, e.g. LayerNormalization's bias, misread the empty name).
        while inputs and inputs[-1] is None:
            inputs.pop()
        return inputs

    def _infer_shapes(self, node: ir.Node) -> None:
        for value, dtype in zip(node.outputs, _element_type(node)):
            if value.type is None and dtype is not None:
                value.type = ir.TensorType(dtype)

    def _annotate_node(self, node: ir.Node) -> None:
        node.metadata_props.update(self._origin_props)
        self.node_module_calls[node] = self._origin_calls

    def _generate_node_name(self, op_type: str) -> str:
        return f"{self._origin_name}/{op_type}_{self.graph.num_nodes()}"

    def _qualify_value_name(self, name: str) -> str:
        return f"{self._origin_name}.{name}"
