"""Checks that an exported model is portable ONNX, not only something onnxruntime accepts.

:func:`assert_shapes_agree`: onnx's own shape inference (strict, with data propagation), run on
the model stripped of every shape dynexport declared, infers the same element types, ranks and
static sizes as those declarations. :func:`assert_spec_only`: every node is an operator of the
ONNX specification (or of a domain the user asked for) and every value it reads or writes has a
type the operator's schema allows at the model's opset. :func:`assert_portable` runs both on a
program as :func:`tests.equivalence.assert_exports_equivalent` exported it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import onnx
import onnx.defs
import onnx.shape_inference

__all__ = [
    "SPEC_DOMAINS",
    "assert_portable",
    "assert_shapes_agree",
    "assert_spec_only",
    "shape_disagreements",
    "spec_violations",
]

# The domains the ONNX specification defines operators in.
SPEC_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})


def assert_portable(program: Any, export_options: Mapping[str, Any]) -> None:
    """Both checks on an exported program; the domains the export options ask for are allowed."""
    proto = program.model_proto
    assert_shapes_agree(proto)
    if export_options.get("custom_translation_table") is None:  # a custom rule may emit any domain
        assert_spec_only(proto, requested_domains(proto, export_options))


def requested_domains(model: onnx.ModelProto, export_options: Mapping[str, Any]) -> set[str]:
    """The custom domains an export with ``export_options`` asked for: ``custom_opsets``, the
    domains of the model's functions (``export_modules_as_functions``), with
    ``fallback="custom_domain"`` the ``pkg.torch.*`` domains of untranslated operators, and with
    ``target="onnxruntime"`` onnxruntime's ``com.microsoft``."""
    domains = set(export_options.get("custom_opsets") or ())
    if export_options.get("target") == "onnxruntime":
        domains.add("com.microsoft")
    domains.update(function.domain for function in model.functions)
    if export_options.get("fallback") == "custom_domain":
        domains.update(opset.domain for opset in model.opset_import if opset.domain.startswith("pkg.torch."))
    return domains


# -- shapes ---------------------------------------------------------------------------------------


def assert_shapes_agree(model: onnx.ModelProto) -> None:
    problems = shape_disagreements(model)
    assert not problems, "onnx shape inference disagrees with the declared types:\n  " + "\n  ".join(problems)


