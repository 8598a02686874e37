"""More transformers architectures, exported as a user following torch.onnx's documentation
calls dynexport: the model's own keyword arguments, plain unbounded ``Dim``s (or
``input_names`` with ``dynamic_axes``), a decoder's ``DynamicCache`` passed as the model takes it.
Tiny random configs that keep each architecture's other defaults; every export is checked in
onnxruntime at the export size and at three other sizes (docs/models.md lists them with their
limits). The families tests/models/test_transformers.py covers are not repeated here."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import dynexport
from dynexport.errors import DimSpecializedError
from tests.equivalence import assert_close, assert_exports_equivalent

transformers = pytest.importorskip("transformers")

from tests.models.families import VOCAB, text_inputs, tiny  # after the importorskip

Dim = torch.export.Dim

TEXT_SIZES = [(2, 7), (3, 11), (1, 16), (4, 4)]  # (batch, sequence): the first is the export size
CACHE_SIZES = [(2, 5, 3), (3, 9, 1), (1, 2, 6), (4, 12, 2)]  # (batch, past, new tokens)
ATOL = 1e-4

slow = pytest.mark.slow


def _text_dims(*names: str) -> dict[str, dict[int, Any]]:
    batch, seq = Dim("batch"), Dim("seq")
    return {name: {0: batch, 1: seq} for name in names}


def _check(model, calls: list[dict[str, Any]], **export_options: Any) -> dynexport.ONNXProgram:
    return assert_exports_equivalent(model, (), calls[0], resized=[((), c) for c in calls[1:]], atol=ATOL, **export_options)


# Configs shared by the text models.
_TEXT = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


# -- decoder language models ------------------------------------------------------------------

DECODERS: dict[str, Callable[[bool], Any]] = {
    "qwen3": lambda cache: transformers.Qwen3ForCausalLM(tiny(
        transformers.Qwen3Config, **_TEXT, num_key_value_heads=2, head_dim=8, use_cache=cache,
    )),
    "phi3": lambda cache: transformers.Phi3ForCausalLM(tiny(
        transformers.Phi3Config, **_TEXT, num_key_value_heads=2, pad_token_id=0, use_cache=cache,
    )),
    "falcon": lambda cache: transformers.FalconForCausalLM(tiny(
        transformers.FalconConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        use_cache=cache,
    )),
    "bloom": lambda cache: transformers.BloomForCausalLM(tiny(  # ALiBi
        transformers.BloomConfig, vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, use_cache=cache,
    )),
    "gptj": lambda cache: transformers.GPTJForCausalLM(tiny(
        transformers.GPTJConfig, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
        use_cache=cache,
    )),
    "mpt": lambda cache: transformers.MptForCausalLM(tiny(  # ALiBi from a table sliced to the sequence
        transformers.MptConfig, vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=64, use_cache=cache,
    )),
    "stablelm": lambda cache: transformers.StableLmForCausalLM(tiny(
        transformers.StableLmConfig, **_TEXT, num_key_value_heads=2, use_cache=cache,
    )),
    "olmo": lambda cache: transformers.OlmoForCausalLM(tiny(
        transformers.OlmoConfig, **_TEXT, num_key_value_heads=2, pad_token_id=0, use_cache=cache,
    )),
    "olmo2": lambda cache: transformers.Olmo2ForCausalLM(tiny(
        transformers.Olmo2Config, **_TEXT, num_key_value_heads=2, pad_token_id=0, use_cache=cache,
    )),
    "smollm3": lambda cache: transformers.SmolLM3ForCausalLM(tiny(  # no RoPE in every fourth layer
        transformers.SmolLM3Config, **_TEXT, num_key_value_heads=2, pad_token_id=0, use_cache=cache,
    )),
    "starcoder2": lambda cache: transformers.Starcoder2ForCausalLM(tiny(
        transformers.Starcoder2Config, **_TEXT, num_key_value_heads=2, use_cache=cache,
    )),
    "gpt_bigcode": lambda cache: transformers.GPTBigCodeForCausalLM(tiny(  # multi-query attention
        transformers.GPTBigCodeConfig, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        use_cache=cache,
    )),
    "granite": lambda cache: transformers.GraniteForCausalLM(tiny(
        transformers.GraniteConfig, **_TEXT, num_key_value_heads=2, use_cache=cache,
    )),
    "cohere": lambda cache: transformers.CohereForCausalLM(tiny(
        transformers.CohereConfig, **_TEXT, num_key_value_heads=2, pad_token_id=0, use_cache=cache,
    )),
    # Mixtures of experts, with the experts' default implementation (grouped_mm): 4 experts, 2
    # per token.
    "mixtral": lambda cache: transformers.MixtralForCausalLM(tiny(
        transformers.MixtralConfig, **_TEXT, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        use_cache=cache,
    )),
    "qwen2_moe": lambda cache: transformers.Qwen2MoeForCausalLM(tiny(  # and a shared expert
        transformers.Qwen2MoeConfig, **_TEXT, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=64, use_cache=cache,
    )),
    "qwen3_moe": lambda cache: transformers.Qwen3MoeForCausalLM(tiny(
        transformers.Qwen3MoeConfig, **_TEXT, num_key_value_heads=2, head_dim=8, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, use_cache=cache,
    )),
    "olmoe": lambda cache: transformers.OlmoeForCausalLM(tiny(
        transformers.OlmoeConfig, **_TEXT, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        pad_token_id=0, use_cache=cache,
    )),
    "phimoe": lambda cache: transformers.PhimoeForCausalLM(tiny(
        transformers.PhimoeConfig, **_TEXT, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        use_cache=cache,
    )),
    "granitemoe": lambda cache: transformers.GraniteMoeForCausalLM(tiny(
        transformers.GraniteMoeConfig, **_TEXT, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        use_cache=cache,
    )),
    # Multi-head latent attention, experts in groups with a shared one, a dense first layer.
    "deepseek_v3": lambda cache: transformers.DeepseekV3ForCausalLM(tiny(
        transformers.DeepseekV3Config, **_TEXT, num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, use_cache=cache,
    )),
    "glm4": lambda cache: transformers.Glm4ForCausalLM(tiny(
        transformers.Glm4Config, **_TEXT, num_key_value_heads=2, head_dim=8, pad_token_id=0, use_cache=cache,
    )),
    "ernie4_5": lambda cache: transformers.Ernie4_5ForCausalLM(tiny(
        transformers.Ernie4_5Config, **_TEXT, num_key_value_heads=2, head_dim=8, use_cache=cache,
    )),
    "nemotron": lambda cache: transformers.NemotronForCausalLM(tiny(
        transformers.NemotronConfig, **_TEXT, num_key_value_heads=2, head_dim=8, use_cache=cache,
    )),
}
# Decoders whose DynamicCache holds layers other than full attention, which are refused as
# export inputs (test below): sliding windows of 4 tokens, shorter than the longer test
# sequences (Gemma 2, GPT-OSS: every other layer; Gemma 3 text: five in six; Exaone 4, OLMo 3:
# three in four), Llama 4's chunked attention (chunks of 4), LFM2's convolution layers.
WINDOWED_DECODERS: dict[str, Callable[[bool], Any]] = {
    "gemma2": lambda cache: transformers.Gemma2ForCausalLM(tiny(
        transformers.Gemma2Config, **_TEXT, num_key_value_heads=2, head_dim=8, sliding_window=4, use_cache=cache,
    )),
    "gemma3": lambda cache: transformers.Gemma3ForCausalLM(tiny(
        transformers.Gemma3TextConfig, **_TEXT, num_key_value_heads=2, head_dim=8, sliding_window=4,
        use_cache=cache,
    )),
    "gpt_oss": lambda cache: transformers.GptOssForCausalLM(tiny(  # and 4 experts, 2 per token
        transformers.GptOssConfig, **_TEXT, num_key_value_heads=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, use_cache=cache,
    )),
    "exaone4": lambda cache: transformers.Exaone4ForCausalLM(tiny(
        transformers.Exaone4Config, **_TEXT, num_key_value_heads=2, head_dim=8, sliding_window=4, use_cache=cache,
    )),
    "olmo3": lambda cache: transformers.Olmo3ForCausalLM(tiny(
        transformers.Olmo3Config, **_TEXT, num_key_value_heads=2, sliding_window=4, pad_token_id=0, use_cache=cache,
    )),
    "llama4": lambda cache: transformers.Llama4ForCausalLM(tiny(  # and 4 experts, 1 per token
        transformers.Llama4TextConfig, **_TEXT, intermediate_size_mlp=64, num_key_value_heads=2, head_dim=8,
        num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=4, use_cache=cache,
    )),
    "lfm2": lambda cache: transformers.Lfm2ForCausalLM(tiny(
        transformers.Lfm2Config, **_TEXT, num_key_value_heads=2, layer_types=["conv", "full_attention"],
        use_cache=cache,
    )),
}


def _params(families, in_default_run: set[str]) -> list:
    return [pytest.param(f, marks=() if f in in_default_run else slow) for f in families]


# In the default run: one family per mechanism not tested elsewhere (ALiBi, sliding windows,
# experts; query/key norms with a cache below); the others are slow.
@pytest.mark.parametrize(
    "family", _params([*DECODERS, *WINDOWED_DECODERS], {"bloom", "gemma2", "mixtral"})
)
def test_decoder_lm(family):
    model = {**DECODERS, **WINDOWED_DECODERS}[family](False).eval()
    calls = [text_inputs(b, s) for b, s in TEXT_SIZES]
    _check(model, calls, dynamic_shapes=_text_dims("input_ids", "attention_mask"))


def _cache_call(model, batch: int, past: int, seq: int) -> dict[str, Any]:
    """New tokens, a mask over past and new positions (the last row left-padded), and the
    DynamicCache the model filled with ``past`` tokens: the call of a decode step."""
    generator = torch.Generator().manual_seed(batch * 100 + past * 10 + seq)
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1, VOCAB, (batch, past), generator=generator), use_cache=True).past_key_values
    attention_mask = torch.ones(batch, past + seq, dtype=torch.int64)
    attention_mask[-1, : past // 2] = 0
    return {"input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator), "attention_mask": attention_mask, "cache": cache}


@pytest.mark.parametrize("family", _params(DECODERS, {"qwen3", "bloom"}))
def test_decoder_lm_with_dynamic_cache(family):
    model = DECODERS[family](True).eval()
    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past")
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim("total")},  # past + seq: refined, with a warning
        "cache": [[{0: batch, 2: past}] * model.config.num_hidden_layers] * 2,  # keys, values
    }
    with pytest.warns(UserWarning, match="dynamic_shapes refined: total"):
        program = dynexport.export(model, (), kwargs=_cache_call(model, *CACHE_SIZES[0]), dynamic_shapes=dynamic_shapes)
    assert str(program.model.graph.outputs[1].shape[2]) == "past + seq"
    for sizes in CACHE_SIZES:
        # The model appends to the cache it is given: each run gets its own.
        call = _cache_call(model, *sizes)
        with torch.no_grad():
            expected = model(**copy.deepcopy(call))
        actual = program(**call)
        assert isinstance(actual.past_key_values, transformers.DynamicCache)
        assert_close(actual.logits, expected.logits, atol=ATOL, where=f"logits at {sizes}")
        for got, want in zip(actual.past_key_values.layers, expected.past_key_values.layers):
            assert_close((got.keys, got.values), (want.keys, want.values), atol=ATOL, where=f"cache at {sizes}")


# Llama 4's chunked attention keeps its cache as a sliding window of the chunk size.
SLIDING_WINDOW_DECODERS = ("gemma2", "gemma3", "gpt_oss", "exaone4", "olmo3", "llama4")


def _with_a_full_attention_layer(family: str):
    """The family's tiny model with layer 1 a full-attention layer (in 2 layers, Gemma 3 text,
    Exaone 4 and OLMo 3 have only sliding-window layers, Llama 4 only chunked ones)."""
    model = WINDOWED_DECODERS[family](True)
    if "full_attention" not in model.config.layer_types:
        model.config.layer_types = [model.config.layer_types[0], "full_attention"]
        torch.manual_seed(0)
        model = type(model)(model.config)
    return model.eval()


def _empty_cache_call(model, batch: int, seq: int) -> dict[str, Any]:
    """A prompt: new tokens, their mask, and a cache of the model's layer kinds holding no token."""
    config = model.config
    heads, size = config.num_key_value_heads, getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
    empty = [(torch.zeros(batch, heads, 0, size), torch.zeros(batch, heads, 0, size))] * config.num_hidden_layers
    return {
        "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seq)),
        "attention_mask": torch.ones(batch, seq, dtype=torch.int64),
        "cache": transformers.DynamicCache(empty, config=config),
    }


