"""Property specs: views, reshapes, joins and splits (dynexport/ops/shape.py)."""

from __future__ import annotations

import math

import torch
from hypothesis import assume
from hypothesis import strategies as st

from tests.property.specs.common import SPECIALS, OpSpec, aten, composite, one
from tests.property.strategies import ALL, Domain, broadcast_shapes, dim, dim_lists, maybe, shapes, tensors


def _reshape_target(draw, shape):
    numel = math.prod(shape)
    merged = list(shape)
    while len(merged) > 1 and draw(st.booleans()):
        i = draw(st.integers(0, len(merged) - 2))
        merged[i : i + 2] = [merged[i] * merged[i + 1]]
    for _ in range(draw(st.integers(0, 2))):
        merged.insert(draw(st.integers(0, len(merged))), 1)
    if merged and numel > 0 and draw(st.booleans()):
        merged[draw(st.integers(0, len(merged) - 1))] = -1
    return merged


def _view(name: str):
    @composite
    def sample(draw, dtype):
        shape = draw(shapes())
        return (draw(tensors(shape, dtype, SPECIALS)),), {name: _reshape_target(draw, shape)}

    return sample


@composite
def _permute(draw, dtype):
    shape = draw(shapes())
    perm = draw(st.permutations(range(len(shape))))
    perm = [p - len(shape) if draw(st.booleans()) else p for p in perm]
    return (draw(tensors(shape, dtype, SPECIALS)),), {"dims": perm}


@composite
def _expand(draw, dtype):
    small, big = draw(broadcast_shapes(2))
    target = torch.broadcast_shapes(small, big)
    size = [
        (
            -1
            if draw(st.booleans()) and i >= len(target) - len(small) and small[i - len(target) + len(small)] == s
            else s
        )
        for i, s in enumerate(target)
    ]
    return (draw(tensors(small, dtype, SPECIALS)),), {"size": size}


@composite
def _transpose(draw, dtype):
    shape = draw(shapes(min_rank=1))
    return (draw(tensors(shape, dtype, SPECIALS)),), {"dim0": draw(dim(len(shape))), "dim1": draw(dim(len(shape)))}


@composite
def _unsqueeze(draw, dtype):
    shape = draw(shapes())
    return (draw(tensors(shape, dtype, SPECIALS)),), {"dim": draw(st.integers(-len(shape) - 1, len(shape)))}


@composite
def slice_sample(draw, dtype):
    shape = draw(shapes(min_rank=1))
    d = draw(dim(len(shape)))
    bound = st.integers(-7, 7)
    args = {"dim": d, "start": draw(maybe(bound)), "end": draw(maybe(bound)), "step": draw(st.integers(1, 3))}
    return (draw(tensors(shape, dtype, SPECIALS)),), args


@composite
def select_sample(draw, dtype):
    shape = draw(shapes(min_rank=1, min_side=1))
    d = draw(dim(len(shape)))
    size = shape[d]
    return (draw(tensors(shape, dtype, SPECIALS)),), {"dim": d, "index": draw(st.integers(-size, size - 1))}


@composite
def _narrow(draw, dtype):
    shape = draw(shapes(min_rank=1))
    d = draw(dim(len(shape)))
    start = draw(st.integers(0, shape[d]))
    return (draw(tensors(shape, dtype, SPECIALS)),), {
        "dim": d,
        "start": start,
        "length": draw(st.integers(0, shape[d] - start)),
    }


def _several(count_min=1, count_max=3, vary_dim=True):
    @composite
    def sample(draw, dtype):
        shape = draw(shapes(min_rank=1))
        d = draw(dim(len(shape)))
        count = draw(st.integers(count_min, count_max))
        xs = []
        for _ in range(count):
            s = list(shape)
            if vary_dim:
                s[d] = draw(st.integers(0, 3))
            xs.append(draw(tensors(s, dtype, SPECIALS)))
        return tuple(xs), {"dim": d}

    return sample


@composite
def _stack(draw, dtype):
    tensors_, args = _several(vary_dim=False)(draw, dtype)
    args["dim"] = draw(st.integers(-tensors_[0].dim() - 1, tensors_[0].dim()))
    return tensors_, args


@composite
def _split(draw, dtype):
    shape = draw(shapes(min_rank=1))
    d = draw(dim(len(shape)))
    return (draw(tensors(shape, dtype, SPECIALS)),), {"split_size": draw(st.integers(1, 4)), "dim": d}


@composite
def _as_strided(draw, dtype):
    shape = draw(shapes(min_rank=1, min_side=1))
    rank = draw(st.integers(0, 3))
    size = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    stride = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    offset = draw(st.integers(0, 3))
    # Every element read lies inside the input's storage (eager refuses others).
    assume(offset + sum((n - 1) * s for n, s in zip(size, stride) if n) < math.prod(shape))
    return (draw(tensors(shape, dtype, SPECIALS)),), {"size": size, "stride": stride, "storage_offset": offset}