def shape_disagreements(model: onnx.ModelProto) -> list[str]:
    """Where onnx's shape inference, run without our declarations, infers another element type,
    rank or static size than we declare for a value (in every graph and subgraph), or a symbolic
    size (one of the graph's dim names, or an expression of them) where we declare a static one.
    A size one side leaves unknown is no disagreement (inference's ``unk__<n>`` names are unknown).

    Inference failing in strict mode is reported as one disagreement. A model holding operators
    onnx has no schema for (custom domains) is inferred leniently: their results have no type,
    which strict inference refuses wherever a known operator reads one inside a function."""
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for graph in _graphs(stripped.graph):
        del graph.value_info[:]
        for output in graph.output:
            output.ClearField("type")
    strict = _all_known(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(stripped, strict_mode=strict, data_prop=True)
    except onnx.shape_inference.InferenceError:
        # onnx 1.23's data propagation refuses some valid graphs: it propagates a rank-1 float
        # tensor's "values" and then fails to broadcast them (Unsqueeze(x[5], [1]) * y[10], an
        # outer product). Strict inference without it decides; the lenient run supplies shapes.
        try:
            onnx.shape_inference.infer_shapes(stripped, strict_mode=strict)
        except onnx.shape_inference.InferenceError as error:
            return [f"strict shape inference fails: {error}"]
        inferred = onnx.shape_inference.infer_shapes(stripped, data_prop=True)
    problems = []
    for ours, theirs in zip(_graphs(model.graph), _graphs(inferred.graph)):
        inferred_types = {value.name: value.type for value in [*theirs.value_info, *theirs.output]}
        inferred_types.update(
            (tensor.name, onnx.helper.make_tensor_type_proto(tensor.data_type, tensor.dims))
            for tensor in ours.initializer
        )
        producers = {output: node for node in ours.node for output in node.output}
        for value in [*ours.value_info, *ours.output]:
            if value.name not in inferred_types:
                continue
            for problem in _type_disagreements(value.type, inferred_types[value.name]):
                node = producers.get(value.name)
                made_by = f"{node.op_type} node {node.name!r}" if node is not None else "an initializer"
                problems.append(f"{value.name!r} (from {made_by}): {problem}")
    return problems


def _all_known(model: onnx.ModelProto) -> bool:
    """Whether every node (in every graph, subgraph and function) is an ONNX operator or one of
    the model's functions."""
    functions = {(function.domain, function.name) for function in model.functions}
    nodes = [node for graph in _graphs(model.graph) for node in graph.node]
    nodes += [node for function in model.functions for node in function.node]
    return all(node.domain in SPEC_DOMAINS or (node.domain, node.op_type) in functions for node in nodes)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it, depth first, in node and attribute order."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from _graphs(subgraph)


def _type_disagreements(ours: onnx.TypeProto, theirs: onnx.TypeProto) -> list[str]:
    kind, other_kind = ours.WhichOneof("value"), theirs.WhichOneof("value")
    if kind is None or other_kind is None:
        return []
    if kind != other_kind:
        return [f"declared a {kind}, inferred a {other_kind}"]
    if kind == "sequence_type":
        return _type_disagreements(ours.sequence_type.elem_type, theirs.sequence_type.elem_type)
    if kind == "optional_type":
        return _type_disagreements(ours.optional_type.elem_type, theirs.optional_type.elem_type)
    if kind != "tensor_type":
        return []
    ours_tensor, theirs_tensor = ours.tensor_type, theirs.tensor_type
    if ours_tensor.elem_type and theirs_tensor.elem_type and ours_tensor.elem_type != theirs_tensor.elem_type:
        names = [onnx.TensorProto.DataType.Name(t.elem_type) for t in (ours_tensor, theirs_tensor)]
        return [f"declared {names[0]}, inferred {names[1]}"]
    if not (ours_tensor.HasField("shape") and theirs_tensor.HasField("shape")):
        return []
    declared, inferred = list(ours_tensor.shape.dim), list(theirs_tensor.shape.dim)
    if len(declared) != len(inferred):
        ours_text, theirs_text = _shape_text(declared), _shape_text(inferred)
        return [f"declared rank {len(declared)} {ours_text}, inferred rank {len(inferred)} {theirs_text}"]
    for axis, (mine, other) in enumerate(zip(declared, inferred)):
        static_vs_static = (
            mine.HasField("dim_value") and other.HasField("dim_value") and mine.dim_value != other.dim_value
        )
        static_vs_symbolic = mine.HasField("dim_value") and other.HasField("dim_param") and not _unknown(other)
        if static_vs_static or static_vs_symbolic:
            return [f"dim {axis}: declared {_shape_text(declared)}, inferred {_shape_text(inferred)}"]
    return []


def _unknown(dim: onnx.TensorShapeProto.Dimension) -> bool:
    # Inference names a size it cannot compute unk__<n>: a fresh name, no claim about the size.
    return dim.dim_param.startswith("unk__")


def _shape_text(dims: list[onnx.TensorShapeProto.Dimension]) -> str:
    return (
        "["
        + ", ".join(
            str(d.dim_value) if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else "?"
            for d in dims
        )
        + "]"
    )


# -- operators and types --------------------------------------------------------------------------


def assert_spec_only(model: onnx.ModelProto, requested: set[str] | frozenset[str] = frozenset()) -> None:
    problems = spec_violations(model, requested)
    assert not problems, "the model holds what the ONNX specification does not allow:\n  " + "\n  ".join(problems)


def spec_violations(model: onnx.ModelProto, requested: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Nodes (in every graph, subgraph and function) outside the ONNX domains and ``requested``,
    and values whose element type an operator's type constraints do not allow at the model's
    opset. Types come from the model's declarations and onnx's shape inference."""
    opsets = {opset.domain or "": opset.version for opset in model.opset_import}
    opsets.setdefault("ai.onnx", opsets.get("", 0))
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:  # declarations inference contradicts: use them as they are
        typed = model
    problems = []
    graphs = [*_graphs(typed.graph), *(_graph_of(function) for function in typed.functions)]
    types = {}
    for graph in graphs:
        for value in [*graph.input, *graph.value_info, *graph.output]:
            types.setdefault(value.name, value.type)
        for initializer in graph.initializer:
            types.setdefault(initializer.name, onnx.helper.make_tensor_type_proto(initializer.data_type, None))
    local_functions = {(function.domain, function.name) for function in model.functions}
    for graph in graphs:
        for node in graph.node:
            domain = node.domain or ""
            if (domain, node.op_type) in local_functions:
                if domain not in requested and domain not in SPEC_DOMAINS:
                    problems.append(f"{node.op_type} node {node.name!r}: function domain {domain!r} was not asked for")
                continue
            if domain not in SPEC_DOMAINS:
                if domain not in requested:
                    problems.append(f"{node.op_type} node {node.name!r}: domain {domain!r} is not ONNX's")
                continue
            problems.extend(_node_type_violations(node, opsets.get(domain, opsets[""]), types))
    return problems


def _graph_of(function: onnx.FunctionProto) -> onnx.GraphProto:
    return onnx.helper.make_graph(list(function.node), function.name, [], [])


def _node_type_violations(node: onnx.NodeProto, opset: int, types: Mapping[str, onnx.TypeProto]) -> list[str]:
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return [f"{node.op_type} node {node.name!r}: no such operator in {node.domain or 'ai.onnx'} at opset {opset}"]
    allowed = {constraint.type_param_str: set(constraint.allowed_type_strs) for constraint in schema.type_constraints}
    problems = []
    for role, formals, actuals in (("input", schema.inputs, node.input), ("output", schema.outputs, node.output)):
        for index, name in enumerate(actuals):
            if not name or name not in types:
                continue
            formal = formals[min(index, len(formals) - 1)]  # a variadic parameter is the last
            type_text = _type_text(types[name])
            if type_text is None:
                continue
            if formal.type_str in allowed:
                ok = type_text in allowed[formal.type_str]
            else:
                ok = type_text == formal.type_str
            if not ok:
                where = f"{node.op_type}-{schema.since_version} node {node.name!r}: {role} {index} ({name!r})"
                problems.append(
                    f"{where} is {type_text}, which {formal.name} ({formal.type_str}) does not allow at opset {opset}"
                )
    return problems


def _type_text(type_proto: onnx.TypeProto) -> str | None:
    """The schema spelling of a type (``tensor(float)``, ``seq(tensor(int64))``), None where
    its element type is unknown."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        elem = type_proto.tensor_type.elem_type
        return (
            f"tensor({onnx.helper.tensor_dtype_to_string(elem).removeprefix('TensorProto.').lower()})" if elem else None
        )
    if kind in ("sequence_type", "optional_type"):
        inner = _type_text(getattr(type_proto, kind).elem_type)
        return None if inner is None else f"{'seq' if kind == 'sequence_type' else 'optional'}({inner})"
    return None