def sliding_window_cache_dims(model) -> dict[str, Any]:
    """A sliding-window layer holds at most window - 1 past tokens: a dim of its own."""
    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past", min=0)
    window = getattr(model.config, "sliding_window", None) or model.config.attention_chunk_size
    held = Dim("past_window", min=0, max=window - 1)
    layers = [{0: batch, 2: past if kind == "full_attention" else held} for kind in model.config.layer_types]
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: Dim.DYNAMIC}, "cache": [layers] * 2}


def _assert_runs_as_eager(program, model, call: dict[str, Any], where: str, *, counts: bool = True) -> None:
    """The program's logits and returned cache (its layer kinds, their counts of tokens seen
    unless not ``counts``, keys and values) against the model's on ``call``."""
    with torch.no_grad():
        expected = model(**copy.deepcopy(call))  # the model appends to the cache it is given
    actual = program(**call)
    assert_close(actual.logits, expected.logits, atol=ATOL, where=f"logits {where}")
    for got, want in zip(actual.past_key_values.layers, expected.past_key_values.layers, strict=True):
        assert type(got) is type(want)
        if counts:
            assert got.get_seq_length() == want.get_seq_length()
        assert_close((got.keys, got.values), (want.keys, want.values), atol=ATOL, where=f"cache {where}")


