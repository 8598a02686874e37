"""``max_pool1d`` over a dynamic length, captured with the length kept symbolic.

torch's ``aten::max_pool1d``, which ``F.max_pool1d`` and ``nn.MaxPool1d`` call when they return no
indices, is a C++ composite that reads the input's sizes as integers: torch.export fixes a
dynamic length to the example's (transformers' CANINE pools its character mask with
``nn.MaxPool1d``: ``DimSpecializedError: seq = 16``). While dynexport captures,
:func:`max_pool1d_of_symbolic_sizes` makes ``torch.max_pool1d`` of a symbolic size the values of
``torch.max_pool1d_with_indices``, whose shape function keeps sizes symbolic: the same windows
and maxima, the indices left unused. Static sizes run torch's own; the eager model is left as
it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["max_pool1d_of_symbolic_sizes"]


@contextlib.contextmanager
def max_pool1d_of_symbolic_sizes() -> Iterator[None]:
    """Within the block, ``torch.max_pool1d`` of a symbolic size is the values of
    ``torch.max_pool1d_with_indices`` (module doc); every other call runs torch's own."""
    original = torch.max_pool1d

    def max_pool1d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        if any(isinstance(size, torch.SymInt) for size in input.shape):
            return torch.max_pool1d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)[0]
        return original(input, kernel_size, stride, padding, dilation, ceil_mode)

    torch.max_pool1d = max_pool1d
    try:
        yield
    finally:
        torch.max_pool1d = original
