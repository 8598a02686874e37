"""A residual sum normalized over its last axis -> onnxruntime's ``com.microsoft``
SkipLayerNormalization (``target="onnxruntime"`` only): ``LayerNormalization(x + skip [+ bias])``
with ``x`` and ``skip`` of one 3-D shape and a constant per-feature bias.

onnxruntime fuses the same itself when a sum has no other reader (post-norm BERT), but not the
pre-norm residual stream of ViT and Whisper, whose sum also feeds the next residual: the fused
node writes that sum as its fourth output, one pass over the tensor instead of two.
"""

from __future__ import annotations

import onnx_ir as ir

from dynexport.passes.onnx.values import (
    MICROSOFT_DOMAIN,
    constant_array,
    insert_replacement,
    nodes_of,
    producer,
    replace_value,
    single_consumer,
)

__all__ = ["fuse_skip_layer_norm"]


def fuse_skip_layer_norm(graph: ir.Graph) -> int:
    """Replace every eligible Add + LayerNormalization of ``graph``; return how many."""
    fused = 0
    for norm in nodes_of(graph, "LayerNormalization"):
        matched = _match(norm)
        if matched is None:
            continue
        add, x, skip, bias = matched
        total = add.outputs[0]
        epsilon = norm.attributes["epsilon"].as_float() if "epsilon" in norm.attributes else 1e-5
        beta = norm.inputs[2] if len(norm.inputs) > 2 else None
        inputs = [x, skip, norm.inputs[1], beta] + ([bias] if bias is not None else [])
        skip_norm = ir.Node(
            MICROSOFT_DOMAIN, "SkipLayerNormalization", inputs, [ir.AttrFloat32("epsilon", epsilon)], num_outputs=4
        )
        summed = skip_norm.outputs[3]
        summed.type, summed.shape = total.type, total.shape
        # At the sum's place: other readers of the sum may come before the norm.
        if insert_replacement(graph, add, skip_norm, norm.outputs[0]):
            replace_value(total, summed)
            fused += 1
    return fused


def _match(norm: ir.Node) -> tuple[ir.Node, ir.Value, ir.Value, ir.Value | None] | None:
    """(the Add, x, skip, bias or None) when ``norm`` normalizes ``x + skip [+ bias]`` over the
    last axis of a float 3-D tensor with a constant 1-D scale (and shift)."""
    total = norm.inputs[0]
    add = producer(total, "Add")
    axis = norm.attributes["axis"].as_int() if "axis" in norm.attributes else -1
    if add is None or total.shape is None or len(total.shape) != 3 or axis not in (-1, 2):
        return None
    if total.dtype != ir.DataType.FLOAT or any(v.uses() or v.is_graph_output() for v in norm.outputs[1:]):
        return None
    scale = constant_array(norm.inputs[1])
    shift = constant_array(norm.inputs[2]) if len(norm.inputs) > 2 and norm.inputs[2] is not None else scale
    if scale is None or shift is None or scale.shape != (total.shape[2],) or shift.shape != scale.shape:
        return None
    x, skip = add.inputs
    if x.shape != total.shape or skip.shape != total.shape:
        return None
    for biased, other in ((x, skip), (skip, x)):
        bias_add = producer(biased, "Add")
        if bias_add is None or single_consumer(biased) is not add:
            continue
        for tensor, bias in (bias_add.inputs, bias_add.inputs[::-1]):
            array = constant_array(bias)
            if array is not None and array.shape == (total.shape[2],) and tensor.shape == total.shape:
                return add, tensor, other, bias
    return add, x, skip, None