@pytest.mark.parametrize("family", _params(SLIDING_WINDOW_DECODERS, {"gemma2"}))
def test_decoder_lm_with_a_sliding_window_cache(family):
    # Windows of 4 tokens: calls before the window fills (past 0 to 2), as it fills, and after,
    # when a sliding-window layer holds 3 tokens and a full-attention layer all of them.
    model = _with_a_full_attention_layer(family)
    program = dynexport.export(model, (), kwargs=_cache_call(model, 2, 5, 3), dynamic_shapes=sliding_window_cache_dims(model))
    assert str(program.model.graph.outputs[1].shape[2]) == "Min(3, past_window + seq)"
    for batch, past, seq in [(2, 0, 6), (1, 0, 1), (3, 1, 1), (2, 2, 2), *CACHE_SIZES]:
        call = _cache_call(model, batch, past, seq) if past else _empty_cache_call(model, batch, seq)
        _assert_runs_as_eager(program, model, call, f"at batch {batch}, past {past}, new {seq}")


def test_a_sliding_window_layer_given_the_full_attention_layers_past_is_refused():
    # One Dim for both kinds would declare the graph valid only while the window is not full.
    model = _with_a_full_attention_layer("gemma2")
    dynamic_shapes = sliding_window_cache_dims(model)
    past = dynamic_shapes["cache"][0][1][2]
    dynamic_shapes["cache"] = [[{0: Dim("batch"), 2: past}] * 2] * 2
    with pytest.raises(ValueError, match=r"window 4.*past.*at most 3 past tokens.*Dim\('past_window', min=0, max=3\)"):
        dynexport.export(model, (), kwargs=_cache_call(model, 2, 2, 3), dynamic_shapes=dynamic_shapes)


