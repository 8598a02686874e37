"""``F.affine_grid`` over dynamic spatial sizes, captured with the sizes kept symbolic.

A spatial transformer (``F.grid_sample(x, F.affine_grid(theta, x.size()))``) makes its sampling
grid from the image's sizes. torch's ``affine_grid_generator`` lays the grid's coordinates out
with ``torch.linspace(-a, a, steps=n)``, ``a = (n - 1) / n``: float endpoints computed from a
size, which torch.export can only trace by fixing the size to the example's. With a dynamic
height or width that is a ``DimSpecializedError`` (torch.onnx fixes the dims silently). While
dynexport captures, :func:`affine_grids_of_symbolic_sizes` makes ``torch.affine_grid_generator``
(which ``F.affine_grid`` calls) compute the same coordinates from ``arange``: coordinate ``i``
of ``n`` is ``(2i + 1 - n) / n``, or ``(2i - (n - 1)) / max(n - 1, 1)`` with
``align_corners=True`` (0 for a single point, as torch's), equal to linspace's up to float
rounding. Sizes that are all static run torch's own; the eager model is left as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

__all__ = ["affine_grids_of_symbolic_sizes"]


def _coordinates(size: int | torch.SymInt, align_corners: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The ``size`` coordinates torch's affine grid spaces evenly over [-1, 1]."""
    steps = torch.arange(size, dtype=dtype, device=device) * 2
    if align_corners:
        return (steps - (size - 1)) / torch.sym_max(size - 1, 1)
    return (steps + (1 - size)) / size


def _symbolic_affine_grid(theta: torch.Tensor, size: Sequence[int | torch.SymInt], align_corners: bool) -> torch.Tensor:
    """torch's ``affine_grid_generator(theta, size, align_corners)`` written with ``arange``:
    the base grid ``(*spatial, rank + 1)`` of x, y(, z) coordinates and ones, times ``theta``."""
    batch, spatial = size[0], list(size[2:])
    dtype = torch.float32 if theta.dtype in (torch.float16, torch.bfloat16) else theta.dtype
    ones = [1] * len(spatial)
    axes = []  # x runs along the last spatial dim, then y, then z
    for position in reversed(range(len(spatial))):
        shape = ones.copy()
        shape[position] = spatial[position]
        axes.append(_coordinates(spatial[position], align_corners, dtype, theta.device).view(*shape, 1))
    axes.append(torch.ones([*ones, 1], dtype=dtype, device=theta.device))
    base = torch.cat([axis.expand(*spatial, 1) for axis in axes], dim=-1)
    points = len(spatial) + 1
    grid = (base.view(-1, points, 1) * theta.to(dtype).mT.unsqueeze(1)).sum(-2)
    return grid.view(batch, *spatial, len(spatial)).to(theta.dtype)


@contextlib.contextmanager
def affine_grids_of_symbolic_sizes() -> Iterator[None]:
    """Within the block, ``torch.affine_grid_generator`` of a symbolic spatial size is computed
    from ``arange`` (module doc); every other call runs torch's own."""
    original = torch.affine_grid_generator

    def affine_grid_generator(theta: torch.Tensor, size: Sequence[int | torch.SymInt], align_corners: bool) -> torch.Tensor:
        if len(size) in (4, 5) and any(isinstance(side, torch.SymInt) for side in size[2:]):
            return _symbolic_affine_grid(theta, size, align_corners)
        return original(theta, size, align_corners)

    torch.affine_grid_generator = affine_grid_generator
    try:
        yield
    finally:
        torch.affine_grid_generator = original
