"""Greedy generation over exported models (dynexport.generation) against
``model.generate(do_sample=False)``, token for token: tiny random-weight decoders exported once
with an empty cache (past 0), so that the prompt and every decode step run the same ONNX graph,
and an encoder-decoder exported without a cache. Each model generates at batch 1 and at batch 2
with a left-padded row."""

from __future__ import annotations

import json

import pytest
import torch

import dynexport
from dynexport.generation import greedy_generate

transformers = pytest.importorskip("transformers")

from tests.models.families import DECODERS, VOCAB  # after the importorskip

Dim = torch.export.Dim
NEW_TOKENS = 8


def _empty_cache_call(model, batch: int, seq: int) -> dict:
    """A prompt call as generate makes it: tokens, a mask (the last row left-padded), positions
    counted over attended tokens, and an empty DynamicCache shaped like the model's own."""
    with torch.no_grad():
        probe = model(input_ids=torch.ones(1, 1, dtype=torch.int64), use_cache=True).past_key_values
    empty = [(torch.zeros(batch, l.keys.shape[1], 0, l.keys.shape[3]),
              torch.zeros(batch, l.values.shape[1], 0, l.values.shape[3])) for l in probe.layers]
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, : seq // 2] = 0
    return {
        "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seq)),
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0),
        "cache": transformers.DynamicCache(empty),
    }


def _filled_cache_call(model, batch: int, past: int, seq: int) -> dict:
    """A decode call: ``past`` random keys and values per layer, all of them attended."""
    call = _empty_cache_call(model, batch, seq)
    generator = torch.Generator().manual_seed(past)
    call["cache"] = transformers.DynamicCache([
        tuple(torch.randn(batch, l.keys.shape[1], past, l.keys.shape[3], generator=generator) for _ in "kv")
        for l in call["cache"].layers
    ])
    call["attention_mask"] = torch.ones(batch, past + seq, dtype=torch.int64)
    call["position_ids"] = torch.arange(past, past + seq).expand(batch, seq).contiguous()
    return call


def export_decoder(model, example_past: int = 0) -> dynexport.ONNXProgram:
    """One graph for the prompt and the decode steps: past is a Dim from 0."""
    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past", min=0)
    layers = model.config.num_hidden_layers
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},  # past + seq
        "position_ids": {0: batch, 1: seq},
        "cache": [[{0: batch, 2: past}] * layers] * 2,
    }
    example = _filled_cache_call(model, 2, example_past, 4) if example_past else _empty_cache_call(model, 2, 4)
    return dynexport.export(model, (), kwargs=example, dynamic_shapes=dynamic_shapes)