def test_a_hybrid_cache_given_the_key_value_form_of_dynamic_shapes_is_refused_naming_its_lists():
    # LFM2's cache holds convolution states besides keys and values: four lists, not two
    # (tests/models/test_hybrid_caches.py exports it).
    model = WINDOWED_DECODERS["lfm2"](True).eval()
    call = _cache_call(model, 2, 5, 3)
    dynamic_shapes = {
        "input_ids": {0: Dim("batch"), 1: Dim("seq")}, "attention_mask": {0: Dim("batch"), 1: Dim("total")},
        "cache": [[{0: Dim("batch"), 2: Dim("past")}] * 2] * 2,
    }
    lists = r"\[\[key_cache\], \[value_cache\], \[conv_states\], \[recurrent_states\]\]"
    with pytest.raises(ValueError, match=rf"dynamic_shapes\['cache'\] gives 2 lists for a DynamicCache that flattens to 4: {lists}"):
        dynexport.export(model, (), kwargs=call, dynamic_shapes=dynamic_shapes)


def _sliding_window_mistral(window: int):
    """Mistral as its first release is configured (Phi-3-mini and Starcoder2 alike): every layer
    keeps a sliding window, 4096 tokens there."""
    return transformers.MistralForCausalLM(tiny(transformers.MistralConfig, **_TEXT, num_key_value_heads=2, sliding_window=window)).eval()


def test_a_decoder_of_sliding_window_layers_alone_called_without_a_cache():
    # The plain call, use_cache left True: the model makes a cache of sliding-window layers and
    # returns it. transformers keeps the last window - 1 keys by a negative slice, so the graph
    # holds the example's side of the window: prompts up to window - 2 tokens.
    model = _sliding_window_mistral(window=32)
    calls = [text_inputs(b, s) for b, s in TEXT_SIZES]
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: seq: max=30"):
        program = dynexport.export(model, (), kwargs=calls[0], dynamic_shapes=_text_dims("input_ids", "attention_mask"))
    assert [o.name for o in program.model.graph.outputs[1:3]] == ["present.0.key", "present.1.key"]
    for call in calls:
        _assert_runs_as_eager(program, model, call, f"at {tuple(call['input_ids'].shape)}")


def _sliding_window_cache_dims(past) -> dict[str, Any]:
    batch = Dim("batch")
    return {"input_ids": {0: batch, 1: Dim("seq")}, "attention_mask": {0: batch, 1: Dim.DYNAMIC}, "cache": [[{0: batch, 2: past}] * 2] * 2}


def test_a_cache_of_sliding_window_layers_alone_may_not_reach_a_full_window():
    # Its count of tokens seen is a Python int no tensor carries: the graph takes it to be the
    # tokens held, which a full window (window - 1 held) no longer tells.
    model = _sliding_window_mistral(window=6)
    for past in (Dim("past"), Dim("past", min=0, max=5)):
        with pytest.raises(ValueError, match=r"sliding window \(6 tokens\).*at most 4.*Dim\('past', min=0, max=4\)"):
            dynexport.export(model, (), kwargs=_cache_call(model, 2, 3, 2), dynamic_shapes=_sliding_window_cache_dims(past))


@slow
def test_a_cache_of_sliding_window_layers_alone_is_read_until_its_window_fills():
    model = _sliding_window_mistral(window=6)
    program = dynexport.export(
        model, (), kwargs=_cache_call(model, 2, 3, 2), dynamic_shapes=_sliding_window_cache_dims(Dim("past", min=0, max=4))
    )
    for batch, past, seq in [(2, 0, 3), (1, 0, 1), (3, 1, 1), (1, 4, 1), (2, 4, 3)]:  # the last fills the window
        call = _cache_call(model, batch, past, seq) if past else _empty_cache_call(model, batch, seq)
        # Returned, a cache counts the tokens it holds: 5 where eager's has seen 7 at the last.
        _assert_runs_as_eager(program, model, call, f"at batch {batch}, past {past}, new {seq}", counts=past + seq <= 5)
    with pytest.raises(ValueError, match=r"'past_key_values.0.key' dim 2 is 5, outside the range past \[0, 4\]"):
        program(**_cache_call(model, 1, 5, 1))


@slow
def test_decoder_with_input_names_and_dynamic_axes():
    # torch.onnx's older form: positional inputs named, their dynamic axes named.
    model = DECODERS["qwen3"](False).eval()
    calls = [text_inputs(b, s) for b, s in TEXT_SIZES]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    program = dynexport.export(
        model, (calls[0]["input_ids"], calls[0]["attention_mask"]), input_names=["input_ids", "attention_mask"],
        output_names=["logits"], dynamic_axes=axes,
    )
    assert [str(d) for d in program.model.graph.outputs[0].shape] == ["batch", "seq", str(VOCAB)]
    for call in calls:
        with torch.no_grad():
            expected = model(**call).logits
        assert_close(program(call["input_ids"], call["attention_mask"])[0], expected, atol=ATOL)


# -- encoders ---------------------------------------------------------------------------------

