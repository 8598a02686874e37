"""Text forms of models and values: the graph printout (``ONNXProgram.to_text``), type and
shape text (``float[batch, 3]``) for ONNX IR values and ModelProto value infos, and module labels.
"""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["format_graph", "module_label", "type_proto_text", "type_text", "value_text"]


def module_label(path: str, class_name: str | type) -> str:
    """The module a node came from, as ``path (Class)``: ``layer1.0.conv1 (Conv2d)``, ``<root>
    (Model)`` for the model itself; ``class_name`` may be qualified, or the class."""
    if isinstance(class_name, type):
        class_name = class_name.__name__
    short = class_name.rsplit(".", 1)[-1]
    return f"{path or '<root>'} ({short})" if short else path


def type_text(value: ir.Value | None) -> str:
    """A value's element type and shape: ``float[batch, 3]``."""
    if value is None:
        return "None"
    dtype = value.dtype.name.lower() if value.dtype is not None else "?"
    if value.shape is None:
        return dtype
    return f"{dtype}[{', '.join(str(d) for d in value.shape)}]"


def value_text(value: ir.Value) -> str:
    """A value's name, element type and shape: ``x: float[batch, 3]``."""
    return f"{value.name}: {type_text(value)}"


def _attribute_text(attr: ir.Attr) -> str:
    value = attr.value
    if isinstance(value, ir.TensorProtocol):
        if value.size <= 8:
            numbers = value.numpy().reshape(-1).tolist()
            return "{" + ", ".join(str(n) for n in numbers) + "}"
        return f"<{value.dtype.name.lower()}[{', '.join(str(d) for d in value.shape)}]>"
    if isinstance(value, ir.Graph):
        return f"<graph {value.name}>"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, ir.DataType):
        return value.name.lower()
    return repr(value) if isinstance(value, str) else str(value)


def _node_text(node: ir.Node) -> str:
    outputs = ", ".join(f"%{o.name} : {type_text(o)}" for o in node.outputs)
    domain = f"{node.domain}::" if node.domain else ""
    attrs = ", ".join(f"{name}={_attribute_text(a)}" for name, a in node.attributes.items())
    inputs = ", ".join("%" + v.name if v is not None else "None" for v in node.inputs)
    line = f"  {outputs} = {domain}{node.op_type}{f'[{attrs}]' if attrs else ''}({inputs})"
    props = node.metadata_props
    module = props.get("pkg.dynexport.module")
    if module is not None and not module.startswith("_empty_nn_module_stack"):
        line += f", scope: {module_label(module, props.get('pkg.dynexport.module_class', ''))}"
    return line


def format_graph(model: ir.Model, *, max_nodes: int | None = None) -> str:
    """The text form of ``model``'s main graph (see :meth:`ONNXProgram.to_text`)."""
    graph = model.graph
    opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in model.opset_imports.items())
    lines = [f"graph {graph.name or 'main_graph'} (opset {opsets}) ("]
    lines += [f"  %{v.name} : {type_text(v)}" for v in graph.inputs]
    initializers = [v for v in graph.initializers.values() if not v.is_graph_input()]
    if initializers:
        lines.append(") initializers (")
        lines += [f"  %{v.name} : {type_text(v)}" for v in initializers]
    lines.append(") {")
    nodes = list(graph)
    shown = nodes if max_nodes is None else nodes[:max_nodes]
    lines += [_node_text(n) for n in shown]
    if len(shown) < len(nodes):
        lines.append(f"  # ... {len(nodes) - len(shown)} more nodes")
    lines.append("  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines)


def type_proto_text(type_proto) -> str:
    """An ``onnx.TypeProto``'s element type and shape, as :func:`type_text` writes them."""
    import onnx

    tensor = type_proto.tensor_type
    dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    if not tensor.HasField("shape"):
        return dtype
    dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in tensor.shape.dim]
    return f"{dtype}[{', '.join(dims)}]"
