"""torch.onnx.ops (a model calling ONNX operators by name) against onnxruntime: RotaryEmbedding and
Attention as those ops from opset 23 and as their ATen reference below it; symbolic ops as the
node they name, in ONNX's domain or onnxruntime's."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
import torch
import torch.nn.functional as F
import torch.onnx.ops

import dynexport
from tests.equivalence import assert_close, assert_exports_equivalent, op_histogram

Dim = torch.export.Dim
BATCH, SEQ, PAST = Dim("batch"), Dim("seq"), Dim("past")


class Rotary(torch.nn.Module):
    def __init__(self, **attributes):
        super().__init__()
        self.attributes = attributes

    def forward(self, x, cos, sin, position_ids):
        return torch.onnx.ops.rotary_embedding(x, cos, sin, position_ids, **self.attributes)


def _rotary_inputs(batch, seq, heads=3, head_size=8, rotated=8, positions=32):
    generator = torch.Generator().manual_seed(batch * 10 + seq)
    return (
        torch.randn(batch, heads, seq, head_size, generator=generator),
        torch.randn(positions, rotated // 2, generator=generator),
        torch.randn(positions, rotated // 2, generator=generator),
        torch.randint(0, positions, (batch, seq), generator=generator),
    )


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize(("interleaved", "rotated"), [(False, 8), (True, 8), (False, 4)])
def test_rotary_embedding_follows_batch_and_sequence(opset, interleaved, rotated):
    attributes = {"interleaved": interleaved, "rotary_embedding_dim": 0 if rotated == 8 else rotated}
    program = assert_exports_equivalent(
        Rotary(**attributes), _rotary_inputs(2, 5, rotated=rotated),
        dynamic_shapes=({0: BATCH, 2: SEQ}, None, None, {0: BATCH, 1: SEQ}),
        resized=[_rotary_inputs(3, 9, rotated=rotated), _rotary_inputs(1, 1, rotated=rotated)],
        opset_version=opset,
    )
    assert ("RotaryEmbedding" in op_histogram(program)) == (opset >= 23)


def test_rotary_embedding_of_three_dimensional_input_with_heads_along_the_last_axis():
    def rotate(x, cos, sin, position_ids):
        return torch.onnx.ops.rotary_embedding(x, cos, sin, position_ids, num_heads=3)

    def inputs(batch, seq):
        x, cos, sin, positions = _rotary_inputs(batch, seq)
        return x.transpose(1, 2).reshape(batch, seq, 24), cos, sin, positions

    assert_exports_equivalent(
        rotate, inputs(2, 5), dynamic_shapes=({0: BATCH, 1: SEQ}, None, None, {0: BATCH, 1: SEQ}),
        resized=[inputs(3, 7)], opset_version=23,
    )


class Attention(torch.nn.Module):
    def __init__(self, outputs=1, **attributes):
        super().__init__()
        self.outputs, self.attributes = outputs, attributes

    def forward(self, q, k, v, mask=None, past_key=None, past_value=None):
        results = torch.onnx.ops.attention(q, k, v, mask, past_key, past_value, **self.attributes)
        return results[: self.outputs] if self.outputs > 1 else results[0]


def _attention_inputs(batch, seq, keys, *, heads=4, kv_heads=4, mask=None, past=None):
    generator = torch.Generator().manual_seed(batch * 100 + seq * 10 + keys)
    q = torch.randn(batch, heads, seq, 8, generator=generator)
    k, v = (torch.randn(batch, kv_heads, keys, 8, generator=generator) for _ in "kv")
    inputs = [q, k, v]
    total = keys + (past or 0)
    if mask == "bool":
        inputs.append(torch.rand(batch, 1, seq, total, generator=generator) > 0.3)
    elif mask == "float":
        inputs.append(torch.randn(batch, 1, seq, total, generator=generator))
    elif past is not None:
        inputs.append(None)
    if past is not None:
        inputs += [torch.randn(batch, kv_heads, past, 8, generator=generator) for _ in "kv"]
    return tuple(inputs)


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize(
    ("mask", "attributes"),
    [(None, {}), ("bool", {}), ("float", {"scale": 0.5}), (None, {"is_causal": True}), (None, {"softcap": 2.0})],
)
def test_attention_follows_batch_and_lengths(opset, mask, attributes):
    dynamic = [{0: BATCH, 2: SEQ}, {0: BATCH, 2: SEQ}, {0: BATCH, 2: SEQ}]
    if mask is not None:
        dynamic.append({0: BATCH, 2: SEQ, 3: SEQ})
    program = assert_exports_equivalent(
        Attention(**attributes), _attention_inputs(2, 5, 5, mask=mask), dynamic_shapes=tuple(dynamic),
        resized=[_attention_inputs(3, 7, 7, mask=mask), _attention_inputs(1, 2, 2, mask=mask)],
        opset_version=opset, atol=1e-5,
    )
    assert ("Attention" in op_histogram(program)) == (opset >= 23)


@pytest.mark.parametrize("opset", [18, 23])
def test_attention_with_grouped_heads_and_a_past_returns_the_present(opset):
    def inputs(batch, seq, past):
        return _attention_inputs(batch, seq, seq, heads=6, kv_heads=2, past=past)

    program = assert_exports_equivalent(
        Attention(outputs=3, q_num_heads=6, kv_num_heads=2), inputs(2, 3, 4),
        dynamic_shapes=({0: BATCH, 2: SEQ}, {0: BATCH, 2: SEQ}, {0: BATCH, 2: SEQ}, None, {0: BATCH, 2: PAST}, {0: BATCH, 2: PAST}),
        resized=[inputs(1, 1, 9), inputs(3, 5, 2)], opset_version=opset, atol=1e-5,
    )
    if opset >= 23:
        (node,) = [n for n in program.model.graph if n.op_type == "Attention"]
        assert len(node.outputs) == 3  # the scores, unread, are not asked for


def test_symbolic_op_of_onnx_domain_becomes_that_node():
    def gelu(x):
        return torch.onnx.ops.symbolic(
            "Gelu", (x,), {"approximate": "tanh"}, dtype=x.dtype, shape=x.shape, version=20,
            metadata_props={"origin": "hand-written"},
        )

    x = torch.randn(2, 5)
    program = dynexport.export(gelu, (x,), dynamic_shapes=({0: BATCH, 1: SEQ},), opset_version=20)
    (node,) = list(program.model.graph)
    assert (node.op_type, node.attributes["approximate"].value, node.metadata_props["origin"]) == ("Gelu", "tanh", "hand-written")
    onnx.checker.check_model(program.model_proto, full_check=True)
    for sizes in [(2, 5), (4, 1)]:
        x = torch.randn(*sizes)
        assert_close(program(x), F.gelu(x, approximate="tanh"), atol=1e-6)  # eager gives zeros: a placeholder


def test_symbolic_ops_of_another_domain_import_it_at_the_version_given():
    def split_and_fast_gelu(x):
        bias = torch.zeros(x.shape[-1])
        gelu = torch.onnx.ops.symbolic("com.microsoft::FastGelu", (x, bias), {}, dtype=x.dtype, shape=x.shape, version=1)
        halves = torch.onnx.ops.symbolic_multi_out(
            "Split", (gelu,), {"axis": 1, "num_outputs": 2}, dtypes=(x.dtype, x.dtype),
            shapes=((x.shape[0], x.shape[1] // 2), (x.shape[0], x.shape[1] // 2)), version=18,
        )
        return halves[1] - halves[0]

    x = torch.randn(3, 8)
    program = dynexport.export(split_and_fast_gelu, (x,), dynamic_shapes=({0: BATCH},), opset_version=18)
    assert {o.domain: o.version for o in program.model_proto.opset_import} == {"": 18, "com.microsoft": 1}
    assert [n.op_type for n in program.model.graph if n.op_type in ("FastGelu", "Split")] == ["FastGelu", "Split"]
    for batch in (3, 5):
        x = torch.randn(batch, 8)
        expected = F.gelu(x, approximate="tanh")
        assert_close(program(x), expected[:, 4:] - expected[:, :4], atol=1e-5)


def test_symbolic_op_with_a_sequence_of_each_attribute_kind():
    def custom(x):
        attributes = {"ints": [1, 2], "floats": [0.5, 1.5], "names": ["a", "b"], "count": 3, "rate": 0.25, "mode": "m"}
        return torch.onnx.ops.symbolic("my.domain::Op", (x, None, x), attributes, dtype=torch.int64, shape=(x.shape[0],), version=3)

    program = dynexport.export(custom, (torch.randn(4, 2),))
    (node,) = [n for n in program.model.graph if n.op_type == "Op"]
    assert node.domain == "my.domain" and len(node.inputs) == 3 and node.inputs[1] is None
    assert {o.domain: o.version for o in program.model_proto.opset_import}["my.domain"] == 3
    values = {name: attribute.value for name, attribute in node.attributes.items()}
    values = {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}
    assert values == {"ints": [1, 2], "floats": [0.5, 1.5], "names": ["a", "b"], "count": 3, "rate": 0.25, "mode": "m"}
    output = program.model.graph.outputs[0]
    assert output.dtype == ir.DataType.INT64 and list(output.shape) == [4]
