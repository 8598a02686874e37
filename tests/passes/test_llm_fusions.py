"""passes/fx/fuse_llm.py: tiny random-weight decoders exported at opset 23 get RMSNormalization,
RotaryEmbedding and Attention with the cache update inside (past_key/past_value in,
present_key/present_value out), and still compute what eager computes at other batch, sequence
and past sizes (past 0 included); near-miss patterns stay as they are."""

from __future__ import annotations

import collections

import onnx
import pytest
import torch

import dynexport
from dynexport.quantize import dequantized_model
from tests.equivalence import assert_exports_equivalent, op_histogram

transformers = pytest.importorskip("transformers")

from tests.models.families import DECODERS  # after the importorskip
from tests.test_generation import _assert_generates_as_eager, _empty_cache_call, _filled_cache_call

Dim = torch.export.Dim


def _export_decoder(model, **options) -> dynexport.ONNXProgram:
    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past", min=0)
    layers = model.config.num_hidden_layers
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},
        "position_ids": {0: batch, 1: seq},
        "cache": [[{0: batch, 2: past}] * layers] * 2,
    }
    return dynexport.export(model, (), kwargs=_empty_cache_call(model, 2, 4), dynamic_shapes=dynamic_shapes, **options)


def _nodes(program, op_type: str) -> list[onnx.NodeProto]:
    return [node for node in program.model_proto.graph.node if node.op_type == op_type]


def _attention_nodes(program) -> list[onnx.NodeProto]:
    return _nodes(program, "Attention")


def _layout_changes_around(program, op_types: set[str]) -> list[onnx.NodeProto]:
    """The Reshape and Transpose nodes that feed a node of ``op_types`` or read its first output."""
    nodes = program.model_proto.graph.node
    fused = [n for n in nodes if n.op_type in op_types]
    read = {name for n in fused for name in n.input[:3]}
    written = {n.output[0] for n in fused}
    layouts = [n for n in nodes if n.op_type in ("Reshape", "Transpose")]
    return [n for n in layouts if set(n.output) & read or set(n.input) & written]


def _attributes(node: onnx.NodeProto, *names: str) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name in names}


