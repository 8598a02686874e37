"""The one place for the hypothesis strategies the property tests draw from.

Shapes (0-d, size-1 broadcast dims, empty tensors, rank up to 6), broadcast-compatible shape
tuples, dtypes, tensor values in a :class:`Domain` (negatives, zeros, inf/nan where the op
defines them) and operator arguments (negative dims, keepdim, optional arguments present or
absent).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

__all__ = [
    "ALL",
    "BOOL",
    "Domain",
    "FLOATS",
    "INTS",
    "NUMERIC",
    "SIGNED",
    "broadcast_shapes",
    "dim",
    "dim_lists",
    "dtypes",
    "maybe",
    "shapes",
    "tensors",
]

FLOATS: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SIGNED: tuple[torch.dtype, ...] = (torch.int8, torch.int16, torch.int32, torch.int64)
INTS: tuple[torch.dtype, ...] = (*SIGNED, torch.uint8)
BOOL: tuple[torch.dtype, ...] = (torch.bool,)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + BOOL

# Elements per tensor stay small: every example is exported and run, and hypothesis draws each
# element, so rank 6 comes with sides of at most 2.
_MAX_SIDE_BY_RANK = {0: 1, 1: 5, 2: 4, 3: 4, 4: 3, 5: 2, 6: 2}


def _max_side(rank: int, max_side: int) -> int:
    return min(max_side, _MAX_SIDE_BY_RANK.get(rank, 2))


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 4, min_side: int = 0, max_side: int = 5) -> tuple[int, ...]:
    """A shape: 0-d, size-1 and size-0 dims included (unless ``min_side`` says otherwise)."""
    rank = draw(st.integers(min_rank, max_rank))
    side = max(min_side, _max_side(rank, max_side))
    return tuple(draw(st.lists(st.integers(min_side, side), min_size=rank, max_size=rank)))


@st.composite
def broadcast_shapes(draw, num: int = 2, min_rank: int = 0, max_rank: int = 4, min_side: int = 0, max_side: int = 4) -> tuple[tuple[int, ...], ...]:
    """``num`` shapes that broadcast together (size-1 dims and lower ranks included)."""
    base = draw(shapes(min_rank=min_rank, max_rank=max_rank, min_side=min_side, max_side=max_side))
    result = draw(
        hnp.mutually_broadcastable_shapes(
            num_shapes=num,
            base_shape=base,
            min_dims=min_rank,
            max_dims=max(len(base), min_rank),
            min_side=min_side,
            max_side=max(min_side, _max_side(len(base), max_side)),
        )
    )
    return result.input_shapes


def dtypes(allowed: Sequence[torch.dtype]) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from(tuple(allowed))


def dim(rank: int) -> st.SearchStrategy[int]:
    """A dim of a tensor of ``rank``, negative or not (a 0-d tensor takes -1 and 0)."""
    rank = max(rank, 1)
    return st.integers(-rank, rank - 1)


@st.composite
def dim_lists(draw, rank: int, min_size: int = 1) -> list[int]:
    """Distinct dims of a tensor of ``rank`` (each possibly negative)."""
    if rank == 0:
        return draw(st.sampled_from([[0], [-1]])) if min_size else []
    chosen = draw(st.lists(st.integers(0, rank - 1), min_size=min(min_size, rank), max_size=rank, unique=True))
    return [d - rank if draw(st.booleans()) else d for d in chosen]


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """An optional argument: absent (None) or drawn from ``strategy``."""
    return st.none() | strategy


@dataclasses.dataclass(frozen=True)
class Domain:
    """Where an input's values lie.

    ``specials`` adds inf, -inf, -0.0 and (with ``nan``) nan to floats, for ops that define
    them; ``exclude_zero`` keeps zero out (divisors); ``integral`` draws whole numbers even for
    floats; ``fill`` makes every element that one value.
    """

    low: float = -10.0
    high: float = 10.0
    specials: bool = False
    exclude_zero: bool = False
    integral: bool = False
    nan: bool = True
    fill: float | None = None

    def clip(self, dtype: torch.dtype) -> tuple[float, float]:
        if dtype.is_floating_point:
            return self.low, self.high
        info = torch.iinfo(dtype)
        return max(math.ceil(self.low), info.min), min(math.floor(self.high), info.max)


_NUMPY = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.bfloat16: np.float32,  # drawn as float32, rounded to bfloat16 afterwards
    torch.float64: np.float64,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def _elements(dtype: torch.dtype, domain: Domain) -> st.SearchStrategy:
    if domain.fill is not None:
        return st.just(domain.fill)
    if dtype is torch.bool:
        return st.booleans()
    low, high = domain.clip(dtype)
    if not dtype.is_floating_point or domain.integral:
        values = st.integers(math.ceil(low), math.floor(high))
        if domain.exclude_zero:
            values = values.filter(lambda v: v != 0)
        return values.map(float) if dtype.is_floating_point else values
    width = {torch.float16: 16, torch.float64: 64}.get(dtype, 32)
    low, high = _inward(low, width, up=True), _inward(high, width, up=False)
    values = st.floats(low, high, width=width, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    if domain.exclude_zero:
        values = values.filter(lambda v: abs(v) >= 1e-2)
    if domain.specials:
        specials = [math.inf, -math.inf, *([] if domain.exclude_zero else [-0.0]), *([math.nan] if domain.nan else [])]
        values = values | st.sampled_from(specials)
    return values


def _inward(bound: float, width: int, up: bool) -> float:
    """``bound`` rounded to a float of ``width`` bits, inside the interval."""
    kind = {16: np.float16, 32: np.float32, 64: np.float64}[width]
    rounded = kind(bound)
    if up and float(rounded) < bound:
        rounded = np.nextafter(rounded, kind(np.inf))
    if not up and float(rounded) > bound:
        rounded = np.nextafter(rounded, kind(-np.inf))
    return float(rounded)


@st.composite
def tensors(draw, shape: Sequence[int], dtype: torch.dtype, domain: Domain = Domain()) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` with values in ``domain``."""
    array = draw(hnp.arrays(_NUMPY[dtype], tuple(shape), elements=_elements(dtype, domain)))
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if dtype is torch.bfloat16:
        tensor = tensor.to(torch.bfloat16)
        if domain.exclude_zero:
            tensor = torch.where(tensor == 0, torch.ones((), dtype=tensor.dtype), tensor)
    return tensor