@composite
def _split_with_sizes(draw, dtype):
    shape = draw(shapes(min_rank=1))
    d = draw(dim(len(shape)))
    sizes, left = [], shape[d]
    while left:
        sizes.append(draw(st.integers(0 if sizes else 1, left)))
        left -= sizes[-1]
    return (draw(tensors(shape, dtype, SPECIALS)),), {"split_sizes": sizes or [0], "dim": d}


@composite
def _flatten(draw, dtype):
    shape = draw(shapes())
    rank = max(len(shape), 1)
    start = draw(st.integers(0, rank - 1))
    end = draw(st.integers(start, rank - 1))
    negate = draw(st.booleans())
    return (draw(tensors(shape, dtype, SPECIALS)),), {
        "start_dim": start - rank if negate else start,
        "end_dim": end - rank if negate else end,
    }


@composite
def _to_copy(draw, dtype):
    x = draw(tensors(draw(shapes()), dtype, Domain(-100, 100)))
    return (x,), {"dtype": draw(st.sampled_from(ALL))}


@composite
def _squeeze_dims(draw, dtype):
    shape = draw(shapes(max_side=2))
    return (draw(tensors(shape, dtype, SPECIALS)),), {"dim": draw(dim_lists(len(shape), min_size=0))}


@composite
def _copy(draw, dtype):
    a, b = draw(broadcast_shapes(2))
    target = torch.broadcast_shapes(a, b)
    return (draw(tensors(target, dtype, SPECIALS)), draw(tensors(b, draw(st.sampled_from(ALL)), Domain(-10, 10)))), {}


@composite
def _expand_as(draw, dtype):
    a, b = draw(broadcast_shapes(2))
    target = torch.broadcast_shapes(a, b)
    return (draw(tensors(a, dtype, SPECIALS)), draw(tensors(target, torch.float32, Domain(-1, 1)))), {}


SPECS: list[OpSpec] = [
    OpSpec("view.default", aten.view.default, _view("size"), ALL, dynamic=False),
    OpSpec("reshape.default", aten.reshape.default, _view("shape"), ALL, dynamic=False),
    OpSpec("permute.default", aten.permute.default, _permute, ALL),
    OpSpec("expand.default", aten.expand.default, _expand, ALL, dynamic=False),
    OpSpec("transpose.int", aten.transpose.int, _transpose, ALL),
    OpSpec("t.default", aten.t.default, one(SPECIALS, max_rank=2), ALL),
    OpSpec("unsqueeze.default", aten.unsqueeze.default, _unsqueeze, ALL),
    OpSpec("squeeze.dim", aten.squeeze.dim, one(SPECIALS, min_rank=1, dim=st.integers(-1, 0)), ALL, static=True),
    OpSpec("squeeze.dims", aten.squeeze.dims, _squeeze_dims, ALL, static=True),
    OpSpec("squeeze.default", aten.squeeze.default, one(SPECIALS), ALL, static=True),
    OpSpec("flatten.using_ints", aten.flatten.using_ints, _flatten, ALL),
    OpSpec("slice.Tensor", aten.slice.Tensor, slice_sample, ALL),
    OpSpec("narrow.default", aten.narrow.default, _narrow, ALL, dynamic=False),
    OpSpec("as_strided.default", aten.as_strided.default, _as_strided, ALL, dynamic=False),
    OpSpec("select.int", aten.select.int, select_sample, ALL),
    OpSpec("cat.default", lambda *xs, dim: aten.cat.default(list(xs), dim), _several(), ALL),
    OpSpec("stack.default", lambda *xs, dim: aten.stack.default(list(xs), dim), _stack, ALL),
    # Static: where the split dim is dynamic the number of pieces is decided at run time, which
    # dynexport refuses (tests/ops/test_shape.py tests the refusal and the dynamic cases it takes).
    OpSpec("split.Tensor", aten.split.Tensor, _split, ALL, static=True),
    OpSpec("split_with_sizes.default", aten.split_with_sizes.default, _split_with_sizes, ALL, dynamic=False),
    OpSpec(
        "unbind.int", aten.unbind.int, one(SPECIALS, min_rank=1, min_side=1, dim=st.integers(-1, 0)), ALL, dynamic=False
    ),
    OpSpec("clone.default", aten.clone.default, one(SPECIALS), ALL),
    OpSpec("alias.default", aten.alias.default, one(SPECIALS), ALL),
    OpSpec("_to_copy.default", aten._to_copy.default, _to_copy, ALL),
    OpSpec("copy.default", lambda x, y: aten.copy.default(x, y), _copy, ALL),
    OpSpec("expand_as.default", aten.expand_as.default, _expand_as, ALL),
]