@pytest.mark.parametrize(
    "family", ["llama", "gemma", pytest.param("mistral", marks=pytest.mark.slow), pytest.param("qwen2", marks=pytest.mark.slow)]
)
def test_decoder_layers_become_whole_ops_at_opset_23(family):
    model = DECODERS[family](True).eval()
    program = _export_decoder(model, opset_version=23)
    onnx.checker.check_model(program.model_proto, full_check=True)
    layers = model.config.num_hidden_layers
    histogram = op_histogram(program)
    assert histogram["RMSNormalization"] == 2 * layers + 1
    assert histogram["RotaryEmbedding"] == 2 * layers
    attentions = _attention_nodes(program)
    assert len(attentions) == layers
    graph_inputs = {value.name for value in program.model_proto.graph.input}
    graph_outputs = {value.name for value in program.model_proto.graph.output}
    heads = {"q_num_heads": model.config.num_attention_heads, "kv_num_heads": model.config.num_key_value_heads}
    for layer, node in enumerate(attentions):
        # Q, K, V, mask, past_key, past_value -> Y, present_key, present_value: no Concat, no repeat.
        assert list(node.input[4:]) == [f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"]
        assert list(node.output[1:]) == [f"present.{layer}.key", f"present.{layer}.value"]
        # (batch, sequence, heads * head size) queries, keys, values and output: no head split around.
        assert _attributes(node, *heads) == heads
    rotary_heads = sorted(_attributes(n, "num_heads")["num_heads"] for n in _nodes(program, "RotaryEmbedding"))
    assert rotary_heads == sorted([heads["q_num_heads"], heads["kv_num_heads"]] * layers)
    assert not _layout_changes_around(program, {"Attention", "RotaryEmbedding"})
    caches = graph_inputs - {"input_ids", "attention_mask", "position_ids"}
    assert not [n for n in program.model_proto.graph.node if n.op_type not in ("Attention", "Shape") and set(n.input) & caches]
    assert graph_outputs >= {f"present.{i}.{t}" for i in range(layers) for t in ("key", "value")}
    report = program.verify(model=model, resized=[
        ((), _empty_cache_call(model, 1, 3)),      # past 0, another batch and sequence
        ((), _filled_cache_call(model, 3, 5, 2)),  # past 5
        ((), _filled_cache_call(model, 2, 1, 1)),  # one decode step after one token
    ])
    assert report.passed, report


def test_a_users_exported_program_is_left_as_it_was():
    inputs = _attention_inputs()
    captured = torch.export.export(CachedAttention(), inputs)
    program = dynexport.export(captured, inputs, opset_version=23)
    assert len(_attention_nodes(program)[0].input) == 6

    def targets(exported):
        return collections.Counter(str(n.target) for n in exported.graph.nodes if n.op == "call_function")

    assert targets(captured)["aten.scaled_dot_product_attention.default"] == 1
    # The program it was translated from holds the fused op, whose eager kernel runs.
    assert targets(program.exported_program)["dynexport.attention.default"] == 1
    assert program.verify(*inputs).passed


def test_a_static_cache_attends_through_one_attention_without_the_repeat():
    from tests.test_model_caches import _static_cache_call

    model = DECODERS["llama"](True).eval()
    batch = Dim("batch")
    layers = [{0: batch}] * model.config.num_hidden_layers
    program = dynexport.export(
        model, (), kwargs=_static_cache_call(model, 2, 3, 2), opset_version=23,
        dynamic_shapes={"input_ids": {0: batch, 1: Dim("seq", max=8)}, "cache": [layers, layers, [None, None]]},
    )
    # The buffer's index_copy_ update stays outside; the repeat to 4 heads goes.
    assert [len(node.input) for node in _attention_nodes(program)] == [4, 4]
    for sizes in [(1, 5, 1), (3, 0, 4)]:
        with torch.no_grad():
            expected = model(**_static_cache_call(model, *sizes))
        actual = program(**_static_cache_call(model, *sizes))
        torch.testing.assert_close(actual.logits, expected.logits, atol=1e-4, rtol=1e-4)


def test_the_onnxruntime_target_keeps_the_standard_ops():
    # com.microsoft's GroupQueryAttention, SkipSimplifiedLayerNormalization and RotaryEmbedding
    # measured slower or no faster on onnxruntime's CPU provider (docs/llm.md): none is used.
    model = DECODERS["llama"](True).eval()
    program = _export_decoder(model, opset_version=23, target="onnxruntime")
    histogram = op_histogram(program)
    assert histogram["Attention"] == 2 and histogram["RMSNormalization"] == 5 and histogram["RotaryEmbedding"] == 4
    assert not [n for n in program.model_proto.graph.node if n.domain == "com.microsoft"]
    assert program.verify(model=model, resized=[((), _filled_cache_call(model, 1, 6, 1))]).passed


def test_below_opset_23_nothing_is_fused():
    model = DECODERS["llama"](True).eval()
    histogram = op_histogram(_export_decoder(model, opset_version=22))
    assert not {"RMSNormalization", "RotaryEmbedding", "Attention"} & set(histogram)


def test_greedy_generation_from_the_fused_graph_matches_generate():
    model = DECODERS["llama"](True).eval()
    program = _export_decoder(model, opset_version=23)
    assert len(_attention_nodes(program)) == model.config.num_hidden_layers
    # 17 nodes a layer: 2 RMSNormalization, 2 RotaryEmbedding, 1 Attention, 7 MatMul, 2 residual
    # Adds, SiLU (Sigmoid, Mul) and its product with up (Mul); 24 for the mask, the rotary
    # tables, the embedding, the last norm and the LM head (30 while the cache's past lengths,
    # declared with one Dim, were captured as two symbols).
    layers = model.config.num_hidden_layers
    assert len(program.model_proto.graph.node) == 17 * layers + 24
    _assert_generates_as_eager(model, program)
    # Quantized, q|k|v and gate|up are packed (passes/onnx/pack_matmuls.py): 4 MatMulNBits and 2
    # Split a layer, 16 nodes.
    quantized = program.quantize_weights(4, block_size=16)
    assert op_histogram(quantized)["Split"] == 2 * layers and op_histogram(quantized)["MatMulNBits"] == 4 * layers + 1
    assert len(quantized.model_proto.graph.node) == 16 * layers + 24
    # The same graph with float MatMuls by the weights the stored integers stand for.
    reference = quantized.with_model(dequantized_model(quantized.model))
    for call in (_empty_cache_call(model, 1, 3), _filled_cache_call(model, 3, 5, 2)):
        actual, expected = quantized(**call), reference(**call)
        torch.testing.assert_close(actual.logits, expected.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(actual.past_key_values.layers[-1].keys, expected.past_key_values.layers[-1].keys)


# -- near misses: each exports unfused, and right ---------------------------------------------


class RMSNorm(torch.nn.Module):
    def __init__(self, axis: int = -1, returns_normalized: bool = False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.axis, self.returns_normalized = axis, returns_normalized

    def forward(self, x):
        x32 = x.float()
        normalized = x32 * torch.rsqrt(x32.pow(2).mean(self.axis, keepdim=True) + 1e-6)
        out = self.weight * normalized.to(x.dtype)
        return (out, normalized) if self.returns_normalized else out


def _exported(module, *inputs, dynamic=True):
    shapes = tuple({0: Dim("batch")} for _ in inputs) if dynamic else None
    return assert_exports_equivalent(
        module, inputs, opset_version=23, dynamic_shapes=shapes,
        resized=[tuple(torch.cat([t, t]) for t in inputs)] if dynamic else (),
    )


def test_rms_norm_is_fused_on_its_own():
    assert op_histogram(_exported(RMSNorm(), torch.randn(2, 3, 8)))["RMSNormalization"] == 1


@pytest.mark.parametrize(
    "module", [RMSNorm(axis=1), RMSNorm(returns_normalized=True)], ids=["mean over another axis", "intermediate read"]
)
def test_rms_norm_near_miss_is_not_fused_by_fx(module):
    # (The ONNX-level RMS-norm fusion may still recognise what is left; the FX one leaves it.)
    program = _exported(module, torch.randn(2, 8, 8))
    assert not any(str(n.target).startswith("dynexport.") for n in _fused_fx_graph(program).nodes)


def _fused_fx_graph(program) -> torch.fx.Graph:
    from dynexport.passes.fx.fuse_llm import fuse_llm_patterns

    return fuse_llm_patterns(program.exported_program, opset=23).graph


def _rotate_half(x, swapped: bool = False):
    first, second = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-first, second) if swapped else (-second, first), dim=-1)


class Rotary(torch.nn.Module):
    def __init__(self, swapped: bool = False, table_from_halves: bool = True):
        super().__init__()
        self.swapped, self.table_from_halves = swapped, table_from_halves

    def forward(self, x, positions):
        frequencies = positions[..., None].float() * torch.arange(1, 5).float()
        angles = torch.cat((frequencies, frequencies), -1) if self.table_from_halves else torch.cat((frequencies, 2 * frequencies), -1)
        cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)
        return x * cos + _rotate_half(x, self.swapped) * sin


