"""Collapse chains that compute in two steps what one step does: Transpose of a Transpose,
Reshape of a Reshape, Cast of a lossless Cast, Unsqueeze of an Unsqueeze, Squeeze of an Unsqueeze on
the same axes, Unsqueeze of a Squeeze that puts the squeezed axes back."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import add_initializer, constant_array, replace_value

__all__ = ["collapse_chains"]

_D = ir.DataType
# Casts from the key to any of the values keep every value exactly.
_EXACT_CASTS = {
    _D.BOOL: {_D.INT8, _D.UINT8, _D.INT16, _D.UINT16, _D.INT32, _D.UINT32, _D.INT64, _D.UINT64, _D.FLOAT16, _D.BFLOAT16, _D.FLOAT, _D.DOUBLE},
    _D.INT8: {_D.INT16, _D.INT32, _D.INT64, _D.FLOAT16, _D.BFLOAT16, _D.FLOAT, _D.DOUBLE},
    _D.UINT8: {_D.INT16, _D.UINT16, _D.INT32, _D.UINT32, _D.INT64, _D.UINT64, _D.FLOAT16, _D.BFLOAT16, _D.FLOAT, _D.DOUBLE},
    _D.INT16: {_D.INT32, _D.INT64, _D.FLOAT, _D.DOUBLE},
    _D.UINT16: {_D.INT32, _D.UINT32, _D.INT64, _D.UINT64, _D.FLOAT, _D.DOUBLE},
    _D.INT32: {_D.INT64, _D.DOUBLE},
    _D.UINT32: {_D.UINT64, _D.INT64, _D.DOUBLE},
    _D.FLOAT16: {_D.FLOAT, _D.DOUBLE},
    _D.BFLOAT16: {_D.FLOAT, _D.DOUBLE},
    _D.FLOAT: {_D.DOUBLE},
}


def collapse_chains(graph: ir.Graph) -> int:
    """Rewrite each chain's second node to read the chain's input; return how many."""
    collapsed = 0
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
            continue
        inner = node.inputs[0].producer()
        if inner is None or inner.op_type != node.op_type or inner.domain != node.domain:
            if inner is not None and node.op_type == "Squeeze" and inner.op_type == "Unsqueeze":
                collapsed += _squeeze_of_unsqueeze(graph, node, inner)
            if inner is not None and node.op_type == "Unsqueeze" and inner.op_type == "Squeeze":
                collapsed += _unsqueeze_of_squeeze(graph, node, inner)
            continue
        if node.op_type == "Unsqueeze":
            collapsed += _unsqueeze_of_unsqueeze(graph, node, inner)
            continue
        rewrite = _REWRITES.get(node.op_type)
        if rewrite is not None and rewrite(node, inner):
            collapsed += 1
    return collapsed


def _transpose(node: ir.Node, inner: ir.Node) -> bool:
    outer_perm, inner_perm = node.attributes.get("perm"), inner.attributes.get("perm")
    if outer_perm is None or inner_perm is None:
        return False
    composed = [inner_perm.as_ints()[i] for i in outer_perm.as_ints()]
    node.attributes["perm"] = ir.AttrInt64s("perm", composed)
    node.replace_input_with(0, inner.inputs[0])
    return True


def _reshape(node: ir.Node, inner: ir.Node) -> bool:
    target = constant_array(node.inputs[1])
    allow_zero = node.attributes["allowzero"].as_int() if "allowzero" in node.attributes else 0
    if target is None or (0 in target and not allow_zero):
        return False  # a 0 copies a dim of the inner result, which the outer input would not have
    node.replace_input_with(0, inner.inputs[0])
    return True


def _cast(node: ir.Node, inner: ir.Node) -> bool:
    source = inner.inputs[0].dtype
    middle = ir.DataType(inner.attributes["to"].as_int())
    if source is None or (middle not in _EXACT_CASTS.get(source, ()) and middle != source):
        return False
    node.replace_input_with(0, inner.inputs[0])
    return True


def _unsqueeze_of_unsqueeze(graph: ir.Graph, node: ir.Node, inner: ir.Node) -> int:
    """One Unsqueeze inserting both nodes' new axes: the outer's at its own positions, the inner's
    at the positions the outer leaves to the inner's result, in order."""
    outer_axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    inner_axes = constant_array(inner.inputs[1]) if len(inner.inputs) > 1 else None
    if outer_axes is None or inner_axes is None:
        return 0
    outer_axes, inner_axes = outer_axes.reshape(-1).tolist(), inner_axes.reshape(-1).tolist()
    if not outer_axes or not inner_axes or any(a < 0 for a in outer_axes + inner_axes):
        return 0  # negative axes count from ranks the rewrite would change
    inserted = set(outer_axes)
    # The final positions the outer leaves to the inner's result, as many as its axes reach.
    kept = [position for position in range(max(inner_axes) + len(outer_axes) + 1) if position not in inserted]
    axes = sorted(inserted | {kept[a] for a in inner_axes})
    node.replace_input_with(1, add_initializer(graph, np.array(axes, dtype=np.int64), f"{node.name}_axes"))
    node.replace_input_with(0, inner.inputs[0])
    return 1


def _unsqueeze_of_squeeze(graph: ir.Graph, node: ir.Node, inner: ir.Node) -> int:
    """One Unsqueeze of the Squeeze's input when the outer's new axes can hold the squeezed ones
    where they were, in order: the same tensor, as every squeezed axis has size 1."""
    squeezed = constant_array(inner.inputs[1]) if len(inner.inputs) > 1 else None
    inserted = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    x, result = inner.inputs[0], node.outputs[0]
    if squeezed is None or inserted is None or (x.shape is None and result.shape is None):
        return 0
    squeezed, inserted = set(squeezed.reshape(-1).tolist()), set(inserted.reshape(-1).tolist())
    if any(a < 0 for a in squeezed | inserted):
        return 0
    rank = len(x.shape) if x.shape is not None else len(result.shape) - len(inserted) + len(squeezed)
    axis, added = 0, []
    for position in range(rank - len(squeezed) + len(inserted)):
        if position in inserted and axis in squeezed:
            axis += 1  # a squeezed axis of x back in its place
        elif position in inserted:
            added.append(position)
        elif axis in squeezed:
            return 0  # a dim of x would come after one the outer Unsqueeze places later
        else:
            axis += 1
    if axis != rank:
        return 0
    if not added:
        if not replace_value(node.outputs[0], x):
            return 0
        graph.remove(node, safe=True)
        return 1
    node.replace_input_with(1, add_initializer(graph, np.array(added, dtype=np.int64), f"{node.name}_axes"))
    node.replace_input_with(0, x)
    return 1


def _squeeze_of_unsqueeze(graph: ir.Graph, node: ir.Node, inner: ir.Node) -> int:
    squeezed = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    unsqueezed = constant_array(inner.inputs[1]) if len(inner.inputs) > 1 else None
    if squeezed is None or unsqueezed is None or sorted(squeezed.tolist()) != sorted(unsqueezed.tolist()):
        return 0
    if any(a < 0 for a in squeezed.tolist() + unsqueezed.tolist()):
        return 0  # negative axes count from different ranks
    if not replace_value(node.outputs[0], inner.inputs[0]):
        return 0
    graph.remove(node, safe=True)
    return 1


_REWRITES = {"Transpose": _transpose, "Reshape": _reshape, "Cast": _cast}