ENCODERS: dict[str, Callable[[], Any]] = {
    # DeBERTa-v3's configuration: disentangled attention over bucketed relative positions.
    "deberta_v2": lambda: transformers.DebertaV2Model(tiny(
        transformers.DebertaV2Config, **_TEXT, max_position_embeddings=64, relative_attention=True,
        position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
        share_att_key=True, position_biased_input=False,
    )),
    "deberta": lambda: transformers.DebertaModel(tiny(
        transformers.DebertaConfig, **_TEXT, max_position_embeddings=64, relative_attention=True,
        pos_att_type=["p2c", "c2p"],
    )),
    "xlm_roberta": lambda: transformers.XLMRobertaModel(tiny(
        transformers.XLMRobertaConfig, **_TEXT, max_position_embeddings=64,
    )),
    "mpnet": lambda: transformers.MPNetModel(tiny(transformers.MPNetConfig, **_TEXT, max_position_embeddings=64)),
    # Local attention (a window of 4) in every other layer.
    "modernbert": lambda: transformers.ModernBertModel(tiny(
        transformers.ModernBertConfig, **_TEXT, max_position_embeddings=64, local_attention=4,
        global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
    )),
    # Block-sparse attention by default: at these lengths it falls back to full attention.
    "big_bird": lambda: transformers.BigBirdModel(tiny(transformers.BigBirdConfig, **_TEXT, max_position_embeddings=64)),
    "roformer": lambda: transformers.RoFormerModel(tiny(  # rotary position embeddings
        transformers.RoFormerConfig, **_TEXT, max_position_embeddings=64,
    )),
    "esm": lambda: transformers.EsmModel(tiny(
        transformers.EsmConfig, **_TEXT, max_position_embeddings=64, pad_token_id=0, position_embedding_type="rotary",
    )),
    "nomic_bert": lambda: transformers.NomicBertModel(tiny(
        transformers.NomicBertConfig, **_TEXT, max_position_embeddings=64,
    )),
}


@pytest.mark.parametrize("family", _params(ENCODERS, {"deberta_v2", "modernbert"}))
def test_encoder(family):
    model = ENCODERS[family]().eval()
    calls = [text_inputs(b, s) for b, s in TEXT_SIZES]
    _check(model, calls, dynamic_shapes=_text_dims("input_ids", "attention_mask"))


def test_encoder_with_input_names_and_dynamic_axes():
    model = ENCODERS["xlm_roberta"]().eval()
    calls = [text_inputs(b, s) for b, s in TEXT_SIZES]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    assert_exports_equivalent(
        model, (calls[0]["input_ids"], calls[0]["attention_mask"]), input_names=["input_ids", "attention_mask"],
        dynamic_axes=axes, resized=[(c["input_ids"], c["attention_mask"]) for c in calls[1:]], atol=ATOL,
    )


# -- encoder-decoders -------------------------------------------------------------------------

_SEQ2SEQ = {
    "vocab_size": VOCAB, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64,
    "use_cache": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
}

ENCODER_DECODERS: dict[str, Callable[[], Any]] = {
    "marian": lambda: transformers.MarianMTModel(tiny(transformers.MarianConfig, **_SEQ2SEQ)),
    "m2m100": lambda: transformers.M2M100ForConditionalGeneration(tiny(transformers.M2M100Config, **_SEQ2SEQ)),
    "pegasus": lambda: transformers.PegasusForConditionalGeneration(tiny(transformers.PegasusConfig, **_SEQ2SEQ)),
    "mbart": lambda: transformers.MBartForConditionalGeneration(tiny(transformers.MBartConfig, **_SEQ2SEQ)),
}


@pytest.mark.parametrize("family", _params(ENCODER_DECODERS, {"marian"}))
def test_encoder_decoder(family):
    model = ENCODER_DECODERS[family]().eval()
    calls = []
    for (batch, seq), target in zip(TEXT_SIZES, [5, 2, 9, 3]):
        call = text_inputs(batch, seq)
        call["decoder_input_ids"] = text_inputs(batch, target, mask=False)["input_ids"]
        calls.append(call)
    batch, seq, target = Dim("batch"), Dim("seq"), Dim("target")
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}, "decoder_input_ids": {0: batch, 1: target},
    }
    _check(model, calls, dynamic_shapes=dynamic_shapes)


# -- vision and multimodal --------------------------------------------------------------------

_VIT = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "image_size": 16,
    "patch_size": 4,
}

# DETR-style detectors on transformers' own ResNet (no timm), one encoder and decoder layer.
_DETR = {
    "use_timm_backbone": False, "use_pretrained_backbone": False, "backbone": None, "d_model": 32,
    "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_queries": 5, "num_labels": 3,
}


def _detr_backbone(stages: list[str]):
    return tiny(
        transformers.ResNetConfig, embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], out_features=stages,
    )