def _rotary_inputs(batch: int = 2):
    return torch.randn(batch, 3, 5, 8), torch.arange(5).expand(batch, 5).contiguous()


def test_rotary_embedding_is_fused_on_its_own():
    histogram = op_histogram(_exported(Rotary(), *_rotary_inputs()))
    assert histogram["RotaryEmbedding"] == 1
    # The op reads the tables' first halves: cos and sin of the repeated half, no cat, no slice.
    assert "Concat" not in histogram and "Slice" not in histogram and histogram["Cos"] == histogram["Sin"] == 1


def test_rotary_embedding_with_tables_shared_by_the_batch():
    # Positions counted from the cache (no position_ids): one table row for every batch row.
    x, positions = _rotary_inputs()
    program = assert_exports_equivalent(
        Rotary(), (x, positions[:1]), opset_version=23, dynamic_shapes=({0: Dim("batch")}, None),
        resized=[(torch.randn(3, 3, 5, 8), positions[:1]), (torch.randn(1, 3, 5, 8), positions[:1])],
    )
    assert op_histogram(program)["RotaryEmbedding"] == 1


@pytest.mark.parametrize(
    "module", [Rotary(swapped=True), Rotary(table_from_halves=False)], ids=["rotate_half swapped", "halves differ"]
)
def test_rotary_near_miss_is_not_fused(module):
    assert "RotaryEmbedding" not in op_histogram(_exported(module, *_rotary_inputs()))


class CachedAttention(torch.nn.Module):
    """Attention over ``cat([past, new])`` keys and values, their heads repeated twice."""

    def __init__(self, value_cache: bool = True, cache_dim: int = -2, repeat_returned: bool = False, gqa: bool = False):
        super().__init__()
        self.value_cache, self.cache_dim, self.repeat_returned = value_cache, cache_dim, repeat_returned
        self.gqa = gqa  # SDPA repeats the heads itself (enable_gqa) instead

    def forward(self, q, k, v, past_k, past_v):
        keys = torch.cat([past_k, k], self.cache_dim)
        values = torch.cat([past_v, v], self.cache_dim)
        if not self.value_cache:
            values = values * 1.5
        if self.gqa:
            return torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=True), keys
        repeated, values = (
            t[:, :, None].expand(-1, -1, 2, -1, -1).reshape(t.shape[0], 2 * t.shape[1], t.shape[2], t.shape[3])
            for t in (keys, values)
        )
        out = torch.nn.functional.scaled_dot_product_attention(q, repeated, values)
        return (out, keys, repeated) if self.repeat_returned else (out, keys)


