"""Multi-head attention between its projections -> onnxruntime's ``com.microsoft``
MultiHeadAttention (``target="onnxruntime"`` only).

The pattern is what PyTorch's attention layers translate to: each of q, k, v of shape
``(batch, sequence, heads * head_size)`` reshaped to ``(batch, sequence, heads, head_size)`` and
transposed to put the heads first (k straight to ``(batch, heads, head_size, sequence)``), then
``Softmax(q·s @ kᵀ [+ bias | Where(mask, ·, -inf)]) @ v``, transposed back and reshaped to
``(batch, sequence, heads * head_size)``. MultiHeadAttention takes the three projections as they
are and returns that last tensor: one kernel instead of the reshapes, transposes, two batched
MatMuls and a Softmax over a materialized score tensor.

A boolean mask becomes an additive ``attention_bias`` of 0 and -inf. A row whose keys are all
masked is 0 in PyTorch's attention (the translation guards the Softmax, which would give NaN);
onnxruntime's kernel gives NaN there, so the fused output keeps the same guard, on the bias.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import (
    MICROSOFT_DOMAIN,
    add_initializer,
    constant_scalar,
    insert_replacement,
    nodes_of,
    producer,
    reduction,
    single_consumer,
)

__all__ = ["fuse_multi_head_attention"]


def fuse_multi_head_attention(graph: ir.Graph, *, opset: int) -> int:
    """Replace every multi-head attention between projections in ``graph``; return how many."""
    fused = 0
    for softmax in nodes_of(graph, "Softmax"):
        matched = _match(softmax)
        if matched is not None:
            fused += _replace(graph, opset, *matched)
    return fused


def _match(softmax: ir.Node):
    axis = softmax.attributes["axis"].as_int() if "axis" in softmax.attributes else -1
    if axis not in (-1, 3):
        return None
    probabilities, guarded = _guarded(softmax)
    output = single_consumer(probabilities)
    if output is None or output.op_type != "MatMul" or output.inputs[0] is not probabilities:
        return None
    scores, mask, bias = _masked(softmax.inputs[0])
    if (mask is not None) != guarded:
        return None
    matmul = producer(scores, "MatMul")
    if matmul is None or single_consumer(scores) is None:
        return None
    q, q_scale = _scaled(matmul.inputs[0])
    k, k_scale = _scaled(matmul.inputs[1])
    q, heads = _split_heads(q, (0, 2, 1, 3))
    k, k_heads = _split_heads(k, (0, 2, 3, 1))
    v, v_heads = _split_heads(output.inputs[1], (0, 2, 1, 3))
    merged = _merged_heads(output.outputs[0])
    if None in (q, k, v, merged) or not heads == k_heads == v_heads or q.dtype != ir.DataType.FLOAT:
        return None
    # Whisper and BART scale the query projection before splitting it into heads.
    q, projection_scale = _scaled(q)
    if bias is not None and not _is_attention_bias(bias, q, k, (1, heads)):
        return None
    if mask is not None and not _is_attention_bias(mask, q, k, (1,)):
        return None
    return q, k, v, heads, q_scale * k_scale * projection_scale, mask, bias, merged


def _is_attention_bias(bias: ir.Value, q: ir.Value, k: ir.Value, heads: tuple[int, ...]) -> bool:
    """True for the shape MultiHeadAttention takes as ``attention_bias``: (batch or 1, one of
    ``heads``, query length, key length), the lengths equal to q's and k's, not broadcast."""
    shape = bias.shape
    return (
        shape is not None
        and len(shape) == 4
        and shape[0] in (1, q.shape[0])
        and shape[1] in heads
        and shape[2] == q.shape[1]
        and shape[3] == k.shape[1]
    )


def _replace(graph, opset, q, k, v, heads, scale, mask, bias, merged) -> bool:
    before = []
    if mask is not None:
        kept = add_initializer(graph, np.array(0.0, np.float32), "attention_kept")
        masked = add_initializer(graph, np.array(-math.inf, np.float32), "attention_masked")
        before.append(ir.Node("", "Where", [mask, kept, masked]))
        bias = before[-1].outputs[0]
    inputs = [q, k, v, None, None, bias] if bias is not None else [q, k, v]
    attributes = [ir.AttrInt64("num_heads", heads), ir.AttrFloat32("scale", scale)]
    attention = last = ir.Node(MICROSOFT_DOMAIN, "MultiHeadAttention", inputs, attributes)
    if mask is not None:
        # Rows of the (batch, 1, sequence, keys) bias whose every key is masked give 0.
        largest = reduction(graph, "ReduceMax", bias, [-1], opset)
        none_kept = ir.Node("", "Equal", [largest.outputs[0], masked])
        heads_axis = add_initializer(graph, np.array([1], np.int64), "attention_heads_axis")
        per_row = ir.Node("", "Squeeze", [none_kept.outputs[0], heads_axis])
        before += [attention, largest, none_kept, per_row]
        last = ir.Node("", "Where", [per_row.outputs[0], kept, attention.outputs[0]])
    anchor = merged.producer()
    for node in before:
        node.metadata_props.update(anchor.metadata_props)
    graph.insert_before(anchor, before)
    if insert_replacement(graph, anchor, last, merged):
        return True
    graph.remove(before)
    return False


def _guarded(softmax: ir.Node) -> tuple[ir.Value, bool]:
    """(the probabilities, True) when the Softmax's result is zeroed on rows whose scores are
    all -inf (``Where(ReduceMax(s) == -inf, 0, Softmax(s))``), else (its output, False)."""
    probabilities = softmax.outputs[0]
    where = single_consumer(probabilities)
    if where is None or where.op_type != "Where" or where.inputs[2] is not probabilities:
        return probabilities, False
    equal = producer(where.inputs[0], "Equal")
    largest = producer(equal.inputs[0], "ReduceMax") if equal is not None else None
    if (
        largest is None
        or largest.inputs[0] is not softmax.inputs[0]
        or constant_scalar(equal.inputs[1]) != -math.inf
        or constant_scalar(where.inputs[1]) != 0.0
    ):
        return probabilities, False
    return where.outputs[0], True


def _masked(value: ir.Value) -> tuple[ir.Value, ir.Value | None, ir.Value | None]:
    """(scores, boolean mask, additive bias) of ``Where(mask, scores, -inf)`` or ``scores + bias``."""
    where = producer(value, "Where")
    if where is not None:
        condition, scores, fill = where.inputs
        if constant_scalar(fill) == -math.inf and condition.dtype == ir.DataType.BOOL:
            return scores, condition, None
    add = producer(value, "Add")
    if add is not None and single_consumer(value) is not None:
        for scores, bias in (add.inputs, add.inputs[::-1]):
            if producer(scores, "MatMul") is not None and bias.dtype == ir.DataType.FLOAT:
                return scores, None, bias
    return value, None, None


def _scaled(value: ir.Value) -> tuple[ir.Value, float]:
    """(x, s) for ``x * s`` with a constant scalar read by nothing else, else (value, 1.0)."""
    multiply = producer(value, "Mul")
    if multiply is not None and single_consumer(value) is not None:
        for x, factor in (multiply.inputs, multiply.inputs[::-1]):
            number = constant_scalar(factor)
            if number is not None:
                return x, number
    return value, 1.0


def _split_heads(value: ir.Value, perm: tuple[int, ...]) -> tuple[ir.Value | None, int | None]:
    """(x, heads) when ``value`` is ``Transpose(Reshape(x, (b, s, heads, size)), perm)`` of a
    3-D ``x`` whose last dim is ``heads * size``, both static."""
    transpose = producer(value, "Transpose")
    reshape = producer(transpose.inputs[0], "Reshape") if transpose is not None else None
    if reshape is None or tuple(transpose.attributes["perm"].as_ints()) != perm or single_consumer(value) is None:
        return None, None
    x, split = reshape.inputs[0], reshape.outputs[0]
    if x.shape is None or split.shape is None or len(x.shape) != 3 or len(split.shape) != 4:
        return None, None
    heads, size = split.shape[2], split.shape[3]
    if not isinstance(heads, int) or not isinstance(size, int) or x.shape[2] != heads * size:
        return None, None
    if x.shape[0] != split.shape[0] or x.shape[1] != split.shape[1]:
        return None, None
    return x, heads


def _merged_heads(value: ir.Value) -> ir.Value | None:
    """The result of ``Reshape(Transpose(value, (0, 2, 1, 3)), (b, s, heads * size))``."""
    transpose = single_consumer(value)
    if (
        transpose is None
        or transpose.op_type != "Transpose"
        or tuple(transpose.attributes["perm"].as_ints()) != (0, 2, 1, 3)
    ):
        return None
    reshape = single_consumer(transpose.outputs[0])
    if reshape is None or reshape.op_type != "Reshape":
        return None
    merged, split = reshape.outputs[0], transpose.outputs[0]
    if merged.shape is None or split.shape is None or len(merged.shape) != 3 or len(split.shape) != 4:
        return None
    if merged.shape[0] != split.shape[0] or merged.shape[1] != split.shape[1]:
        return None
    if not all(isinstance(d, int) for d in split.shape[2:]) or merged.shape[2] != split.shape[2] * split.shape[3]:
        return None
    return merged