IMAGE_MODELS: dict[str, tuple[Callable[[], Any], int]] = {
    # family: (model factory, image side); the batch is dynamic
    "deit": (lambda: transformers.DeiTForImageClassificationWithTeacher(tiny(
        transformers.DeiTConfig, **_VIT, num_labels=3,
    )), 16),
    "beit": (lambda: transformers.BeitModel(tiny(  # relative position bias
        transformers.BeitConfig, **_VIT, vocab_size=VOCAB, use_relative_position_bias=True,
    )), 16),
    "dinov2": (lambda: transformers.Dinov2Model(tiny(transformers.Dinov2Config, **_VIT, mlp_ratio=2)), 16),
    "segformer": (lambda: transformers.SegformerForSemanticSegmentation(tiny(
        transformers.SegformerConfig, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32,
        num_labels=3,
    )), 32),
    "siglip_vision": (lambda: transformers.SiglipVisionModel(tiny(transformers.SiglipVisionConfig, **_VIT)), 16),
    "yolos": (lambda: transformers.YolosForObjectDetection(tiny(
        transformers.YolosConfig, **{**_VIT, "image_size": [16, 16]}, num_detection_tokens=3, num_labels=3,
    )), 16),
    "levit": (lambda: transformers.LevitModel(tiny(
        transformers.LevitConfig, image_size=32, hidden_sizes=[16, 24, 32], num_attention_heads=[1, 2, 2],
        depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16,
    )), 32),
    "swinv2": (lambda: transformers.Swinv2Model(tiny(
        transformers.Swinv2Config, image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
        window_size=2,
    )), 32),
    "dpt": (lambda: transformers.DPTForDepthEstimation(tiny(
        transformers.DPTConfig, **{**_VIT, "num_hidden_layers": 4, "image_size": 32, "patch_size": 8},
        backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 16, 32], fusion_hidden_size=16,
        head_hidden_size=8,
    )), 32),
    "depth_anything": (lambda: transformers.DepthAnythingForDepthEstimation(tiny(  # a DINOv2 backbone
        transformers.DepthAnythingConfig, backbone_config=tiny(
            transformers.Dinov2Config, **{**_VIT, "num_hidden_layers": 4, "image_size": 28, "patch_size": 14},
            out_indices=[1, 2, 3, 4], reshape_hidden_states=False,
        ), reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 16, 32], fusion_hidden_size=16, head_hidden_size=8,
        patch_size=14,
    )), 28),
    "conditional_detr": (lambda: transformers.ConditionalDetrForObjectDetection(tiny(
        transformers.ConditionalDetrConfig, **_DETR, backbone_config=_detr_backbone(["stage4"]),
    )), 64),
    # Multi-scale deformable attention: grid_sample over three feature levels.
    "deformable_detr": (lambda: transformers.DeformableDetrForObjectDetection(tiny(
        transformers.DeformableDetrConfig, **{**_DETR, "decoder_layers": 2},
        backbone_config=_detr_backbone(["stage2", "stage3", "stage4"]), num_feature_levels=3, encoder_n_points=2,
        decoder_n_points=2,
    )), 64),
}


@pytest.mark.parametrize("family", _params(IMAGE_MODELS, {"segformer", "dinov2"}))
def test_image_model_with_dynamic_batch(family):
    factory, side = IMAGE_MODELS[family]
    model = factory().eval()
    generator = torch.Generator().manual_seed(0)
    calls = [{"pixel_values": torch.randn(b, 3, side, side, generator=generator)} for b in (2, 3, 1, 4)]
    _check(model, calls, dynamic_shapes={"pixel_values": {0: Dim("batch")}})



def test_a_position_embedding_shortcut_at_the_example_sides_is_refused_under_dynamic_axes():
    # DINOv2 (ViT with interpolate_pos_encoding alike) skips interpolating its position
    # embeddings when the image has the config's size: `(h // 4) ** 2 == 16` is then in the graph,
    # which torch.export checks for a named Dim (DimSpecializedError) but not for dynamic_axes'
    # hints; exported, the graph failed in onnxruntime at every other side.
    model = IMAGE_MODELS["dinov2"][0]().eval()
    side = model.config.image_size
    with pytest.raises(dynexport.errors.CaptureError, match=r"pixel_values.shape\[2\] // 4\)\*\(pixel_values.shape\[2\] // 4\) == 16"):
        dynexport.export(
            model, (torch.randn(2, 3, side, side),), input_names=["pixel_values"],
            dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"}},
        )


def test_a_position_embedding_shortcut_refused_for_named_dims_names_the_fix_that_works():
    """With named Dims the shortcut at the config's sides is refused naming its line and the way
    out: an example of another size captures the interpolating branch, right at every size (the
    config's included, where eager takes the shortcut)."""
    model = IMAGE_MODELS["dinov2"][0]().eval()
    side = model.config.image_size
    dims = {"pixel_values": {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}}
    with pytest.raises(dynexport.errors.DimSpecializedError, match="export from an example of another size") as caught:
        dynexport.export(model, (), kwargs={"pixel_values": torch.randn(2, 3, side, side)}, dynamic_shapes=dims)
    assert "interpolate_pos_encoding" in caught.value.source
    generator = torch.Generator().manual_seed(0)
    calls = [{"pixel_values": torch.randn(b, 3, h, w, generator=generator)}
             for b, h, w in ((2, side + 4, side + 4), (1, side, side), (3, side + 8, side - 4))]
    with pytest.warns(UserWarning, match="refined"):
        _check(model, calls, dynamic_shapes=dims)


# Backbones whose image sides are dynamic too: (factory, sides at the export size and three
# others). Each model's refinements (a minimum side) are warned about.
SIDES_MODELS: dict[str, tuple[Callable[[], Any], list[tuple[int, int]]]] = {
    "convnextv2": (lambda: transformers.ConvNextV2Model(tiny(
        transformers.ConvNextV2Config, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
    )), [(32, 32), (40, 48), (24, 64), (64, 32)]),
    "pvt_v2": (lambda: transformers.PvtV2Model(tiny(
        transformers.PvtV2Config, hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2, sr_ratios=[2, 1],
        num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
    )), [(32, 32), (40, 48), (24, 64), (64, 33)]),
    "poolformer": (lambda: transformers.PoolFormerModel(tiny(
        transformers.PoolFormerConfig, hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3],
        strides=[4, 2], padding=[2, 1],
    )), [(32, 32), (40, 48), (24, 64), (63, 31)]),
    # torch's solver fixes both sides on its depthwise convolutions' guards: checked instead.
    "efficientnet": (lambda: transformers.EfficientNetModel(tiny(
        transformers.EfficientNetConfig, image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
    )), [(64, 64), (96, 64), (64, 128), (160, 96)]),
}


