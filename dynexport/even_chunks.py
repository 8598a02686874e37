"""``torch.chunk`` of a dynamic dim that is a multiple of the chunk count, captured as equal splits.

A model that runs two inputs through one network stacks them on the batch dim and takes them
apart again (``torch.chunk(torch.cat([a, b]), 2)``: RAFT's feature encoder, classifier-free
guidance, siamese networks). With one ``Dim`` for both batches, the stacked dim is ``2*batch``,
and torch's chunk computes its pieces as ``ceil(2*batch / ceil(2*batch / 2))``: a count torch
cannot prove is 2, so torch.export fixes ``batch`` to the example's size and the export fails.
The pieces are ``batch`` each at every size (an empty dim gives ``chunks`` empty pieces, as
chunk does). While dynexport captures, :func:`even_chunks_as_splits` makes ``torch.chunk`` and
``Tensor.chunk`` of a symbolic size whose expression is a multiple of ``chunks`` call
``torch.split`` with ``chunks`` sizes of ``size // chunks``: the same pieces, no guard. Any
other call runs the original; the eager model, outside capture, is left as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import sympy
import torch

__all__ = ["even_chunks_as_splits"]


def _even_piece(tensor: Any, chunks: Any, dim: Any) -> torch.SymInt | None:
    """``size // chunks`` when ``tensor``'s size along ``dim`` is symbolic and its expression a
    multiple of ``chunks``; None for every other call."""
    if not (isinstance(tensor, torch.Tensor) and type(chunks) is int and chunks > 1 and type(dim) is int):
        return None
    if not -tensor.dim() <= dim < tensor.dim():
        return None  # the original reports the bad dim (any dim of a 0-d tensor)
    size = tensor.shape[dim]
    if not isinstance(size, torch.SymInt) or sympy.Mod(size.node.expr, chunks) != 0:
        return None
    return size // chunks


def _evenly(original: Callable[..., tuple[torch.Tensor, ...]]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``original`` (``torch.chunk`` or ``Tensor.chunk``, whose self is its input) splitting a
    symbolic multiple of ``chunks`` into equal pieces."""

    def chunk(input: torch.Tensor, chunks: int, dim: int = 0) -> tuple[torch.Tensor, ...]:
        piece = _even_piece(input, chunks, dim)
        if piece is None:
            return original(input, chunks, dim)
        return torch.split(input, [piece] * chunks, dim)

    return chunk


@contextlib.contextmanager
def even_chunks_as_splits() -> Iterator[None]:
    """Within the block, ``torch.chunk`` and ``Tensor.chunk`` of a symbolic size that is a
    multiple of ``chunks`` split into equal pieces without a count guard (module doc)."""
    original_function, original_method = torch.chunk, torch.Tensor.chunk
    had_method = "chunk" in vars(torch.Tensor)
    torch.chunk, torch.Tensor.chunk = _evenly(original_function), _evenly(original_method)
    try:
        yield
    finally:
        torch.chunk = original_function
        if had_method:
            torch.Tensor.chunk = original_method
        else:
            del torch.Tensor.chunk
