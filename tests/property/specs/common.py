"""What every family of property specs shares: :class:`OpSpec`, the input domains and
tolerances, and the samplers most specs are built from (``sample(draw, dtype) -> (tensors, args)``,
drawing from the strategies in :mod:`tests.property.strategies`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from tests.property.strategies import FLOATS, Domain, broadcast_shapes, dim, dim_lists, maybe, shapes, tensors

aten = torch.ops.aten
Sample = tuple[tuple[torch.Tensor, ...], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """How to test one operator.

    Attributes:
        name: the test id (the ATen overload, or what the call exercises).
        fn: ``fn(*tensors, **args)`` is the one-op model.
        sample: ``sample(draw, dtype) -> (tensors, args)`` draws one input set.
        dtypes: the dtypes of the main input to try.
        dynamic: rerun at grown sizes of the dynamic dims (dims of size >= 2 are exported dynamic).
        static: export with static shapes (the op refuses dynamic dims, e.g. squeeze's that may be 1).
        check_values: False for outputs whose values are unspecified (empty, random).
        tolerances: ``{dtype: (rtol, atol)}`` where the op's numerics need more than the default.
        xfail: ``{dtype or None: reason}``: known bugs (None: every dtype).
    """

    name: str
    fn: Callable[..., Any]
    sample: Callable[[Callable, torch.dtype], Sample]
    dtypes: tuple[torch.dtype, ...] = FLOATS
    dynamic: bool = True
    static: bool = False
    check_values: bool = True
    tolerances: dict[torch.dtype, tuple[float, float]] = dataclasses.field(default_factory=dict)
    xfail: dict[torch.dtype | None, str] = dataclasses.field(default_factory=dict)


# -- domains and tolerances -----------------------------------------------------------------

SPECIALS = Domain(specials=True)
NO_NAN = Domain(specials=True, nan=False)
LOW_PRECISION_SUM = {torch.float16: (2e-2, 2e-2), torch.bfloat16: (5e-2, 5e-2)}
F32 = (torch.float32,)


# -- samplers -------------------------------------------------------------------------------


def one(domain: Domain = SPECIALS, min_rank: int = 0, max_rank: int = 4, min_side: int = 0, **args: st.SearchStrategy):
    """One tensor (and ``args``, each drawn from its strategy)."""

    def sample(draw, dtype):
        shape = draw(shapes(min_rank=min_rank, max_rank=max_rank, min_side=min_side))
        x = draw(tensors(shape, dtype, domain))
        return (x,), {k: draw(v) for k, v in args.items()}

    return sample


def two(domain: Domain = SPECIALS, other: Domain | None = None, other_dtype: torch.dtype | None = None, **args):
    """Two tensors of broadcast-compatible shapes."""

    def sample(draw, dtype):
        a, b = draw(broadcast_shapes(2))
        x = draw(tensors(a, dtype, domain))
        y = draw(tensors(b, other_dtype or dtype, other or domain))
        return (x, y), {k: draw(v) for k, v in args.items()}

    return sample


def with_scalar(
    domain: Domain = SPECIALS,
    scalar: Callable[[torch.dtype], st.SearchStrategy] | None = None,
    name: str = "other",
    **args,
):
    """A tensor and a Python scalar (an int for integer and bool tensors, sometimes a float)."""

    def sample(draw, dtype):
        x = draw(tensors(draw(shapes()), dtype, domain))
        strategy = scalar(dtype) if scalar else scalar_operand(dtype)
        return (x,), {name: draw(strategy), **{k: draw(v) for k, v in args.items()}}

    return sample


def scalar_operand(dtype):
    """A Python scalar operand: an int, or a float (which promotes integer tensors)."""
    ints = st.integers(-5, 5)
    floats = st.floats(-5, 5).map(lambda v: round(v, 2))
    return ints if dtype is torch.bool else ints | floats


def reduce(domain: Domain = SPECIALS, dims: str = "list", keepdim: bool = True, min_side: int = 0, **extra):
    """A tensor and reduction dims: ``dims`` is "list" (dim=[...] or None), "optional" (None or
    one dim), "one" (one dim) or "none" (whole tensor)."""

    def sample(draw, dtype):
        shape = draw(shapes(min_side=min_side))
        x = draw(tensors(shape, dtype, domain))
        args = {k: draw(v) for k, v in extra.items()}
        if dims == "list":
            args["dim"] = draw(maybe(dim_lists(len(shape))))
        elif dims == "optional":
            args["dim"] = draw(maybe(dim(len(shape))))
        elif dims == "one":
            args["dim"] = draw(dim(len(shape)))
        if keepdim and dims != "none":
            args["keepdim"] = draw(st.booleans())
        return (x,), args

    return sample


def composite(fn):
    """A sampler written by hand: ``fn(draw, dtype) -> (tensors, args)``."""
    return fn


@composite
def like_input(draw, dtype):
    return (draw(tensors(draw(shapes()), dtype, Domain(-10, 10))),), {}


@composite
def distinct(draw, dtype, min_rank=0, min_side=0):
    """A tensor whose values are all different (sorts and arg-reductions: no ties)."""
    shape = draw(shapes(min_rank=min_rank, min_side=min_side))
    numel = math.prod(shape)
    values = draw(st.permutations(range(numel)))
    offset = -(numel // 2) if dtype.is_signed or dtype.is_floating_point else 0
    return torch.tensor([v + offset for v in values], dtype=torch.int64).reshape(shape).to(dtype)
