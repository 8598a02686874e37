"""export_modules_as_functions: each call of a chosen module becomes a call of an ONNX local
function named after its class.

Calls are extracted innermost first, so a function's body calls the functions of its submodules.
Two calls whose bodies are the same (same ops, attributes and wiring: e.g. every layer of a
transformer) share one definition. Small constants a body uses are copied into it; weights and
other values come in as inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import onnx_ir as ir

from dynexport.passes.onnx.naming import unique_name

__all__ = ["DOMAIN", "extract_module_functions", "module_selector"]

DOMAIN = "pkg.dynexport.modules"
# A Constant of at most this many elements is copied into each function body that uses it.
_INLINED_CONSTANT_SIZE = 64

ModuleCall = tuple[str, str, str]  # (call key, module path, qualified class name)


def module_selector(selection: bool | Iterable[type]) -> Callable[[str], bool]:
    """Which qualified class names ``export_modules_as_functions`` asks for."""
    if selection is True:
        return lambda name: True
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in selection}
    return names.__contains__


@dataclasses.dataclass
class _Extraction:
    graph: ir.Graph
    calls: dict[ir.Node, tuple[ModuleCall, ...]]
    opset_imports: dict[str, int]
    functions: dict[ir.OperatorIdentifier, ir.Function] = dataclasses.field(default_factory=dict)
    signatures: dict[tuple, ir.Function] = dataclasses.field(default_factory=dict)


def extract_module_functions(
    model: ir.Model, calls: dict[ir.Node, tuple[ModuleCall, ...]], selected: Callable[[str], bool]
) -> int:
    """Turn every selected module call in ``model``'s main graph into a function call.

    ``calls`` gives, for each node, the module calls it ran inside (outermost first). Returns
    how many calls were extracted.
    """
    state = _Extraction(model.graph, dict(calls), dict(model.graph.opset_imports))
    wanted = {call for stack in calls.values() for call in stack if selected(call[2])}
    depth = {call: stack.index(call) for stack in calls.values() for call in stack if call in wanted}
    extracted = 0
    for call in sorted(wanted, key=lambda c: -depth[c]):
        members = [node for node in state.graph if _is_member(state, node, call, depth[call])]
        if members and _extract(state, call, depth[call], members):
            extracted += 1
    model.functions.update(state.functions)
    state.graph.sort()
    return extracted


def _is_member(state: _Extraction, node: ir.Node, call: ModuleCall, depth: int) -> bool:
    stack = state.calls.get(node, ())
    return len(stack) > depth and stack[depth] == call and not _is_small_constant(node)


def _is_small_constant(node: ir.Node) -> bool:
    if node.op_type != "Constant" or node.domain != "":
        return False
    attribute = node.attributes.get("value")
    return attribute is not None and attribute.as_tensor().size <= _INLINED_CONSTANT_SIZE


def _extract(state: _Extraction, call: ModuleCall, depth: int, members: list[ir.Node]) -> bool:
    member_set = set(members)
    inputs: list[ir.Value] = []
    copied_constants: list[ir.Node] = []
    for node in members:
        for value in node.inputs:
            if value is None or value in inputs:
                continue
            producer = value.producer()
            if producer in member_set:
                continue
            if producer is not None and _is_small_constant(producer):
                if producer not in copied_constants:
                    copied_constants.append(producer)
                continue
            inputs.append(value)
    graph_outputs = set(state.graph.outputs)
    outputs = [
        value
        for node in members
        for value in node.outputs
        if value in graph_outputs or any(user not in member_set for user, _ in value.uses())
    ]
    if not outputs or not _is_convex(member_set, inputs):
        return False

    body_inputs = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in inputs]
    constant_copies = {
        node.outputs[0]: ir.node("Constant", [], attributes=dict(node.attributes), name=node.name)
        for node in copied_constants
    }
    # Rewire before moving: outside users read the call's outputs, members read body inputs.
    call_outputs = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in outputs]
    for value, replacement in zip(outputs, call_outputs):
        for user, index in list(value.uses()):
            if user not in member_set:
                user.replace_input_with(index, replacement)
        if value in graph_outputs:
            state.graph.outputs[state.graph.outputs.index(value)] = replacement
    for node in members:
        for index, value in enumerate(node.inputs):
            if value in constant_copies:
                node.replace_input_with(index, constant_copies[value].outputs[0])
            elif value is not None and value.producer() not in member_set:
                node.replace_input_with(index, body_inputs[inputs.index(value)])

    anchor = members[0]
    name = call[2].rsplit(".", 1)[-1]
    placeholder = ir.Node(DOMAIN, name, inputs, outputs=call_outputs, name=f"{call[1]}/{name}")
    placeholder.metadata_props.update({"pkg.dynexport.module": call[1], "pkg.dynexport.module_class": call[2]})
    state.graph.insert_before(anchor, placeholder)
    state.graph.remove(members)
    body_nodes = [*constant_copies.values(), *members]
    body = ir.Graph(body_inputs, outputs, nodes=body_nodes, opset_imports=_body_opsets(state, body_nodes))
    function = _shared_function(state, name, body)
    placeholder.op_type = function.name
    state.calls[placeholder] = state.calls[anchor][:depth]
    for node in members:
        state.calls.pop(node, None)
    return True


def _is_convex(members: set[ir.Node], inputs: list[ir.Value]) -> bool:
    """No input of the call depends on one of its own members (else it cannot be one node)."""
    seen: set[ir.Node] = set()
    pending = [value.producer() for value in inputs if value.producer() is not None]
    while pending:
        node = pending.pop()
        if node in members:
            return False
        if node in seen:
            continue
        seen.add(node)
        pending.extend(v.producer() for v in node.inputs if v is not None and v.producer() is not None)
    return True


def _body_opsets(state: _Extraction, nodes: list[ir.Node]) -> dict[str, int]:
    domains = {node.domain for node in nodes} | {""}
    return {domain: state.opset_imports.get(domain, 1) for domain in domains}


def _signature(body: ir.Graph) -> tuple:
    """What makes two bodies the same function: ops, attributes and wiring, not value names."""
    index = {value: ("in", i) for i, value in enumerate(body.inputs)}
    entries = []
    for n, node in enumerate(body):
        for k, value in enumerate(node.outputs):
            index[value] = ("node", n, k)
        attributes = tuple(sorted((key, repr(attr.value)) for key, attr in node.attributes.items()))
        entries.append((node.domain, node.op_type, attributes, tuple(index.get(v) for v in node.inputs)))
    return tuple(entries), tuple(index[v] for v in body.outputs)


def _shared_function(state: _Extraction, name: str, body: ir.Graph) -> ir.Function:
    signature = _signature(body)
    function = state.signatures.get(signature)
    if function is not None:
        return function
    unique = unique_name(name, {f.name for f in state.functions.values()})
    body.name = unique
    function = ir.Function(DOMAIN, unique, graph=body, attributes=[])
    state.functions[function.identifier()] = function
    state.signatures[signature] = function
    state.opset_imports.setdefault(DOMAIN, 1)
    state.graph.opset_imports.setdefault(DOMAIN, 1)
    return function
