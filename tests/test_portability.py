"""The portability checks (tests/portability.py) on hand-made models: each kind of problem they
exist to find is found, and what is no problem passes."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import dynexport
from tests.portability import requested_domains, shape_disagreements, spec_violations


def _model(nodes, inputs, outputs, value_info=(), opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "g", list(inputs), list(outputs), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _tensor(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _relu_then_transpose(declared_hidden, declared_output):
    nodes = [
        helper.make_node("Relu", ["x"], ["hidden"], name="relu"),
        helper.make_node("Transpose", ["hidden"], ["y"], name="transpose", perm=[1, 0]),
    ]
    return _model(nodes, [_tensor("x", TensorProto.FLOAT, ["batch", 3])], [declared_output], [declared_hidden])


def test_agreeing_declarations_pass():
    model = _relu_then_transpose(
        _tensor("hidden", TensorProto.FLOAT, ["batch", 3]), _tensor("y", TensorProto.FLOAT, [3, "batch"])
    )
    assert shape_disagreements(model) == []


@pytest.mark.parametrize(
    "hidden, output, expected",
    [
        # a wrong static size
        (
            ["batch", 4],
            [3, "batch"],
            "'hidden' (from Relu node 'relu'): dim 1: declared [batch, 4], inferred [batch, 3]",
        ),
        # a static size where the value has the input's dynamic one
        ([1, 3], [3, "batch"], "'hidden' (from Relu node 'relu'): dim 0: declared [1, 3], inferred [batch, 3]"),
        # another rank, on a graph output
        (
            ["batch", 3],
            [3, "batch", 1],
            "'y' (from Transpose node 'transpose'): declared rank 3 [3, batch, 1], inferred rank 2 [3, batch]",
        ),
    ],
)
def test_wrong_declared_shapes_are_found(hidden, output, expected):
    model = _relu_then_transpose(_tensor("hidden", TensorProto.FLOAT, hidden), _tensor("y", TensorProto.FLOAT, output))
    assert shape_disagreements(model) == [expected]


def test_wrong_declared_type_is_found():
    model = _relu_then_transpose(
        _tensor("hidden", TensorProto.DOUBLE, ["batch", 3]), _tensor("y", TensorProto.FLOAT, [3, "batch"])
    )
    assert shape_disagreements(model) == ["'hidden' (from Relu node 'relu'): declared DOUBLE, inferred FLOAT"]


def test_unknown_sizes_are_no_disagreement():
    # Inference cannot know the output of a Reshape to a computed shape; we can.
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),
    ]
    model = _model(nodes, [_tensor("x", TensorProto.FLOAT, None)], [_tensor("y", TensorProto.FLOAT, [2, 3])])
    assert shape_disagreements(model) == []


def test_an_outer_product_is_no_disagreement():
    # onnx's strict inference with data propagation refuses this valid graph (see portability.py).
    nodes = [
        helper.make_node("Unsqueeze", ["a", "axes"], ["column"], name="unsqueeze"),
        helper.make_node("Mul", ["column", "b"], ["y"], name="mul"),
    ]
    model = _model(
        nodes,
        [_tensor("a", TensorProto.FLOAT, [5]), _tensor("b", TensorProto.FLOAT, [10])],
        [_tensor("y", TensorProto.FLOAT, [5, 10])],
        [_tensor("column", TensorProto.FLOAT, [5, 1])],
    )
    model.graph.initializer.append(helper.make_tensor("axes", TensorProto.INT64, [1], [1]))
    assert shape_disagreements(model) == []
    model.graph.value_info[0].type.tensor_type.shape.dim[1].dim_value = 2
    assert shape_disagreements(model) == [
        "'column' (from Unsqueeze node 'unsqueeze'): dim 1: declared [5, 2], inferred [5, 1]"
    ]


def test_a_wrong_declaration_inside_a_subgraph_is_found():
    branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["negated"], name="neg")],
        "then",
        [],
        [_tensor("negated", TensorProto.FLOAT, ["batch", 3])],
    )
    other = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["absolute"], name="abs")],
        "else",
        [],
        [_tensor("absolute", TensorProto.FLOAT, [5, 3])],
    )
    nodes = [helper.make_node("If", ["flag"], ["y"], name="if", then_branch=branch, else_branch=other)]
    model = _model(
        nodes,
        [_tensor("flag", TensorProto.BOOL, []), _tensor("x", TensorProto.FLOAT, ["batch", 3])],
        [_tensor("y", TensorProto.FLOAT, ["batch", 3])],
    )
    assert shape_disagreements(model) == [
        "'absolute' (from Abs node 'abs'): dim 0: declared [5, 3], inferred [batch, 3]"
    ]


def test_a_contrib_operator_is_found():
    nodes = [helper.make_node("Gelu", ["x"], ["y"], name="gelu", domain="com.microsoft")]
    model = _model(
        nodes,
        [_tensor("x", TensorProto.FLOAT, [2])],
        [_tensor("y", TensorProto.FLOAT, [2])],
        opsets=[("", 17), ("com.microsoft", 1)],
    )
    assert spec_violations(model) == ["Gelu node 'gelu': domain 'com.microsoft' is not ONNX's"]
    assert spec_violations(model, {"com.microsoft"}) == []


@pytest.mark.parametrize(
    "op, elem_type, opset, expected",
    [
        ("Relu", TensorProto.FLOAT, 13, None),
        ("Relu", TensorProto.INT32, 14, None),  # integer Relu from opset 14
        (
            "Relu",
            TensorProto.INT32,
            13,
            "Relu-13 node 'op': input 0 ('x') is tensor(int32), which X (T) does not allow at opset 13",
        ),
        (
            "Neg",
            TensorProto.BOOL,
            17,
            "Neg-13 node 'op': input 0 ('x') is tensor(bool), which X (T) does not allow at opset 17",
        ),
    ],
)
def test_types_outside_the_schema_are_found(op, elem_type, opset, expected):
    model = _model(
        [helper.make_node(op, ["x"], ["y"], name="op")],
        [_tensor("x", elem_type, [2])],
        [_tensor("y", elem_type, [2])],
        opsets=[("", opset)],
    )
    assert spec_violations(model) == (
        []
        if expected is None
        else [expected, expected.replace("input 0 ('x')", "output 0 ('y')").replace("X (T)", "Y (T)")]
    )


def test_an_operator_newer_than_the_opset_is_found():
    nodes = [helper.make_node("Gelu", ["x"], ["y"], name="gelu")]  # ONNX Gelu exists from opset 20
    model = _model(
        nodes, [_tensor("x", TensorProto.FLOAT, [2])], [_tensor("y", TensorProto.FLOAT, [2])], opsets=[("", 17)]
    )
    assert spec_violations(model) == ["Gelu node 'gelu': no such operator in ai.onnx at opset 17"]


def test_requested_domains_come_from_the_export_options():
    class WithCustomFallback(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.special_zeta(x, 2.0)

    program = dynexport.export(WithCustomFallback(), (torch.rand(3) + 1,), fallback="custom_domain")
    domains = {node.domain for node in program.model_proto.graph.node} - {""}
    assert domains and domains <= requested_domains(program.model_proto, {"fallback": "custom_domain"})
    assert (
        spec_violations(program.model_proto, requested_domains(program.model_proto, {"fallback": "custom_domain"}))
        == []
    )
    assert spec_violations(program.model_proto) != []
    assert requested_domains(program.model_proto, {"custom_opsets": {"my.domain": 2}}) == {"my.domain"}
    assert requested_domains(onnx.ModelProto(), {"target": "onnxruntime"}) == {"com.microsoft"}
    assert requested_domains(onnx.ModelProto(), {}) == set()