@slow
@pytest.mark.parametrize("family", list(SIDES_MODELS))
def test_image_model_with_dynamic_sides(family):
    factory, sides = SIDES_MODELS[family]
    model = factory().eval()
    generator = torch.Generator().manual_seed(0)
    calls = [{"pixel_values": torch.randn(b, 3, h, w, generator=generator)} for b, (h, w) in zip((2, 3, 1, 4), sides)]
    with pytest.warns(UserWarning, match="dynamic_shapes refined"):
        _check(model, calls, dynamic_shapes={"pixel_values": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}})


@slow
def test_siglip():
    """Texts and images in separate batches; the text sequence is dynamic."""
    model = transformers.SiglipModel(tiny(
        transformers.SiglipConfig,
        text_config={**_TEXT, "max_position_embeddings": 32},
        vision_config=dict(_VIT),
    )).eval()
    calls = [
        {"input_ids": text_inputs(texts, seq, mask=False)["input_ids"], "pixel_values": torch.randn(images, 3, 16, 16)}
        for (texts, seq), images in zip(TEXT_SIZES, [3, 1, 2, 5])
    ]
    dynamic_shapes = {"input_ids": {0: Dim("texts"), 1: Dim("seq")}, "pixel_values": {0: Dim("images")}}
    _check(model, calls, dynamic_shapes=dynamic_shapes)


@slow
def test_vision_encoder_decoder():
    """A ViT encoder and a GPT-2 decoder with cross-attention, as TrOCR and Donut are built."""
    torch.manual_seed(0)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.ViTConfig(**_VIT),
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                add_cross_attention=True, is_decoder=True, use_cache=False),
    )
    model = transformers.VisionEncoderDecoderModel(config).eval()
    calls = [
        {"pixel_values": torch.randn(b, 3, 16, 16), "decoder_input_ids": torch.randint(1, VOCAB, (b, t))}
        for b, t in [(2, 5), (3, 2), (1, 9), (4, 3)]
    ]
    batch = Dim("batch")
    _check(model, calls, dynamic_shapes={"pixel_values": {0: batch}, "decoder_input_ids": {0: batch, 1: Dim("target")}})


@slow
def test_llava_with_a_static_batch():
    """The image's 16 patch features replace its 16 image tokens in the text. LLaVA iterates
    over the images of the batch in Python (``list(image_features)``): a dynamic batch is refused
    naming that line; the sequence stays dynamic."""
    image_token = VOCAB - 1
    model = transformers.LlavaForConditionalGeneration(tiny(
        transformers.LlavaConfig,
        vision_config={"model_type": "clip_vision_model", **_VIT},
        text_config={"model_type": "llama", **_TEXT, "num_key_value_heads": 2, "use_cache": False},
        image_token_index=image_token, vision_feature_layer=-1,
    )).eval()
    generator = torch.Generator().manual_seed(0)

    def call(batch: int, seq: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, image_token, (batch, seq + 16), generator=generator)
        ids[:, 1:17] = image_token
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": torch.randn(batch, 3, 16, 16)}

    seq = Dim("seq")
    dynamic_shapes = {"input_ids": {1: seq}, "attention_mask": {1: seq}, "pixel_values": None}
    with pytest.raises(DimSpecializedError, match=r"batch = 2(.|\n)*list\(image_features\)"):
        dynexport.export(model, (), kwargs=call(2, 7), dynamic_shapes={
            "input_ids": {0: Dim("batch"), 1: seq}, "attention_mask": {0: Dim("batch"), 1: seq}, "pixel_values": {0: Dim("batch")},
        })
    _check(model, [call(2, s) for s in (7, 11, 16, 4)], dynamic_shapes=dynamic_shapes)


# -- audio ------------------------------------------------------------------------------------


_FEATURE_EXTRACTOR = {
    "conv_dim": (16, 16, 16), "conv_stride": (5, 2, 2), "conv_kernel": (10, 3, 3), "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
}


