"""``torch.onnx.ops``: ONNX operators a model calls by name, written as those operators.

``torch.onnx.ops.rotary_embedding`` and ``attention`` (``onnx::RotaryEmbedding.opset23``,
``onnx::Attention.opset23``) become RotaryEmbedding and Attention from opset 23; below it they
decompose into their ATen reference (``torch.onnx.ops.aten_decompositions``,
dynexport/decompositions). ``torch.onnx.ops.symbolic`` and ``symbolic_multi_out`` stand for any
operator of any domain, which runs nothing in PyTorch (its outputs are zeros there): each becomes
that one node, its attributes decoded, its domain imported at the version given (1 if none), its
outputs typed and shaped as declared.

The operators exist once ``torch.onnx.ops`` is imported (as a model that calls them does): the
rules are keyed by their qualified names.
"""

from __future__ import annotations

import operator

from dynexport.registry import translates

# torch.onnx.ops' encoding of a symbolic op's attributes: a type code per key, and where its
# value lies in the list of that type.
_ATTRIBUTE_LISTS = {"i": "attr_ints", "f": "attr_floats", "s": "attr_strs", "is": "attr_ints", "fs": "attr_floats", "ss": "attr_strs"}


@translates("onnx::RotaryEmbedding.opset23", min_opset=23)
def rotary_embedding(ctx, x, cos_cache, sin_cache, position_ids=None, interleaved=False, num_heads=0, rotary_embedding_dim=0):
    return ctx.op.RotaryEmbedding(
        x, cos_cache, sin_cache, position_ids,
        interleaved=int(interleaved), num_heads=int(num_heads), rotary_embedding_dim=int(rotary_embedding_dim),
    )


@translates("onnx::Attention.opset23", min_opset=23)
def attention(
    ctx, Q, K, V, attn_mask=None, past_key=None, past_value=None, is_causal=False, kv_num_heads=0, q_num_heads=0,
    qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
):
    attributes = {
        "is_causal": int(is_causal), "kv_num_heads": int(kv_num_heads), "q_num_heads": int(q_num_heads),
        "qk_matmul_output_mode": int(qk_matmul_output_mode), "softcap": float(softcap),
    }
    if scale is not None:
        attributes["scale"] = float(scale)
    if softmax_precision is not None:
        attributes["softmax_precision"] = int(softmax_precision)
    # Only the outputs the model reads, up to the last: the scores (4th) cost a tensor per head.
    read = [user.args[1] for user in ctx.node.users if user.target is operator.getitem and user.users]
    count = 1 + max(read, default=0)
    results = ctx.op.Attention(Q, K, V, attn_mask, past_key, past_value, _outputs=count, **attributes)
    results = list(results) if count > 1 else [results]
    return tuple(results + [None] * (4 - count))


@translates("onnx_symbolic::_symbolic")
def symbolic(ctx, inputs, op_type, onnx_dtype, **encoded):
    return _node(ctx, inputs, op_type, 1, encoded)


@translates("onnx_symbolic::_symbolic_multi_out")
def symbolic_multi_out(ctx, inputs, op_type, onnx_dtypes, **encoded):
    return list(_node(ctx, inputs, op_type, len(onnx_dtypes), encoded))


def _node(ctx, inputs, op_type: str, count: int, encoded: dict):
    domain = encoded.get("domain", "")
    # An ONNX operator is written at the model's opset; another domain is imported at the version given.
    version = None if domain == "" else encoded.get("version") or 1
    node = getattr(ctx.op, op_type)(*inputs, _domain=domain, _version=version, _outputs=count, **_attributes(encoded))
    produced = node if count > 1 else [node]
    metadata = dict(zip(encoded.get("metadata_props_keys", ()), encoded.get("metadata_props_values", ())))
    if metadata:
        produced[0].producer().metadata_props.update(metadata)
    return node


def _attributes(encoded: dict) -> dict:
    attributes = {}
    for key, kind, (start, end) in zip(encoded["attr_keys"], encoded["attr_types"], encoded["attr_pos"]):
        values = list(encoded[_ATTRIBUTE_LISTS[kind]][start:end])
        attributes[key] = values if len(kind) == 2 else values[0]
    return attributes
