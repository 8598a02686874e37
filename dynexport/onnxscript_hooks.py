"""The one place dynexport relies on onnxscript internals: the private hooks of its GraphBuilder.

onnxscript's ``GraphBuilder.call_op`` builds every node through overridable private methods and
a private feature set. :class:`HookedGraphBuilder` chooses the features and overrides exactly the
hooks in :data:`HOOKS`, each forwarding to a public method that the graph builder
(:class:`dynexport.builder.ModelBuilder`) defines, so nothing else names an onnxscript internal.
``tests/test_onnxscript_hooks.py`` fails if onnxscript renames a hook, changes its parameters or
stops calling it.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import onnx
import onnx_ir as ir
from onnxscript import BuilderFeature, GraphBuilder

__all__ = ["FEATURES", "HOOKS", "HookedGraphBuilder"]

# Python scalars passed to an op are cast to its type-bound inputs' type (CAST_INPUTS, which
# also looks up the schema); the INFER_SHAPES hook types each node's outputs. Without
# SCHEMA_PARTITION, positional arguments are inputs and keywords attributes; no constant
# propagation runs while translating.
FEATURES = BuilderFeature.CAST_INPUTS | BuilderFeature.INFER_SHAPES

# Each private hook overridden, with its parameters in onnxscript.
HOOKS = {
    "_get_schema": ("self", "op_type", "domain", "version"),
    "_cast_inputs": ("self", "schema", "inputs"),
    "_infer_shapes": ("self", "node"),
    "_annotate_node": ("self", "node"),
    "_generate_node_name": ("self", "op_type"),
    "_qualify_value_name": ("self", "name"),
}


class HookedGraphBuilder(GraphBuilder):
    """onnxscript's GraphBuilder building with :data:`FEATURES`, its private hooks forwarded to
    the public methods below."""

    def __init__(self, graph: ir.Graph, parent: HookedGraphBuilder | None = None):
        super().__init__(graph, parent=parent)
        self._features = FEATURES

    @abc.abstractmethod
    def schema(self, op_type: str, domain: str, version: int | None) -> onnx.defs.OpSchema | None:
        """The schema of the op a node is built for (None: none known, its inputs are not cast)."""

    @abc.abstractmethod
    def node_inputs(self, inputs: list[ir.Value | None]) -> list[ir.Value | None]:
        """A node's inputs after onnxscript cast its Python scalars to constants."""

    @abc.abstractmethod
    def type_outputs(self, node: ir.Node) -> None:
        """Give a node just built the types of its outputs."""

    @abc.abstractmethod
    def annotate_node(self, node: ir.Node) -> None:
        """Attach metadata to a node just built."""

    @abc.abstractmethod
    def node_name(self, op_type: str) -> str:
        """The name of the next node, of type ``op_type``."""

    @abc.abstractmethod
    def value_name(self, name: str) -> str:
        """The graph name of an output value the caller named ``name``."""

    def _get_schema(self, op_type: str, domain: str, version: int | None) -> onnx.defs.OpSchema | None:
        return self.schema(op_type, domain, version)

    def _cast_inputs(self, schema: onnx.defs.OpSchema | None, inputs: Sequence[Any]) -> list[ir.Value | None]:
        return self.node_inputs(list(super()._cast_inputs(schema, inputs)))

    def _infer_shapes(self, node: ir.Node) -> None:
        self.type_outputs(node)

    def _annotate_node(self, node: ir.Node) -> None:
        self.annotate_node(node)

    def _generate_node_name(self, op_type: str) -> str:
        return self.node_name(op_type)

    def _qualify_value_name(self, name: str) -> str:
        return self.value_name(name)
