"""Hybrid decoders' DynamicCache as export input and output: LFM2's convolution layers and
Qwen3-Next's linear attention keep conv and recurrent states in their cache beside the
attention layers' keys and values (dynexport.model_caches). Tiny random-weight models, checked
in onnxruntime against eager at other batch, sequence and past sizes, and LFM2's greedy
generation token for token."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import dynexport
from dynexport.generation import greedy_generate
from dynexport.model_caches import UnflattenableCache, cache_leaf_names, caches_flattened
from tests.equivalence import assert_close
from tests.models.families import VOCAB, tiny, transformers

Dim = torch.export.Dim
ATOL = 1e-4

_TEXT = {"vocab_size": VOCAB, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "num_key_value_heads": 2}


def _lfm2():
    """Convolution layers around a full-attention layer; a convolution keeps 3 positions."""
    return transformers.Lfm2ForCausalLM(tiny(
        transformers.Lfm2Config, **_TEXT, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
    )).eval()


def _qwen3_next():
    """A linear-attention (gated delta rule) layer and a full-attention layer, 4 experts."""
    return transformers.Qwen3NextForCausalLM(tiny(
        transformers.Qwen3NextConfig, **_TEXT, num_hidden_layers=2, head_dim=8,
        layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
    )).eval()


def _step_call(model, batch: int, past: int, seq: int) -> dict[str, Any]:
    """A decode step: new tokens, a mask over past and new tokens, and the cache the model
    filled with ``past`` tokens; at past 0, a cache of no keys and zero states (no past)."""
    generator = torch.Generator().manual_seed(batch * 100 + past * 10 + seq)
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1, VOCAB, (batch, past or 4), generator=generator)).past_key_values
    if past == 0:
        for layer in cache.layers:
            if hasattr(layer, "keys"):
                layer.keys, layer.values = layer.keys[:, :, :0].clone(), layer.values[:, :, :0].clone()
            for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
                for state in states.values():
                    if state is not None:
                        state.zero_()
    return {
        "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator),
        "attention_mask": torch.ones(batch, past + seq, dtype=torch.int64),
        "past_key_values": cache,
    }


def _step_dims(call: dict[str, Any], *, seq: Any, batch: Any = None) -> dict[str, Any]:
    """The attention layers' past from 0; the states' sizes fixed but for the batch."""
    batch, past = batch or Dim("batch"), Dim("past", min=0)
    layers = call["past_key_values"].layers
    attention = [{0: batch, 2: past} for layer in layers if hasattr(layer, "keys")]
    convs, recurrents = (
        [{0: batch} for layer in layers for state in getattr(layer, kind, {}).values() if state is not None]
        for kind in ("conv_states", "recurrent_states")
    )
    return {
        "input_ids": {0: batch} if seq is None else {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},  # past + seq
        "past_key_values": [attention, attention, convs, recurrents],
    }


def _cache_tensors(cache) -> list[torch.Tensor]:
    tensors = []
    for layer in cache.layers:
        if hasattr(layer, "keys"):
            tensors += [layer.keys, layer.values]
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            tensors += [state for state in states.values() if state is not None]
    return tensors


def _assert_runs_as_eager(program, model, call: dict[str, Any], where: str, args: tuple = ()) -> None:
    with torch.no_grad():
        expected = model(*args, **copy.deepcopy(call))  # eager updates the states it is given in place
    actual = program(*args, **call)
    assert_close(actual.logits, expected.logits, atol=ATOL, where=f"logits {where}")
    got, want = actual.past_key_values, expected.past_key_values
    assert [type(layer) for layer in got.layers] == [type(layer) for layer in want.layers]
    assert_close(_cache_tensors(got), _cache_tensors(want), atol=ATOL, where=f"cache {where}")


def test_a_hybrid_cache_flattens_to_named_tensors_and_back():
    model = _lfm2()
    cache = _step_call(model, 2, 5, 1)["past_key_values"]
    with caches_flattened():
        leaves, spec = pytree.tree_flatten({"past_key_values": cache})
        rebuilt = pytree.tree_unflatten(leaves, spec)["past_key_values"]
    assert list(cache_leaf_names(spec, "past_key_values").values()) == [
        "past_key_values.1.key", "past_key_values.1.value", "past_key_values.0.conv_state", "past_key_values.2.conv_state",
    ]
    assert [type(layer) for layer in rebuilt.layers] == [type(layer) for layer in cache.layers]
    assert all(a is b for a, b in zip(_cache_tensors(rebuilt), _cache_tensors(cache), strict=True))
    conv = rebuilt.layers[0]
    assert conv.has_previous_state == {0: True} and conv.conv_kernel_size == {0: 3} and conv.recurrent_states == {0: None}
    assert rebuilt.get_seq_length() == 5 and rebuilt.get_conv_state(2) is cache.layers[2].conv_states[0]


def test_a_layer_of_several_states_names_each():
    layer = transformers.cache_utils.LinearAttentionLayer(number_of_states=2)
    for state in (0, 1):
        layer.update_conv_state(torch.randn(2, 8, 4), state_idx=state)
        layer.update_recurrent_state(torch.randn(2, 2, 4, 4), state_idx=state)
    cache = transformers.DynamicCache()
    cache.layers = [transformers.cache_utils.DynamicLayer(), layer]
    cache.layers[0].update(torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4))
    with caches_flattened():
        spec = pytree.tree_flatten(cache)[1]
    assert list(cache_leaf_names(spec, "present").values()) == [
        "present.0.key", "present.0.value", "present.1.conv_state.0", "present.1.conv_state.1",
        "present.1.recurrent_state.0", "present.1.recurrent_state.1",
    ]


def test_lfm2_called_plainly_returns_its_cache_as_eager():
    # use_cache left True: the model makes its hybrid cache and returns it. transformers pads a
    # prompt shorter than the convolution (3) in a Python branch, which capture leaves out: the
    # graph holds from 1, not refined to seq >= 3.
    model = _lfm2()
    batch, seq = Dim("batch"), Dim("seq")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="dynamic_shapes refined")
        program = dynexport.export(model, (torch.randint(1, VOCAB, (2, 5)),), dynamic_shapes={"input_ids": {0: batch, 1: seq}})
    assert [o.name for o in program.model.graph.outputs] == [
        "logits", "present.1.key", "present.1.value", "present.0.conv_state", "present.2.conv_state",
    ]
    for sizes in [(2, 5), (3, 9), (1, 16), (4, 3), (2, 2), (1, 1)]:
        ids = torch.randint(1, VOCAB, sizes, generator=torch.Generator().manual_seed(sum(sizes)))
        _assert_runs_as_eager(program, model, {}, f"at {sizes}", args=(ids,))


def test_lfm2_decode_step_runs_as_eager_from_past_0():
    model = _lfm2()
    call = _step_call(model, 2, 5, 3)
    program = dynexport.export(model, (), kwargs=call, dynamic_shapes=_step_dims(call, seq=Dim("seq")))
    inputs = [i.name for i in program.model.graph.inputs]
    assert inputs[2:] == ["past_key_values.1.key", "past_key_values.1.value", "past_key_values.0.conv_state", "past_key_values.2.conv_state"]
    for batch, past, seq in [(2, 5, 3), (3, 9, 1), (1, 2, 6), (4, 12, 2), (2, 0, 4), (1, 0, 1)]:
        _assert_runs_as_eager(program, model, _step_call(model, batch, past, seq), f"at batch {batch}, past {past}, new {seq}")
    # past 0 (no keys, zero states) is the prompt run without a cache
    call = _step_call(model, 2, 0, 4)
    with torch.no_grad():
        assert_close(program(**call).logits, model(input_ids=call["input_ids"]).logits, atol=ATOL, where="prompt")


def test_lfm2_generates_as_eager():
    # One graph from past 0: the prompt (left-padded at batch 2) and every step.
    model = _lfm2()
    batch, seq = Dim("batch"), Dim("seq")
    call = _step_call(model, 2, 0, 4)
    call["position_ids"] = torch.arange(4).expand(2, 4).contiguous()
    dynamic_shapes = {**_step_dims(call, seq=seq, batch=batch), "position_ids": {0: batch, 1: seq}}
    program = dynexport.export(model, (), kwargs=call, dynamic_shapes=dynamic_shapes)
    for rows in (1, 2):
        ids = torch.randint(3, VOCAB, (rows, 6), generator=torch.Generator().manual_seed(rows))
        mask = torch.ones(rows, 6, dtype=torch.int64)
        if rows > 1:
            ids[-1, :3], mask[-1, :3] = 0, 0
        with torch.no_grad():
            expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, pad_token_id=0)
        actual = greedy_generate(program, ids, mask, max_new_tokens=8, eos_token_id=model.generation_config.eos_token_id, pad_token_id=0)
        assert actual.tolist() == expected.tolist(), f"batch {rows}"


@pytest.mark.slow
def test_qwen3_next_decode_step_runs_as_eager():
    # One new token (the prompt's chunked gated-delta rule loops over seq // 64 chunks in
    # Python: torch fixes their count), the attention layer's past from 0.
    model = _qwen3_next()
    call = _step_call(model, 2, 5, 1)
    program = dynexport.export(model, (), kwargs=call, dynamic_shapes=_step_dims(call, seq=None))
    inputs = [i.name for i in program.model.graph.inputs]
    assert inputs[2:] == ["past_key_values.1.key", "past_key_values.1.value", "past_key_values.0.conv_state", "past_key_values.0.recurrent_state"]
    for batch, past in [(2, 5), (3, 9), (1, 2), (4, 70), (2, 0)]:
        _assert_runs_as_eager(program, model, _step_call(model, batch, past, 1), f"at batch {batch}, past {past}")


@pytest.mark.slow
def test_qwen3_next_generates_as_eager_token_by_token():
    # The one-token step runs the prompt token by token from zero states; eager chunk-scans it.
    model = _qwen3_next()
    batch = Dim("batch")
    call = _step_call(model, 2, 3, 1)
    call["position_ids"] = torch.tensor([[3], [3]])
    program = dynexport.export(model, (), kwargs=call, dynamic_shapes={**_step_dims(call, seq=None, batch=batch), "position_ids": {0: batch}})
    eos = model.generation_config.eos_token_id
    for rows in (1, 2):
        ids = torch.randint(3, VOCAB, (rows, 6), generator=torch.Generator().manual_seed(rows))
        with torch.no_grad():
            expected = model.generate(input_ids=ids, do_sample=False, max_new_tokens=8, pad_token_id=0)
        assert greedy_generate(program, ids, max_new_tokens=8, eos_token_id=eos, pad_token_id=0).tolist() == expected.tolist()
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[-1, :3] = 0
    with pytest.raises(ValueError, match="one token at a time.*without padding"):
        greedy_generate(program, ids, mask, max_new_tokens=2, eos_token_id=eos, pad_token_id=0)


# Other families whose cache holds LinearAttentionLayers: Mamba-2 mixers beside attention
# (Bamba, Granite MoE hybrid) or within the attention layers (Falcon-H1's
# LinearAttentionAndFullAttentionLayer), Mamba beside attention (Jamba), Mamba-2 alone, Qwen3.5's
# gated delta rule. Each exports its one-token step.
STATE_DECODERS = {
    "bamba": lambda: transformers.BambaForCausalLM(tiny(
        transformers.BambaConfig, **_TEXT, num_hidden_layers=2, attn_layer_indices=[1], mamba_n_heads=4,
        mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=16, mamba_expand=2,
    )),
    "falcon_h1": lambda: transformers.FalconH1ForCausalLM(tiny(  # attention and Mamba-2 in each layer
        transformers.FalconH1Config, **_TEXT, num_hidden_layers=2, head_dim=8, mamba_d_ssm=64, mamba_n_heads=4,
        mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=16, mamba_expand=2,
    )),
    "granitemoehybrid": lambda: transformers.GraniteMoeHybridForCausalLM(tiny(
        transformers.GraniteMoeHybridConfig, **_TEXT, num_hidden_layers=2, layer_types=["mamba", "attention"],
        mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=16, mamba_expand=2,
        num_local_experts=4, num_experts_per_tok=2,
    )),
    "jamba": lambda: transformers.JambaForCausalLM(tiny(
        transformers.JambaConfig, **_TEXT, num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=2, mamba_d_state=8, mamba_dt_rank=4,
        use_mamba_kernels=False,
    )),
    "mamba2": lambda: transformers.Mamba2ForCausalLM(tiny(
        transformers.Mamba2Config, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16,
        state_size=8, n_groups=1, chunk_size=16, expand=2,
    )),
    "qwen3_5": lambda: transformers.Qwen3_5ForCausalLM(tiny(
        transformers.Qwen3_5TextConfig, **_TEXT, num_hidden_layers=2, head_dim=8,
        layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
    )),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", STATE_DECODERS)
def test_a_state_space_decode_step_runs_as_eager(family):
    model = STATE_DECODERS[family]().eval()
    call = _step_call(model, 2, 5, 1)
    program = dynexport.export(model, (), kwargs=call, dynamic_shapes=_step_dims(call, seq=None))
    for batch, past in [(2, 5), (3, 9), (1, 2), (2, 0)]:
        _assert_runs_as_eager(program, model, _step_call(model, batch, past, 1), f"at batch {batch}, past {past}")


@pytest.mark.slow
def test_a_mamba_decode_step_without_a_mask_runs_as_eager():
    # Given attention_mask, Mamba's step fixed its length to the example's; it needs none.
    model = transformers.MambaForCausalLM(tiny(
        transformers.MambaConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
        use_mambapy=False,
    )).eval()

    def call(batch: int, past: int) -> dict[str, Any]:
        return {name: value for name, value in _step_call(model, batch, past, 1).items() if name != "attention_mask"}

    dynamic_shapes = {name: dims for name, dims in _step_dims(call(2, 5), seq=None).items() if name != "attention_mask"}
    program = dynexport.export(model, (), kwargs=call(2, 5), dynamic_shapes=dynamic_shapes)
    for batch, past in [(2, 5), (3, 9), (1, 2), (2, 0)]:
        _assert_runs_as_eager(program, model, call(batch, past), f"at batch {batch}, past {past}")


class _PagedLayer(transformers.cache_utils.DynamicLayer):
    """A cache layer of a kind dynexport does not flatten."""


def test_state_layers_beside_other_kinds_or_recording_their_past_are_refused():
    model = _lfm2()
    cache = _step_call(model, 2, 5, 1)["past_key_values"]
    cache.layers[1] = _PagedLayer()
    with caches_flattened(), pytest.raises(UnflattenableCache, match=r"holds \['LinearAttentionLayer', '_PagedLayer'\].*use_cache=False"):
        pytree.tree_flatten(cache)
    cache = _step_call(model, 2, 5, 1)["past_key_values"]
    cache.activate_past_recording()
    with caches_flattened(), pytest.raises(UnflattenableCache, match="activate_past_recording"):
        pytree.tree_flatten(cache)
