"""Views of contiguous tensors captured without torch's reshape search over symbolic sizes.

To give ``x.view(shape)`` its strides, torch's fake kernel (``torch._refs._reshape_view_helper``)
walks the input's dims left to right, asking of each symbolic size whether it equals the next
target length or divides it (``accum % length != 0``), and splits or flattens dims accordingly.
Each question is a guard that torch simplifies with sympy; on the nested floor divisions and
remainders of a windowed model's sizes (Swin pads each stage's map to whole windows and halves it
at each merge, ``(((h//4) + (h//4) % 2 + 1)//2 + ...) // 4``) one view took up to 13 s, and the
capture of a tiny Swin with dynamic sides 101 s, where torch.onnx, which captures
size-obliviously, took 22 s.

A view of a contiguous tensor needs none of it: whatever the target shape, the result is
contiguous with that shape's strides, provided the element counts match. Within
:func:`contiguous_views_direct`, a view (``aten.view``, ``aten._unsafe_view``) is given exactly
that when torch can prove, without adding a guard, that its input is contiguous and that the
target (its -1 inferred by an exact division) has the input's element count; any other view runs
torch's own kernel, guards and all. Where the counts agree only under a condition (``h % 4 == 0``
for ``x.view(b, h // 4, 4)``) torch's guards are what dynexport turns into a refined dim
(``h = 4*_h``) or a refusal, so those views keep them. The graph is the same computation, without
the search's guards; the tiny Swin captures in 11–20 s.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Iterator
from typing import Any

import torch
from torch._prims_common import extract_shape_from_varargs, is_contiguous_or_false, make_contiguous_strides_for
from torch._subclasses import fake_impls
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["contiguous_views_direct"]

_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _statically_inferred(shape: Any, numel: Any) -> list[Any] | None:
    """``shape`` with its -1 length (if any) inferred, where the division is exact for every size
    the shape environment allows; None where it may not be (torch's kernel then guards it)."""
    target = list(extract_shape_from_varargs(shape, validate=False))
    # compared as Python ints: a symbolic length compared with -1 would be a question to torch
    inferred = [axis for axis, length in enumerate(target) if type(length) is int and length == -1]
    if len(inferred) > 1:
        return None
    if inferred:
        known = functools.reduce(operator.mul, (length for axis, length in enumerate(target) if axis not in inferred), 1)
        if not (statically_known_true(known >= 1) and statically_known_true(numel % known == 0)):
            return None
        target[inferred[0]] = numel // known
    return target


def _direct_view(torch_view: Any) -> Any:
    """The fake kernel of a view: contiguous strides for a contiguous input whose element count
    is provably the target's, torch's ``torch_view`` for any other."""

    def view(fake_mode: Any, func: Any, a: torch.Tensor, *shape: Any, **kwargs: Any) -> torch.Tensor:
        target = _statically_inferred(shape, a.numel()) if a.ndim else None
        if (
            not target
            or not statically_known_true(a.numel() == functools.reduce(operator.mul, target, 1))
            or not is_contiguous_or_false(a)
        ):
            return torch_view(fake_mode, func, a, *shape, **kwargs)
        return a.as_strided(target, make_contiguous_strides_for(target))

    return view


@contextlib.contextmanager
def contiguous_views_direct() -> Iterator[None]:
    """Within the block, fake tensors' views of contiguous inputs skip torch's reshape search
    (module doc)."""
    kernels = fake_impls.op_implementations_dict
    originals = {op: kernels[op] for op in _VIEWS}
    for op, original in originals.items():
        kernels[op] = _direct_view(original)
    try:
        yield
    finally:
        kernels.update(originals)