def _attention_inputs(batch: int = 2, past: int = 3):
    return (torch.randn(batch, 4, 2, 8), torch.randn(batch, 2, 2, 8), torch.randn(batch, 2, 2, 8),
            torch.randn(batch, 2, past, 8), torch.randn(batch, 2, past, 8))


@pytest.mark.parametrize("gqa", [False, True], ids=["repeat_kv", "enable_gqa"])
def test_cached_grouped_attention_is_one_attention_with_past(gqa):
    program = _exported(CachedAttention(gqa=gqa), *_attention_inputs())
    (node,) = _attention_nodes(program)
    assert len(node.input) == 6 and op_histogram(program)["Concat"] == 0


@pytest.mark.parametrize(
    "module",
    [CachedAttention(value_cache=False), CachedAttention(cache_dim=1), CachedAttention(repeat_returned=True)],
    ids=["values not cached", "cache along heads", "repeat read elsewhere"],
)
def test_attention_near_miss_keeps_its_concat(module):
    inputs = _attention_inputs(past=2) if module.cache_dim == 1 else _attention_inputs()
    if module.cache_dim == 1:
        inputs = (torch.randn(2, 8, 2, 8), *inputs[1:])  # 2 + 2 heads, repeated to 8
    program = _exported(module, *inputs, dynamic=module.cache_dim != 1)
    assert all(len(node.input) <= 4 for node in _attention_nodes(program))
    assert op_histogram(program)["Concat"] >= 1


class ProjectedAttention(torch.nn.Module):
    """Attention of projections split into heads (4 query, 2 key/value heads of 8) over a cache,
    merged back after it, as transformers' attention layers do; ``variant`` makes a near miss."""

    def __init__(self, variant: str = "standard"):
        super().__init__()
        self.variant = variant

    def forward(self, xq, xk, xv, past_k, past_v):
        b, s = xq.shape[:2]
        if self.variant == "heads interleaved":  # head h is every 4th feature from h, not the h-th slice of 8
            q = xq.view(b, s, 8, 4).permute(0, 3, 1, 2)
        else:
            q = xq.view(b, s, 4, 8).transpose(1, 2)
        k, v = (x.view(b, s, 2, 8).transpose(1, 2) for x in (xk, xv))
        keys, values = torch.cat([past_k, k], -2), torch.cat([past_v, v], -2)
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        merged = out.transpose(1, 2).reshape(b, s, 32)
        read_elsewhere = {"split read elsewhere": (q,), "output read elsewhere": (out,)}.get(self.variant, ())
        return (merged, keys, values, *read_elsewhere)


def _projected_inputs(batch: int = 2, seq: int = 3, past: int = 4):
    return (torch.randn(batch, seq, 32), torch.randn(batch, seq, 16), torch.randn(batch, seq, 16),
            torch.randn(batch, 2, past, 8), torch.randn(batch, 2, past, 8))


def _exported_projected_attention(variant: str) -> dynexport.ONNXProgram:
    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past", min=0)
    new, cached = {0: batch, 1: seq}, {0: batch, 2: past}
    return assert_exports_equivalent(
        ProjectedAttention(variant), _projected_inputs(), opset_version=23,
        dynamic_shapes=(new, new, new, cached, cached),
        resized=[_projected_inputs(3, 1, 6), _projected_inputs(1, 5, 0), _projected_inputs(2, 1, 1)],
    )


def test_attention_of_split_heads_takes_3d_inputs():
    program = _exported_projected_attention("standard")
    (node,) = _attention_nodes(program)
    assert _attributes(node, "q_num_heads", "kv_num_heads") == {"q_num_heads": 4, "kv_num_heads": 2}
    assert len(node.input) == 6
    assert not _layout_changes_around(program, {"Attention"})


@pytest.mark.parametrize("variant", ["heads interleaved", "split read elsewhere", "output read elsewhere"])
def test_attention_near_miss_keeps_its_4d_heads(variant):
    program = _exported_projected_attention(variant)
    (node,) = _attention_nodes(program)
    assert len(node.input) == 6 and not _attributes(node, "q_num_heads", "kv_num_heads")
    assert _layout_changes_around(program, {"Attention"})