def _prompts(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of 6 tokens; at batch 2 the second is left-padded to 3."""
    ids = torch.randint(3, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones(batch, 6, dtype=torch.int64)
    if batch > 1:
        ids[-1, :3], mask[-1, :3] = 0, 0
    return ids, mask


def _assert_generates_as_eager(model, program, prompt_program=None, **generate_kwargs):
    eos = model.generation_config.eos_token_id
    for batch in (1, 2):
        ids, mask = _prompts(batch)
        with torch.no_grad():
            expected = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                **generate_kwargs,
            )
        actual = greedy_generate(
            program, ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=0,
            prompt_program=prompt_program, **generate_kwargs,
        )
        assert actual.tolist() == expected.tolist(), f"batch {batch}"


def _check_decoder(family: str) -> dynexport.ONNXProgram:
    model = DECODERS[family](True).eval()
    program = export_decoder(model)
    _assert_generates_as_eager(model, program)
    return program


def test_llama_generates_as_eager_from_one_graph():
    program = _check_decoder("llama")
    names = [v.name for v in program.model.graph.inputs]
    assert names[3:] == [f"past_key_values.{i}.{t}" for t in ("key", "value") for i in (0, 1)]
    outputs = [v.name for v in program.model.graph.outputs]
    assert outputs == ["logits"] + [f"present.{i}.{t}" for t in ("key", "value") for i in (0, 1)]
    assert json.loads(program.model.metadata_props["pkg.dynexport.dim_ranges"])["past"][0] == 0


def test_a_decoder_exported_with_a_filled_cache_also_runs_the_prompt():
    # Past 3 at export, past 0 for the prompt: the same graph, declared from 0.
    model = DECODERS["llama"](True).eval()
    program = export_decoder(model, example_past=3)
    _assert_generates_as_eager(model, program)
    # verify() copies the cache for each run: eager updates it in place. (The exported program
    # run eagerly keeps torch.export's assumed minimums, so the reference is the model.)
    report = program.verify(model=model, resized=[((), _empty_cache_call(model, 1, 3)), ((), _filled_cache_call(model, 3, 5, 2))])
    assert report.passed and len({o.inputs for o in report.outputs}) == 3


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral", "qwen2", "phi", "gemma", "gpt2"])
def test_decoder_generates_as_eager(family):
    _check_decoder(family)


def test_a_decoder_with_a_sliding_window_cache_generates_as_eager():
    # Gemma 2 with a window of 4: the prompt (6 tokens) and the decoding run past the window,
    # where a sliding-window layer keeps 3 tokens and a full-attention layer all of them.
    from tests.models.test_transformers_more import _cache_call, _with_a_full_attention_layer, sliding_window_cache_dims

    model = _with_a_full_attention_layer("gemma2")
    program = dynexport.export(model, (), kwargs=_cache_call(model, 2, 5, 3), dynamic_shapes=sliding_window_cache_dims(model))
    _assert_generates_as_eager(model, program)


def _empty_encoder_decoder_cache():
    return transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())


def _export_seq2seq(model, step: str | None) -> dynexport.ONNXProgram:
    """An encoder-decoder's forward for a ``step``: ``"prompt"`` (an EncoderDecoderCache with no layer yet,
    which the model fills), ``"decode"`` (the cache it filled with 2 tokens) or None (no cache)."""
    ids, mask = _prompts(2)
    batch, seq, target = Dim("batch"), Dim("seq"), Dim("target")
    kwargs = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :2].clone()}
    dynamic_shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}, "decoder_input_ids": {0: batch, 1: target}}
    if step == "prompt":
        kwargs["cache"], dynamic_shapes["cache"] = _empty_encoder_decoder_cache(), [[[], []], [[], []]]
    elif step == "decode":
        with torch.no_grad():
            kwargs["cache"] = model(**kwargs, use_cache=True).past_key_values
        layers = len(kwargs["cache"].self_attention_cache.layers)
        dynamic_shapes["cache"] = [[[{0: batch, 2: Dim("past")}] * layers] * 2, [[{0: batch, 2: seq}] * layers] * 2]
    return dynexport.export(model, (), kwargs=kwargs, dynamic_shapes=dynamic_shapes)


@pytest.mark.parametrize("family", ["bart", pytest.param("t5", marks=pytest.mark.slow)])
def test_encoder_decoder_with_a_cache_generates_as_eager(family):
    from tests.models.test_transformers import _SEQ2SEQ

    model = _SEQ2SEQ[family]().eval()
    if model.generation_config.decoder_start_token_id is None:
        model.generation_config.decoder_start_token_id = 0  # T5's, as its released configs say
    prompt_program, program = _export_seq2seq(model, "prompt"), _export_seq2seq(model, "decode")
    assert "past_key_values.0.encoder.key" in [v.name for v in program.model.graph.inputs]
    assert "present.1.encoder.value" in [v.name for v in prompt_program.model.graph.outputs]
    start = model.generation_config.decoder_start_token_id
    _assert_generates_as_eager(model, program, decoder_start_token_id=start, prompt_program=prompt_program)
    with pytest.raises(ValueError, match="prompt_program"):
        greedy_generate(program, *_prompts(1), max_new_tokens=2, decoder_start_token_id=start)


@pytest.mark.slow
def test_encoder_decoder_without_a_cache_generates_as_eager():
    from tests.models.test_transformers import _SEQ2SEQ

    model = _SEQ2SEQ["bart"]().eval()
    program = _export_seq2seq(model, None)
    _assert_generates_as_eager(model, program, decoder_start_token_id=model.config.decoder_start_token_id)


def test_a_program_without_keyword_arguments_is_refused():
    model = torch.nn.Linear(4, 4)
    program = dynexport.export(model, (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="keyword arguments only"):
        greedy_generate(program, torch.zeros(1, 2, dtype=torch.int64), max_new_tokens=1)
