"""Grouped-query attention captured as one ``scaled_dot_product_attention(enable_gqa=True)``.

transformers' SDPA integration (``transformers.integrations.sdpa_attention``) repeats the key
and value heads of a grouped-query model (``repeat_kv``: an expand and a reshape each, on
symbolic shapes) before calling SDPA, unless ``use_gqa_in_sdpa`` says the kernel takes the
groups itself, which it says on CPU only without a mask. Both compute the same attention: SDPA's
``enable_gqa`` repeats each key-value head over its group of query heads exactly as ``repeat_kv``
does. While dynexport captures, :func:`grouped_attention_whole` makes that function answer yes:
tracing the 30 layers of a LLaMA-shaped decoder with 3 key-value heads for 9 query heads then
takes about a third less time (``repeat_kv``'s symbolic reshapes were the costliest ops traced),
and the graph is the same or one node smaller (the opset-23 attention fusion reads both forms).
The eager model, outside capture, is left as it is.

The same integration decides causality as ``q_length > 1 and attention_mask is None and
is_causal``; where the example's new tokens are one (a decode step) and the sizes are reasoned
about size-obliviously, Python's ``and`` hands SDPA the false ``SymBool`` itself, which SDPA
refuses with a ``TypeError``. :func:`causality_decided` makes SDPA take it as the bool it was
decided to be (the guard on the new tokens is recorded as for any branch), so that the export
reports the dim the model fixes instead of the ``TypeError``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator

import torch

__all__ = ["causality_decided", "grouped_attention_whole"]

_SDPA_INTEGRATION = "transformers.integrations.sdpa_attention"


def _groups_in_sdpa(attention_mask: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor) -> bool:
    return True


@contextlib.contextmanager
def grouped_attention_whole() -> Iterator[None]:
    """Within the block, transformers' SDPA attention (when imported) passes grouped key-value
    heads to SDPA with ``enable_gqa=True`` instead of repeating them first (module doc)."""
    module = sys.modules.get(_SDPA_INTEGRATION)
    original = getattr(module, "use_gqa_in_sdpa", None)
    if original is None:
        yield
        return
    module.use_gqa_in_sdpa = _groups_in_sdpa
    try:
        yield
    finally:
        module.use_gqa_in_sdpa = original


@contextlib.contextmanager
def causality_decided() -> Iterator[None]:
    """Within the block, ``torch.nn.functional.scaled_dot_product_attention`` takes a ``SymBool``
    ``is_causal`` as the bool it evaluates to (module doc)."""
    original = torch.nn.functional.scaled_dot_product_attention

    @functools.wraps(original)
    def attention(*args, **kwargs):
        if len(args) > 5 and isinstance(args[5], torch.SymBool):
            args = (*args[:5], bool(args[5]), *args[6:])
        if isinstance(kwargs.get("is_causal"), torch.SymBool):
            kwargs["is_causal"] = bool(kwargs["is_causal"])
        return original(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
