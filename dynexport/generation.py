"""Greedy generation over an exported language model, as ``model.generate(do_sample=False)``.

The program is an export of the model's forward called with keyword arguments, the way
``generate`` calls it:

- a decoder: ``input_ids``, optionally ``attention_mask`` and ``position_ids``, and a
  ``DynamicCache`` (under the forward's own name for it, ``cache`` or ``past_key_values``) whose
  past length is dynamic down to 0, so that one graph runs the prompt (an empty cache) and every
  step after it (the cache it returned);
- an encoder-decoder (``input_ids`` or ``input_features``, ``attention_mask``,
  ``decoder_input_ids``) with an ``EncoderDecoderCache``: two programs, since transformers
  decides in Python whether the cross-attention keys and values are computed (the first step,
  an empty cache: ``prompt_program``) or read from the cache (every later step: ``program``);
- any model exported without a cache: every step runs the whole sequence so far.

A decoder whose program takes one token at a time (a linear-attention model's step: Qwen3-Next
loops over chunks of its prompt in Python, so only ``seq`` 1 exports) runs the prompt token by
token from zero states; a padded prompt is refused there, since transformers masks padding out of
the recurrent state only in forwards of several tokens.

Other keyword arguments of the export call that were baked in as constants (``use_cache=True``)
are passed again as they were. Position ids follow ``generate``: the count of attended tokens
before each one (0 at padding), so left-padded rows decode as if unpadded.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import ConstantArgument

from dynexport.call_convention import placeholders, user_input_specs
from dynexport.model_caches import caches_flattened, is_cache

__all__ = ["greedy_generate"]

_CACHE_ARGUMENTS = ("cache", "past_key_values")
_ENCODER_INPUTS = ("input_ids", "input_features")


def greedy_generate(
    program: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    decoder_start_token_id: int | None = None,
    prompt_program: Any = None,
) -> torch.Tensor:
    """Generate ``max_new_tokens`` tokens greedily with an exported model (module doc).

    Args:
        program: an :class:`~dynexport.ONNXProgram` exported from the model's forward.
        input_ids: the prompts, ``[batch, length]`` (left-padded where ``attention_mask`` is 0);
            for an encoder-decoder, the encoder's input (token ids or audio features).
        attention_mask: 1 for tokens, 0 for padding; None: all ones.
        max_new_tokens: how many tokens to generate at most.
        eos_token_id: the token(s) that end a sequence; a finished row gets ``pad_token_id``
            until every row has finished or ``max_new_tokens`` are generated.
        pad_token_id: the token after a sequence ended (default: the first ``eos_token_id``).
        decoder_start_token_id: an encoder-decoder's first decoder token.
        prompt_program: the program of the first step, when ``program`` cannot run it: an
            encoder-decoder whose ``program`` takes a filled ``EncoderDecoderCache`` starts with
            the model exported with an empty one (``EncoderDecoderCache(DynamicCache(),
            DynamicCache())``), which fills the cross-attention keys and values.

    Returns:
        For a decoder, the prompts followed by the generated tokens; for an encoder-decoder,
        the decoder's tokens from ``decoder_start_token_id`` on: what ``generate`` returns,
        on the device of ``input_ids``.

    Raises:
        ValueError: the program takes arguments this loop cannot give, a needed token id or
            the prompt program is missing, or a program of one token at a time is given
            padded prompts.
        TypeError: the program takes a cache other than a DynamicCache or EncoderDecoderCache.
    """
    call = _CallConvention.of(program)
    first_call = _CallConvention.of(prompt_program) if prompt_program is not None else call
    if call.cache_kind == "EncoderDecoderCache" and prompt_program is None:
        raise ValueError(
            "the program reads the cross-attention cache an EncoderDecoderCache holds; the first step fills it: "
            "pass prompt_program=, the model exported with EncoderDecoderCache(DynamicCache(), DynamicCache())"
        )
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    if eos and pad_token_id is None:
        pad_token_id = eos[0]
    # onnxruntime returns CPU tensors; the tokens go back to the prompts' device.
    device, input_ids = input_ids.device, input_ids.cpu()
    batch = input_ids.shape[0]
    if attention_mask is None:
        attention_mask = torch.ones(input_ids.shape[:2], dtype=torch.int64)
    attention_mask = attention_mask.cpu()
    if call.encoder_input is not None:
        if decoder_start_token_id is None:
            raise ValueError("an encoder-decoder needs decoder_start_token_id (the model's config holds it)")
        tokens = torch.full((batch, 1), decoder_start_token_id, dtype=torch.int64)
    else:
        tokens = input_ids
    unfinished = torch.ones(batch, dtype=torch.bool)
    cache = first_call.empty_cache(batch)
    if first_call.one_token and first_call.cache_kind is not None and call.encoder_input is None:
        cache = _prompt_token_by_token(prompt_program or program, first_call, tokens, attention_mask, cache)
    for step in range(max_new_tokens):
        step_call, step_program = (first_call, prompt_program or program) if step == 0 else (call, program)
        whole = step == 0 and not step_call.one_token
        new_tokens = tokens if whole or step_call.cache_kind is None else tokens[:, -1:]
        result = step_program(**step_call.arguments(input_ids, attention_mask, tokens, new_tokens, cache))
        logits, cache = _logits_and_cache(result, cached=step_call.cache_kind is not None)
        next_tokens = logits[:, -1].argmax(-1)
        if eos:
            next_tokens = torch.where(unfinished, next_tokens, torch.tensor(pad_token_id))
            unfinished &= ~torch.isin(next_tokens, torch.tensor(eos))
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=-1)
        if call.encoder_input is None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, 1)], dim=-1)
        if not unfinished.any():
            break
    return tokens.to(device)


class _CallConvention:
    """Which keyword arguments an exported forward takes, and how each step fills them."""

    def __init__(self, names: list[str], baked: dict[str, Any], cache_argument: str | None,
                 cache_kind: str | None, cache_spec: pytree.TreeSpec | None, cache_leaves: list[tuple],
                 one_token: bool = False):
        self.names = names
        self.one_token = one_token  # input_ids is [batch, 1]
        self.baked = baked
        self.cache_argument = cache_argument
        self.cache_kind = cache_kind  # the class name of the cache the program takes
        self.cache_spec = cache_spec  # a DynamicCache's, with its layers' kinds (full attention, sliding window)
        self.cache_leaves = cache_leaves  # a DynamicCache's (size past batch, dtype) per tensor at past 0
        self.encoder_input = next((n for n in _ENCODER_INPUTS if n in names), None) if "decoder_input_ids" in names else None

    @classmethod
    def of(cls, program: Any) -> _CallConvention:
        exported = program.exported_program
        if exported is None:
            raise ValueError("greedy_generate needs a program exported from a model (its exported_program is None)")
        in_spec = exported.call_spec.in_spec
        if in_spec.child(0).num_leaves:
            raise ValueError("greedy_generate calls the model with keyword arguments only: export it with args=() and kwargs=")
        kwargs_spec = in_spec.child(1)
        names = list(kwargs_spec.context)
        specs = user_input_specs(exported)
        nodes = placeholders(exported)
        baked: dict[str, Any] = {}
        cache_argument, cache_kind, cache_spec, cache_leaves = None, None, None, []
        one_token = False
        position = 0
        for name, child in zip(names, kwargs_spec.children()):
            leaf_specs = specs[position:position + child.num_leaves]
            position += child.num_leaves
            if name in _CACHE_ARGUMENTS and child.type is not type(None):
                cache_argument, cache_kind = name, getattr(child.type, "__name__", None)
                if cache_kind == "DynamicCache":
                    cache_spec = child
                    attention = sum(part.num_leaves for part in child.children()[:2])  # keys and values first
                    cache_leaves = _cache_leaves([nodes[s.arg.name].meta.get("val") for s in leaf_specs], attention)
                elif cache_kind != "EncoderDecoderCache":
                    raise TypeError(
                        f"greedy_generate feeds {name!r} a DynamicCache (an EncoderDecoderCache for an "
                        f"encoder-decoder); the program was exported with a {cache_kind}"
                    )
            elif name == "input_ids" and child.num_leaves == 1 and not isinstance(leaf_specs[0].arg, ConstantArgument):
                ids = nodes[leaf_specs[0].arg.name].meta.get("val")
                one_token = ids is not None and ids.dim() == 2 and isinstance(ids.shape[1], int) and ids.shape[1] == 1
            elif child.num_leaves == 1 and isinstance(leaf_specs[0].arg, ConstantArgument):
                baked[name] = leaf_specs[0].arg.value
        known = {"input_ids", "attention_mask", "position_ids", "decoder_input_ids", *_ENCODER_INPUTS, *_CACHE_ARGUMENTS, *baked}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(
                f"greedy_generate gives input_ids, attention_mask, position_ids, decoder_input_ids and the cache; "
                f"the program also takes {unknown}"
            )
        return cls(names, baked, cache_argument, cache_kind, cache_spec, cache_leaves, one_token)

    def empty_cache(self, batch: int) -> Any:
        """The cache of the first step: a DynamicCache of past length 0, or an
        EncoderDecoderCache of two DynamicCaches that hold no layer yet."""
        if self.cache_kind is None:
            return None
        import transformers

        if self.cache_kind == "EncoderDecoderCache":
            return transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
        empty = [torch.zeros(batch, *size, dtype=dtype) for size, dtype in self.cache_leaves]
        with caches_flattened():
            return pytree.tree_unflatten(empty, self.cache_spec)

    def arguments(self, encoder_input: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, new_tokens: torch.Tensor, cache: Any) -> dict:
        """The keyword arguments of one step: the tokens the step reads (the new ones with a
        cache, else all), the mask over past and new tokens, their positions, the cache."""
        given: dict[str, Any] = dict(self.baked)
        if self.encoder_input is not None:
            given.update({self.encoder_input: encoder_input, "attention_mask": mask, "decoder_input_ids": new_tokens})
        else:
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            given.update({"input_ids": new_tokens, "attention_mask": mask, "position_ids": positions[:, -new_tokens.shape[1]:]})
        if self.cache_argument is not None:
            given[self.cache_argument] = cache
        return {name: given.get(name) for name in self.names}


def _prompt_token_by_token(program: Any, call: _CallConvention, tokens: torch.Tensor, mask: torch.Tensor, cache: Any) -> Any:
    """The cache after all but the last prompt token, fed one at a time to a program that takes
    one token (module doc)."""
    if not bool(mask.all()):
        raise ValueError(
            "the program takes one token at a time, so the prompt runs token by token, and a one-token forward does not "
            "mask padding out of a linear-attention or convolution state: pass prompts without padding"
        )
    for position in range(tokens.shape[1] - 1):
        result = program(**call.arguments(None, mask[:, :position + 1], tokens, tokens[:, position:position + 1], cache))
        cache = _logits_and_cache(result, cached=True)[1]
    return cache


def _cache_leaves(values: list[Any], attention: int) -> list[tuple]:
    """Each cache tensor's size past the batch when nothing was seen, and its dtype: the first
    ``attention`` (keys and values) hold 0 past tokens, the others (an LFM2 or Qwen3-Next layer's
    conv and recurrent states) are zeros of their static size, which a model reads as no past."""
    described = []
    for position, tensor in enumerate(values):
        size = list(tensor.shape[1:])
        if position < attention:
            size[1] = 0
        if not all(isinstance(s, int) for s in size):  # a symbolic size
            raise ValueError(  # noqa: TRY004
                f"the cache's sizes other than batch and past must be static; the program has {list(tensor.shape)}"
            )
        described.append((tuple(size), tensor.dtype))
    return described


def _logits_and_cache(result: Any, *, cached: bool) -> tuple[torch.Tensor, Any]:
    items = list(result.values()) if hasattr(result, "keys") else list(result) if isinstance(result, (tuple, list)) else [result]
    logits = result["logits"] if hasattr(result, "keys") and "logits" in result else next(
        item for item in items if isinstance(item, torch.Tensor)
    )
    cache = next((item for item in items if is_cache(item)), None)
    if cached and cache is None:
        raise ValueError("the program takes a cache but returns none: export the model with use_cache=True")
    return logits, cache
