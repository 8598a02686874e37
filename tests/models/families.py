"""Tiny transformers models (random weights, nothing downloaded) and their inputs, shared by the
model tests (tests/models/test_transformers.py) and the export-speed benchmark."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tests.torchvision_ops import load_torchvision_if_installed

load_torchvision_if_installed()  # transformers imports torchvision as it loads

import transformers  # noqa: E402

Dim = torch.export.Dim

VOCAB = 96


def text_inputs(batch: int, seq: int, *, mask: bool = True) -> dict[str, torch.Tensor]:
    """Token ids, and an attention mask whose last row pads out its final tokens."""
    generator = torch.Generator().manual_seed(batch * 100 + seq)
    inputs = {"input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator)}
    if mask:
        attention_mask = torch.ones(batch, seq, dtype=torch.int64)
        attention_mask[-1, seq - seq // 3:] = 0
        inputs["attention_mask"] = attention_mask
    return inputs


def tiny(config_class, **overrides):
    torch.manual_seed(0)
    return config_class(**overrides)


def text_dims(names, seq_max: int = 32) -> dict[str, dict[int, Any]]:
    batch, seq = Dim("batch"), Dim("seq", min=2, max=seq_max)
    return {name: {0: batch, 1: seq} for name in names}


# -- encoders and decoder language models -------------------------------------------------------

ENCODERS: dict[str, Callable[[], Any]] = {
    "bert": lambda: transformers.BertModel(tiny(
        transformers.BertConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )),
    "roberta": lambda: transformers.RobertaModel(tiny(
        transformers.RobertaConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )),
    "distilbert": lambda: transformers.DistilBertModel(tiny(
        transformers.DistilBertConfig, vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
        max_position_embeddings=64,
    )),
    "albert": lambda: transformers.AlbertModel(tiny(
        transformers.AlbertConfig, vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
    )),
    "electra": lambda: transformers.ElectraModel(tiny(
        transformers.ElectraConfig, vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
    )),
}


DECODER_COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)

DECODERS: dict[str, Callable[[bool], Any]] = {
    "gpt2": lambda cache: transformers.GPT2LMHeadModel(tiny(
        transformers.GPT2Config, vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, use_cache=cache,
    )),
    "gpt_neox": lambda cache: transformers.GPTNeoXForCausalLM(tiny(
        transformers.GPTNeoXConfig, **DECODER_COMMON, intermediate_size=64, max_position_embeddings=64,
        rotary_pct=0.5, use_cache=cache,
    )),
    "opt": lambda cache: transformers.OPTForCausalLM(tiny(
        transformers.OPTConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64, use_cache=cache,
    )),
    "llama": lambda cache: transformers.LlamaForCausalLM(tiny(
        transformers.LlamaConfig, **DECODER_COMMON, intermediate_size=64, num_key_value_heads=2, use_cache=cache,
    )),
    "mistral": lambda cache: transformers.MistralForCausalLM(tiny(
        transformers.MistralConfig, **DECODER_COMMON, intermediate_size=64, num_key_value_heads=2,
        sliding_window=None, use_cache=cache,
    )),
    "qwen2": lambda cache: transformers.Qwen2ForCausalLM(tiny(
        transformers.Qwen2Config, **DECODER_COMMON, intermediate_size=64, num_key_value_heads=2, use_cache=cache,
    )),
    "phi": lambda cache: transformers.PhiForCausalLM(tiny(
        transformers.PhiConfig, **DECODER_COMMON, intermediate_size=64, partial_rotary_factor=0.5,
        use_cache=cache,
    )),
    "gemma": lambda cache: transformers.GemmaForCausalLM(tiny(
        transformers.GemmaConfig, **DECODER_COMMON, intermediate_size=64, num_key_value_heads=2, head_dim=8,
        use_cache=cache,
    )),
}
