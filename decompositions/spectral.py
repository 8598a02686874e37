"""torch.fft's functions over symbolic sizes.

torch decomposes ``aten.fft_fft``, ``fft_rfftn``, ``fft_irfft2``, ... with their C++ kernels,
which read the input's sizes as ints (``input.sizes()``): traced on the program's fake tensors
that fixes every dynamic dim of the program to its example's size (FNet's ``fftn`` over the
sequence and hidden dims fixed the batch and the sequence). Written here as torch's kernels
compute them (aten/src/ATen/native/SpectralOps.cpp), over sizes as they are: the transforms are
the operators the translation table has rules for (``_fft_r2c``, ``_fft_c2c``, ``_fft_c2r``), and
a length ``n`` or shape ``s`` cuts the input or pads it with zeros at the end of each dim, as
torch does, by amounts that may be symbolic.

Tracing them needs :func:`fft_shapes_from_sizes` too: the fake kernels of those three operators
(``torch._meta_registrations._exec_fft``) sort the batch dims by the input's strides read as
ints, which fixes the sizes the strides are made of as surely.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._prims_common import corresponding_complex_dtype, corresponding_real_dtype
from torch._subclasses import fake_impls
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["SPECTRAL_DECOMPOSITIONS", "fft_shapes_from_sizes"]

aten = torch.ops.aten


def _normalization(norm: str | None, forward: bool) -> int:
    """torch's ``fft_norm_mode`` for ``norm`` in a transform of that direction: 0 none, 1 by the
    square root of the signal size, 2 by the signal size."""
    if norm is None or norm == "backward":
        return 0 if forward else 2
    if norm == "forward":
        return 2 if forward else 0
    if norm == "ortho":
        return 1
    raise ValueError(f"Invalid normalization mode: {norm!r}")


def _floating(x: torch.Tensor) -> torch.Tensor:
    """Integer and bool inputs are transformed in the default float dtype."""
    return x if x.is_floating_point() or x.is_complex() else x.to(torch.get_default_dtype())


def _complex(x: torch.Tensor) -> torch.Tensor:
    x = _floating(x)
    return x if x.is_complex() else x.to(corresponding_complex_dtype(x.dtype))


def _resized(x: torch.Tensor, dims: Sequence[int], sizes: Sequence[Any]) -> torch.Tensor:
    """``x`` cut to ``sizes`` along ``dims``, or padded with zeros at their end."""
    for dim, size in zip(dims, sizes):
        length = x.shape[dim]
        if statically_known_true(length == size):
            continue
        if not statically_known_true(length >= size):
            missing = list(x.shape)
            missing[dim] = torch.sym_max(0, size - length)
            x = torch.cat([x, x.new_zeros(missing)], dim)
        if not statically_known_true(length <= size):
            x = x.narrow(dim, 0, size)
    return x


def _shape_and_dims(
    x: torch.Tensor, s: Sequence[Any] | None, dim: Sequence[int] | None
) -> tuple[list[int], list[Any]]:
    """The dims an n-dimensional transform spans and their signal sizes (torch's
    ``canonicalize_fft_shape_and_dim_args``): ``dim``, else the last ``len(s)`` dims, else all;
    ``s``, -1 meaning the input's size, else the input's sizes."""
    if dim is not None:
        dims = [d % x.ndim for d in dim]
    elif s is not None:
        dims = list(range(x.ndim - len(s), x.ndim))
    else:
        dims = list(range(x.ndim))
    if s is None:
        return dims, [x.shape[d] for d in dims]
    return dims, [x.shape[d] if isinstance(n, int) and n == -1 else n for d, n in zip(dims, s)]


def _c2c(x, dims, sizes, norm, forward):
    x = _resized(_complex(x), dims, sizes)
    return aten._fft_c2c(x, dims, _normalization(norm, forward), forward)


def _r2c(x, dims, sizes, norm, forward, onesided):
    x = _resized(_floating(x), dims, sizes)
    transformed = aten._fft_r2c(x, dims, _normalization(norm, forward), onesided)
    return transformed if forward else torch.conj(transformed)


def _c2r(x, dims, sizes, last_size, norm, forward):
    """The real signal of ``last_size`` points along the last dim whose one-sided spectrum
    ``x`` is (its first ``last_size // 2 + 1`` bins)."""
    x = _resized(_complex(x), dims, [*sizes[:-1], last_size // 2 + 1])
    if forward:
        x = torch.conj(x)
    return aten._fft_c2r(x, dims, _normalization(norm, forward), last_size)


def _one_dim(x, n, dim) -> tuple[list[int], list[Any]]:
    dim = dim % x.ndim
    return [dim], [x.shape[dim] if n is None else n]


def fft(x, n=None, dim=-1, norm=None):
    dims, sizes = _one_dim(x, n, dim)
    if x.is_complex():
        return _c2c(x, dims, sizes, norm, True)
    return _r2c(x, dims, sizes, norm, True, False)


def ifft(x, n=None, dim=-1, norm=None):
    dims, sizes = _one_dim(x, n, dim)
    if x.is_complex():
        return _c2c(x, dims, sizes, norm, False)
    return _r2c(x, dims, sizes, norm, False, False)


def rfft(x, n=None, dim=-1, norm=None):
    return _r2c(x, *_one_dim(x, n, dim), norm, True, True)


def ihfft(x, n=None, dim=-1, norm=None):
    return _r2c(x, *_one_dim(x, n, dim), norm, False, True)


def irfft(x, n=None, dim=-1, norm=None):
    dims, sizes = _one_dim(x, None, dim)
    return _c2r(x, dims, sizes, 2 * (sizes[0] - 1) if n is None else n, norm, False)


def hfft(x, n=None, dim=-1, norm=None):
    dims, sizes = _one_dim(x, None, dim)
    return _c2r(x, dims, sizes, 2 * (sizes[0] - 1) if n is None else n, norm, True)


def fftn(x, s=None, dim=None, norm=None):
    return _c2c(x, *_shape_and_dims(x, s, dim), norm, True)


def ifftn(x, s=None, dim=None, norm=None):
    return _c2c(x, *_shape_and_dims(x, s, dim), norm, False)


def rfftn(x, s=None, dim=None, norm=None):
    return _r2c(x, *_shape_and_dims(x, s, dim), norm, True, True)


def irfftn(x, s=None, dim=None, norm=None):
    dims, sizes = _shape_and_dims(x, s, dim)
    given = s is not None and not (isinstance(s[-1], int) and s[-1] == -1)
    return _c2r(x, dims, sizes, sizes[-1] if given else 2 * (x.shape[dims[-1]] - 1), norm, False)


def _two_dims(transform: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def two_dim_transform(x, s=None, dim=(-2, -1), norm=None):
        return transform(x, s, dim, norm)

    return two_dim_transform


SPECTRAL_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    aten.fft_fft.default: fft,
    aten.fft_ifft.default: ifft,
    aten.fft_rfft.default: rfft,
    aten.fft_irfft.default: irfft,
    aten.fft_hfft.default: hfft,
    aten.fft_ihfft.default: ihfft,
    aten.fft_fftn.default: fftn,
    aten.fft_ifftn.default: ifftn,
    aten.fft_rfftn.default: rfftn,
    aten.fft_irfftn.default: irfftn,
    aten.fft_fft2.default: _two_dims(fftn),
    aten.fft_ifft2.default: _two_dims(ifftn),
    aten.fft_rfft2.default: _two_dims(rfftn),
    aten.fft_irfft2.default: _two_dims(irfftn),
}


# -- fake kernels ------------------------------------------------------------------------------


def _fake_c2c(fake_mode, func, x, dim, normalization, forward):
    return x.new_empty(x.shape)


def _fake_r2c(fake_mode, func, x, dim, normalization, onesided):
    shape = list(x.shape)
    if onesided:
        shape[dim[-1]] = shape[dim[-1]] // 2 + 1
    return x.new_empty(shape, dtype=corresponding_complex_dtype(x.dtype))


def _fake_c2r(fake_mode, func, x, dim, normalization, last_dim_size):
    shape = list(x.shape)
    shape[dim[-1]] = last_dim_size
    return x.new_empty(shape, dtype=corresponding_real_dtype(x.dtype))


_FAKE_KERNELS = {
    aten._fft_c2c.default: _fake_c2c,
    aten._fft_r2c.default: _fake_r2c,
    aten._fft_c2r.default: _fake_c2r,
}


@contextlib.contextmanager
def fft_shapes_from_sizes() -> Iterator[None]:
    """Within the block, fake tensors' FFTs give their results' shapes from the input's sizes
    (contiguous, which the translation does not read), not from its strides read as ints."""
    kernels = fake_impls.op_implementations_dict
    originals = {op: kernels.get(op) for op in _FAKE_KERNELS}
    kernels.update(_FAKE_KERNELS)
    try:
        yield
    finally:
        for op, original in originals.items():
            if original is None:
                del kernels[op]
            else:
                kernels[op] = original