@pytest.mark.parametrize(
    ("family", "padding_mask"), [("hubert", False), pytest.param("hubert", True, marks=slow),
                                 pytest.param("data2vec_audio", False, marks=slow)],
)
def test_speech_encoder(family, padding_mask):
    """Samples from 60 on: the model's guards on its frame count exclude fewer (refined with a
    warning); torch's solver alone would take multiples of 20 only."""
    if family == "hubert":
        model = transformers.HubertModel(tiny(
            transformers.HubertConfig, **_TEXT, **_FEATURE_EXTRACTOR,
            **({"feat_extract_norm": "layer", "do_stable_layer_norm": True} if padding_mask else {}),
        )).eval()
    else:  # a stack of small positional convolutions
        model = transformers.Data2VecAudioModel(tiny(
            transformers.Data2VecAudioConfig, **_TEXT, **{**_FEATURE_EXTRACTOR, "num_conv_pos_embeddings": 4},
        )).eval()
    generator = torch.Generator().manual_seed(0)
    calls = []
    for batch, samples in [(2, 400), (3, 333), (1, 61), (4, 800)]:
        call = {"input_values": torch.randn(batch, samples, generator=generator)}
        if padding_mask:
            call["attention_mask"] = torch.ones(batch, samples, dtype=torch.int64)
            call["attention_mask"][-1, samples - samples // 3:] = 0
        calls.append(call)
    batch, samples = Dim("batch"), Dim("samples")
    dynamic_shapes = {name: {0: batch, 1: samples} for name in calls[0]}
    with pytest.warns(UserWarning, match="dynamic_shapes refined: samples: min=60"):
        _check(model, calls, dynamic_shapes=dynamic_shapes)


def test_a_conformer_speech_encoder_keeps_any_sample_count():
    """wav2vec2-Conformer's relative positions over its frame count ``samples // 20 - 1``: torch's
    solver cannot prove their view guards and asks for ``samples = 20*_samples``, though they hold
    at every count from 60 (dynamic_axes exported it unrefined); the named Dim is captured as a
    hint from there and checked by the guard audit, so counts off the multiples of 20 export too."""
    model = transformers.Wav2Vec2ConformerModel(tiny(
        transformers.Wav2Vec2ConformerConfig, **_TEXT, **_FEATURE_EXTRACTOR,
    )).eval()
    generator = torch.Generator().manual_seed(0)
    calls = [{"input_values": torch.randn(batch, samples, generator=generator)}
             for batch, samples in [(2, 400), (3, 333), (1, 61), (4, 1001)]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = _check(model, calls, dynamic_shapes={"input_values": {0: Dim("batch"), 1: Dim("samples")}})
    assert [str(w.message) for w in caught if "refined" in str(w.message)] == [
        "dynamic_shapes refined: samples: min=60 (from the model)"
    ]
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "samples"]


def test_a_decode_step_example_is_refused_with_the_dims_it_fixes():
    # One new token and a mask of ones: transformers' SDPA integration drops the mask and decides
    # causality by `q_length > 1` (a SymBool, which SDPA refused with a TypeError), fixing the
    # new tokens to 1. The refusal names the dims and asks for a larger example.
    model = DECODERS["qwen3"](True).eval()
    call = _cache_call(model, 1, 5, 1)
    call["attention_mask"] = torch.ones_like(call["attention_mask"])
    batch = Dim("batch")
    dynamic_shapes = {
        "input_ids": {0: batch, 1: Dim("seq")}, "attention_mask": {0: batch, 1: Dim.DYNAMIC},
        "cache": [[{0: batch, 2: Dim("past", min=0)}] * 2] * 2,
    }
    with pytest.raises(DimSpecializedError, match=r"seq = 1(.|\n)*example size of 2 or more"):
        dynexport.export(model, (), kwargs=call, dynamic_shapes=dynamic_shapes)


def test_a_cache_passed_as_past_key_values_through_the_models_kwargs():
    # transformers 5 names the argument `cache` and takes the older `past_key_values=` through
    # `**kwargs`, where torch.export cannot read dynamic_shapes (it failed: "Must provide a
    # tree_name"); the tutorials' call keeps working.
    model = DECODERS["qwen3"](True).eval()
    batch = Dim("batch")
    dynamic_shapes = {
        "input_ids": {0: batch, 1: Dim("seq")}, "attention_mask": {0: batch, 1: Dim.DYNAMIC},
        "past_key_values": [[{0: batch, 2: Dim("past", min=0)}] * 2] * 2,
    }

    def call(batch: int, past: int, seq: int) -> dict[str, Any]:
        call = _cache_call(model, batch, past, seq)
        call["past_key_values"] = call.pop("cache")
        return call

    program = dynexport.export(model, (), kwargs=call(2, 5, 3), dynamic_shapes=dynamic_shapes)
    assert [value.name for value in program.model.graph.inputs][2:4] == ["past_key_values.0.key", "past_key_values.1.key"]
    assert "forward" not in vars(model)
    for batch_, past, seq in [(3, 2, 1), (1, 9, 4)]:
        _assert_runs_as_eager(program, model, call(batch_, past, seq), f"at batch {batch_}, past {past}, new {seq}")


def test_a_decoder_exported_from_an_empty_cache_takes_one_token_steps():
    # An empty cache (past 0) makes capture reason size-obliviously, where Falcon's attention
    # reshape asks torch whether the new tokens are 1: the export refined them to 2 and more,
    # and the program refused every decode step.
    model = transformers.FalconForCausalLM(tiny(
        transformers.FalconConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_kv_heads=2, new_decoder_architecture=True,
    )).eval()

    def call(batch: int, past: int, seq: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(batch * 100 + past * 10 + seq)
        mask = torch.ones(batch, past + seq, dtype=torch.int64)
        cache = [tuple(torch.randn(batch, 4, past, 8, generator=generator) for _ in "kv") for _ in range(2)]
        return {
            "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator), "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1)[:, past:].contiguous(), "cache": transformers.DynamicCache(cache),
        }

    batch, seq = Dim("batch"), Dim("seq")
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: Dim.DYNAMIC}, "position_ids": {0: batch, 1: seq},
        "cache": [[{0: batch, 2: Dim("past", min=0)}] * 2] * 2,
    }
    program = dynexport.export(model, (), kwargs=call(2, 0, 4), dynamic_shapes=dynamic_shapes)
    for sizes in [(1, 5, 1), (2, 0, 1), (3, 3, 3)]:
        _assert_runs_as_eager(program, model, call(*sizes), f"at batch, past, new {sizes}")
