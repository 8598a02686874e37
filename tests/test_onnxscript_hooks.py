"""dynexport.onnxscript_hooks, the one adapter to onnxscript's private GraphBuilder hooks: these
tests fail when an onnxscript upgrade renames a hook, changes its parameters or stops calling it."""

from __future__ import annotations

import inspect

import onnx
import onnx_ir as ir
import pytest
from onnxscript import BuilderFeature, GraphBuilder

from dynexport.builder import ModelBuilder
from dynexport.onnxscript_hooks import FEATURES, HOOKS, HookedGraphBuilder


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_onnxscript_defines_each_hook_with_the_parameters_overridden(hook):
    defined = getattr(GraphBuilder, hook, None)
    assert defined is not None, f"onnxscript's GraphBuilder has no {hook} any more"
    assert tuple(inspect.signature(defined).parameters) == HOOKS[hook]
    assert tuple(inspect.signature(getattr(HookedGraphBuilder, hook)).parameters) == HOOKS[hook]


def test_only_the_listed_hooks_are_overridden():
    private = {name for name in vars(HookedGraphBuilder) if name.startswith("_") and not name.startswith("__")}
    assert private == set(HOOKS) | {"_abc_impl"}


class _RecordingBuilder(HookedGraphBuilder):
    def __init__(self, graph: ir.Graph):
        super().__init__(graph)
        self.calls: list[str] = []

    def schema(self, op_type, domain, version):
        self.calls.append("schema")
        return onnx.defs.get_schema(op_type, version, domain)

    def node_inputs(self, inputs):
        self.calls.append("node_inputs")
        return inputs

    def type_outputs(self, node):
        self.calls.append("type_outputs")
        node.outputs[0].type = ir.TensorType(node.inputs[0].dtype)

    def annotate_node(self, node):
        self.calls.append("annotate_node")
        node.metadata_props["origin"] = "test"

    def node_name(self, op_type):
        return f"node/{op_type}"

    def value_name(self, name):
        return f"scope.{name}"


def test_building_a_node_goes_through_every_hook():
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    graph = ir.Graph([x], [], nodes=[], opset_imports={"": 18})
    builder = _RecordingBuilder(graph)
    assert builder.features == FEATURES == BuilderFeature.CAST_INPUTS | BuilderFeature.INFER_SHAPES

    total = builder.call_op("Add", [x, 1.5], {}, version=18, outputs=["total"])
    node = total.producer()
    assert builder.calls == ["schema", "node_inputs", "annotate_node", "type_outputs"]
    assert node.name == "node/Add"
    assert total.name == "scope.total"
    assert total.dtype == ir.DataType.FLOAT
    assert node.metadata_props["origin"] == "test"
    # CAST_INPUTS made the Python float a float constant of x's type.
    assert node.inputs[1].dtype == ir.DataType.FLOAT


def test_the_graph_builder_overrides_no_onnxscript_internal_itself():
    shadowed = {
        name for name in vars(ModelBuilder)
        if name.startswith("_") and not name.startswith("__") and hasattr(GraphBuilder, name)
    }
    assert shadowed <= {"_abc_impl"}  # abc's bookkeeping, not a hook
