"""transformers' StaticCache and EncoderDecoderCache as export inputs and outputs, with no
registration by the user (dynexport/model_caches.py): checked in onnxruntime at other sizes, the
program taking and returning the cache objects; their tensors named as the ecosystem names them.
(DynamicCache: tests/test_dim_refinement.py and tests/test_generation.py; here only how one
filled from key/value pairs is captured.)"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

import dynexport
from dynexport.capture import capture
from dynexport.model_caches import caches_flattened
from tests.equivalence import assert_close

transformers = pytest.importorskip("transformers")

from tests.models.families import DECODERS, VOCAB  # after the importorskip

Dim = torch.export.Dim
CACHES = ("DynamicCache", "StaticCache", "EncoderDecoderCache")


def _registered() -> list[bool]:
    return [getattr(transformers, name) in pytree.SUPPORTED_NODES for name in CACHES]


def _static_cache_call(model, batch: int, filled: int, seq: int) -> dict:
    """New tokens and a StaticCache of 16 positions that already holds ``filled`` tokens."""
    generator = torch.Generator().manual_seed(batch * 100 + filled * 10 + seq)
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    cache.early_initialization(batch, 2, 8, torch.float32, torch.device("cpu"))
    if filled:
        with torch.no_grad():
            model(input_ids=torch.randint(1, VOCAB, (batch, filled), generator=generator), cache=cache)
    return {"input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator), "cache": cache}


def test_static_cache_in_and_out():
    model = DECODERS["llama"](True).eval()
    registered = _registered()
    batch = Dim("batch")
    layers = [{0: batch}] * model.config.num_hidden_layers
    program = dynexport.export(
        model, (), kwargs=_static_cache_call(model, 2, 3, 2),
        dynamic_shapes={"input_ids": {0: batch, 1: Dim("seq", max=8)}, "cache": [layers, layers, [None, None]]},
    )
    assert _registered() == registered  # pytree nodes for the export only
    assert [v.name for v in program.model.graph.inputs][1:] == [
        f"past_key_values.{i}.{t}" for t in ("key", "value", "cumulative_length") for i in (0, 1)
    ]
    assert [v.name for v in program.model.graph.outputs][:3] == ["logits", "present.0.key", "present.1.key"]
    for sizes in [(2, 3, 2), (1, 5, 1), (3, 0, 4)]:
        with torch.no_grad():
            expected = model(**_static_cache_call(model, *sizes))
        actual = program(**_static_cache_call(model, *sizes))
        assert isinstance(actual.past_key_values, transformers.StaticCache)
        assert_close(actual.logits, expected.logits, atol=1e-4, where=f"logits at {sizes}")
        for got, want in zip(actual.past_key_values.layers, expected.past_key_values.layers):
            assert_close((got.keys, got.values), (want.keys, want.values), atol=1e-4, where=f"cache at {sizes}")
            assert int(got.cumulative_length) == int(want.cumulative_length) == sizes[1] + sizes[2]


def _seq2seq_step(model, batch: int, past: int, target: int) -> dict:
    """A decoder step of an encoder-decoder: the source, new decoder tokens and the
    EncoderDecoderCache the model filled with ``past`` decoder tokens (and the cross-attention
    keys and values of the source)."""
    generator = torch.Generator().manual_seed(batch * 100 + past * 10 + target)
    ids = torch.randint(3, VOCAB, (batch, 6), generator=generator)
    mask = torch.ones(batch, 6, dtype=torch.int64)
    mask[-1, :2] = 0
    with torch.no_grad():
        cache = model(
            input_ids=ids, attention_mask=mask, decoder_input_ids=torch.randint(3, VOCAB, (batch, past), generator=generator),
            use_cache=True,
        ).past_key_values
    return {
        "input_ids": ids, "attention_mask": mask,
        "decoder_input_ids": torch.randint(3, VOCAB, (batch, target), generator=generator), "cache": cache,
    }


def test_encoder_decoder_cache_in_and_out():
    from tests.models.test_transformers import _SEQ2SEQ

    model = _SEQ2SEQ["bart"]().eval()
    batch, seq, past, target = Dim("batch"), Dim("seq"), Dim("past"), Dim("target")
    self_attention = [[{0: batch, 2: past}] * 2] * 2
    cross_attention = [[{0: batch, 2: seq}] * 2] * 2
    program = dynexport.export(
        model, (), kwargs=_seq2seq_step(model, 2, 3, 2),
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
                        "decoder_input_ids": {0: batch, 1: target}, "cache": [self_attention, cross_attention]},
    )
    inputs = {v.name: str(v.shape) for v in program.model.graph.inputs}
    assert inputs["past_key_values.1.decoder.value"] == "[batch,4,past,8]"
    assert inputs["past_key_values.0.encoder.key"] == "[batch,4,seq,8]"
    outputs = {v.name: str(v.shape) for v in program.model.graph.outputs}
    assert outputs["present.0.decoder.key"] == "[batch,4,past + target,8]"
    for sizes in [(2, 3, 2), (1, 5, 3), (3, 4, 1)]:
        with torch.no_grad():
            expected = model(**_seq2seq_step(model, *sizes))
        actual = program(**_seq2seq_step(model, *sizes))
        assert isinstance(actual.past_key_values, transformers.EncoderDecoderCache)
        assert_close(actual.logits, expected.logits, atol=1e-4, where=f"logits at {sizes}")
        for part in ("self_attention_cache", "cross_attention_cache"):
            got, want = getattr(actual.past_key_values, part).layers[1], getattr(expected.past_key_values, part).layers[1]
            assert_close((got.keys, got.values), (want.keys, want.values), atol=1e-4, where=f"{part} at {sizes}")


def test_a_cache_without_tensors_yet_is_refused_with_the_fix():
    model = DECODERS["llama"](True)
    with caches_flattened(), pytest.raises(ValueError, match="early_initialization"):
        pytree.tree_flatten(transformers.StaticCache(config=model.config, max_cache_len=8))
    with caches_flattened(), pytest.raises(ValueError, match=r"\[batch, heads, 0, head_dim\]"):
        pytree.tree_flatten(transformers.DynamicCache(config=model.config))


class _PagedLayer(transformers.cache_utils.DynamicLayer):
    """A cache layer of a kind dynexport does not flatten."""


class _ReturnsAnUnflattenableCache(torch.nn.Module):
    def forward(self, x):
        cache = transformers.DynamicCache()
        cache.layers.append(_PagedLayer())
        cache.update(x, x + 1, 0)
        return x * 2, cache


def test_an_unflattenable_cache_stops_capture_at_the_first_strategy():
    # every strategy would meet the cache alike: the others are not run (a minute on a decoder)
    with pytest.raises(dynexport.errors.CaptureError, match=r"flattens a DynamicCache .* holds \['_PagedLayer'\]") as caught:
        dynexport.export(_ReturnsAnUnflattenableCache(), (torch.randn(1, 2, 3, 4),), dynamic_shapes=({0: Dim("batch")},))
    assert list(caught.value.reasons) == ["torch.export(strict=False)"]
    message = str(caught.value)
    assert "It failed in a way every strategy would" in message and "first strategy" not in message
    assert "example size of 0 or 1" not in message  # the batch of 1 has nothing to do with it


def test_the_registration_is_undone_and_the_users_kept():
    # A registration of the user's own stays as it was: dynexport registers only what is missing.
    before = _registered()
    with caches_flattened():
        assert all(_registered())
    assert _registered() == before


class _BuildsItsCache(torch.nn.Module):
    """A decoder whose past keys and values come in as pairs of tensors, made a DynamicCache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, past_key_values):
        cache = transformers.DynamicCache(past_key_values)
        return self.model(input_ids=input_ids, cache=cache).logits


def test_a_dynamic_cache_filled_from_pairs_is_captured_without_concatenations_to_empty_tensors():
    # transformers concatenates each first pair to an empty tensor: while capturing, the pair is
    # kept as it is (the same values); the eager DynamicLayer is left as it was.
    model = _BuildsItsCache(DECODERS["llama"](True).eval())
    generator = torch.Generator().manual_seed(0)
    pairs = [tuple(torch.randn(2, 2, 3, 8, generator=generator) for _ in "kv") for _ in range(2)]
    update = transformers.cache_utils.DynamicLayer.update
    with caches_flattened():
        program, _ = capture(model, (torch.ones(2, 4, dtype=torch.int64), pairs), {}, None)
    assert transformers.cache_utils.DynamicLayer.update is update
    concatenated = [
        arg.meta["val"].shape
        for node in program.graph.find_nodes(op="call_function", target=torch.ops.aten.cat.default)
        for arg in node.args[0]
    ]
    assert concatenated and all(shape.numel() > 0 for shape in concatenated)
    input_ids = torch.randint(1, VOCAB, (2, 4), generator=generator)
    with torch.no_grad():
        assert_close(program.module()(input_ids, pairs), model(input_ids, pairs), atol=1e-5)
