"""Property specs: gathers, scatters, index and mask ops, and reorderings of elements (dynexport/ops/indexing.py)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from dynexport.options import DEFAULT_OPSET
from tests.equivalence import TESTED_OPSET
from tests.property.specs.common import F32, LOW_PRECISION_SUM, SPECIALS, OpSpec, aten, composite, scalar_operand
from tests.property.specs.shape import select_sample, slice_sample
from tests.property.strategies import (
    ALL,
    FLOATS,
    NUMERIC,
    Domain,
    broadcast_shapes,
    dim,
    dim_lists,
    maybe,
    shapes,
    tensors,
)


@composite
def _gather(draw, dtype):
    shape = draw(shapes(min_rank=1, min_side=1))
    d = draw(dim(len(shape)))
    index_shape = [
        draw(st.integers(0, s)) if i != d % len(shape) else draw(st.integers(0, 4)) for i, s in enumerate(shape)
    ]
    index = draw(tensors(index_shape, torch.int64, Domain(0, shape[d] - 1)))
    return (draw(tensors(shape, dtype, SPECIALS)), index), {"dim": d}


def _scatter(kind):
    @composite
    def sample(draw, dtype):
        shape = draw(shapes(min_rank=1, min_side=1, max_rank=3))
        rank = len(shape)
        d = draw(dim(rank))
        # Unique targets along dim: duplicates make plain scatter order-dependent.
        index_shape = [draw(st.integers(0, s)) for s in shape]
        per_column = index_shape[d]
        columns = math.prod(s for i, s in enumerate(index_shape) if i != d % rank)
        perms = [draw(st.permutations(range(shape[d])))[:per_column] for _ in range(columns)]
        index = torch.tensor(perms, dtype=torch.int64).reshape(
            *[s for i, s in enumerate(index_shape) if i != d % rank], per_column
        )
        index = index.movedim(-1, d % rank) if rank > 1 else index.reshape(index_shape)
        x = draw(tensors(shape, dtype, Domain(-10, 10)))
        if kind == "value":
            return (x, index.contiguous()), {"dim": d, "value": draw(scalar_operand(dtype))}
        src = draw(tensors(index_shape, dtype, Domain(-10, 10)))
        args = {"dim": d}
        if kind == "reduce":
            # Max and min scatters exist from opset 18 (refused below it: tests/ops/test_indexing.py).
            opset = TESTED_OPSET.get() or DEFAULT_OPSET
            args["reduce"] = draw(st.sampled_from(["sum", "prod", "amax", "amin"] if opset >= 18 else ["sum", "prod"]))
            args["include_self"] = True
        return (x, index.contiguous(), src), args

    return sample


@composite
def _scatter_add(draw, dtype):
    shape = draw(shapes(min_rank=1, min_side=1, max_rank=3))
    d = draw(dim(len(shape)))
    index_shape = [draw(st.integers(0, s)) for s in shape]
    index = draw(tensors(index_shape, torch.int64, Domain(0, shape[d] - 1)))
    return (draw(tensors(shape, dtype, Domain(-10, 10))), index, draw(tensors(index_shape, dtype, Domain(-10, 10)))), {
        "dim": d
    }


@composite
def _index_select(draw, dtype):
    shape = draw(shapes(min_rank=1, min_side=1))
    d = draw(dim(len(shape)))
    index = draw(tensors([draw(st.integers(0, 5))], torch.int64, Domain(0, shape[d] - 1)))
    return (draw(tensors(shape, dtype, SPECIALS)), index), {"dim": d}


@composite
def _index_tensor(draw, dtype):
    shape = draw(shapes(min_rank=1, min_side=1))
    index_shape = draw(shapes(max_rank=2, max_side=3))
    use = [draw(st.booleans()) for _ in shape]
    if not any(use):
        use[draw(st.integers(0, len(shape) - 1))] = True
    last = max(i for i, u in enumerate(use) if u)
    use = use[: last + 1]
    inputs = [draw(tensors(shape, dtype, SPECIALS))]
    for i, u in enumerate(use):
        if u:
            # Negative indices count from the end, as in Python.
            inputs.append(draw(tensors(index_shape, torch.int64, Domain(-shape[i], shape[i] - 1))))
    return tuple(inputs), {"pattern": tuple(use)}


def _index(x, *indices, pattern):
    it = iter(indices)
    return aten.index.Tensor(x, [next(it) if u else None for u in pattern])


@composite
def _index_put(draw, dtype):
    (x, *indices), args = _index_tensor(draw, dtype)
    accumulate = draw(st.booleans())
    index_shape = torch.broadcast_shapes(*(i.shape for i in indices))
    if not accumulate:
        # Duplicate targets make a plain index_put order-dependent: keep one index set.
        indices = [i.reshape(-1)[:1].reshape([1] * len(index_shape)) if i.numel() else i for i in indices]
        index_shape = torch.broadcast_shapes(*(i.shape for i in indices))
    sliced = [s for i, s in enumerate(x.shape) if i >= len(args["pattern"]) or not args["pattern"][i]]
    pattern = args["pattern"]
    first, last = pattern.index(True), len(pattern) - 1 - pattern[::-1].index(True)
    contiguous = all(pattern[first : last + 1])
    before = [s for i, s in enumerate(x.shape[:first]) if not pattern[i]] if contiguous else []
    after = (
        [
            s
            for i, s in enumerate(x.shape)
            if i > last or (i >= len(pattern)) or (i > first and not contiguous and not pattern[i])
        ]
        if contiguous
        else sliced
    )
    values_shape = [*before, *index_shape, *after] if contiguous else [*index_shape, *sliced]
    values_shape = values_shape[draw(st.integers(0, len(values_shape))) :]  # values broadcast
    values = draw(tensors(values_shape, dtype, Domain(-10, 10)))
    return (x, values, *indices), {"pattern": pattern, "accumulate": accumulate}


def _index_put_fn(x, values, *indices, pattern, accumulate):
    it = iter(indices)
    return aten.index_put.default(x, [next(it) if u else None for u in pattern], values, accumulate)


@composite
def _embedding(draw, dtype):
    weight = draw(tensors([draw(st.integers(1, 6)), draw(st.integers(0, 4))], dtype, SPECIALS))
    ids = draw(tensors(draw(shapes(max_rank=3)), torch.int64, Domain(0, weight.shape[0] - 1)))
    return (weight, ids), {}


@composite
def _masked_fill(draw, dtype):
    a, b = draw(broadcast_shapes(2))
    a = torch.broadcast_shapes(a, b)  # the mask broadcasts to self, not the other way
    return (draw(tensors(a, dtype, SPECIALS)), draw(tensors(b, torch.bool))), {"value": draw(scalar_operand(dtype))}


@composite
def _slice_scatter(draw, dtype):
    (x,), args = slice_sample(draw, dtype)
    src = torch.ops.aten.slice.Tensor(x, **args)
    return (x, draw(tensors(src.shape, dtype, Domain(-10, 10)))), args


@composite
def _select_scatter(draw, dtype):
    (x,), args = select_sample(draw, dtype)
    src = torch.select(x, args["dim"], args["index"])
    return (x, draw(tensors(src.shape, dtype, Domain(-10, 10)))), args


@composite
def _repeat(draw, dtype):
    shape = draw(shapes(max_rank=3))
    repeats = [draw(st.integers(0, 3)) for _ in range(len(shape) + draw(st.integers(0, 2)))]
    return (draw(tensors(shape, dtype, SPECIALS)),), {"repeats": repeats}


@composite
def _flip(draw, dtype):
    shape = draw(shapes())
    return (draw(tensors(shape, dtype, SPECIALS)),), {"dims": draw(dim_lists(len(shape), min_size=0))}


@composite
def _roll(draw, dtype):
    shape = draw(shapes(min_rank=1))
    dims = draw(dim_lists(len(shape), min_size=0))  # none: the flattened tensor rolls
    shifts = [draw(st.integers(-6, 6)) for _ in dims or [None]]
    return (draw(tensors(shape, dtype, SPECIALS)),), {"shifts": shifts, "dims": dims}


@composite
def _tri(draw, dtype):
    shape = draw(shapes(min_rank=2))
    return (draw(tensors(shape, dtype, SPECIALS)),), {"diagonal": draw(st.integers(-3, 3))}


@composite
def _embedding_bag(draw, dtype):
    rows, width, count = draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(0, 8))
    weight = draw(tensors([rows, width], dtype, Domain(-4, 4)))
    indices = draw(tensors([count], torch.int64, Domain(0, rows - 1)))
    # Bag starts: sorted, from 0, repeats giving empty bags.
    starts = sorted(draw(st.lists(st.integers(0, count), min_size=1, max_size=4)))
    # Bags reduced by max scatter by max, from opset 18 (refused below it: tests/ops/test_indexing.py).
    modes = ["sum", "mean", "max"] if (TESTED_OPSET.get() or DEFAULT_OPSET) >= 18 else ["sum", "mean"]
    args = {"mode": draw(st.sampled_from(modes)), "padding_idx": draw(maybe(st.integers(0, rows - 1)))}
    return (weight, indices, torch.tensor([0, *starts[1:]])), args


@composite
def _masked_scatter(draw, dtype):
    a, b = draw(broadcast_shapes(2))
    target = torch.broadcast_shapes(a, b)
    mask = draw(tensors(b, torch.bool))
    source = draw(tensors([math.prod(target)], dtype, Domain(-10, 10)))
    return (draw(tensors(target, dtype, SPECIALS)), mask, source), {}


@composite
def _diagonal(draw, dtype):
    shape = draw(shapes(min_rank=2))
    rank = len(shape)
    d1 = draw(dim(rank))
    d2 = draw(dim(rank).filter(lambda d: d % rank != d1 % rank))
    return (draw(tensors(shape, dtype, SPECIALS)),), {"offset": draw(st.integers(-2, 2)), "dim1": d1, "dim2": d2}


SPECS: list[OpSpec] = [
    # Static: growing the indices or the offsets would make bags PyTorch rejects.
    OpSpec(
        "embedding_bag.padding_idx",
        lambda w, i, o, mode, padding_idx: F.embedding_bag(i, w, o, mode=mode, padding_idx=padding_idx),
        _embedding_bag,
        (torch.float32, torch.float64),
        dynamic=False,
    ),
    OpSpec(
        "_embedding_bag.default",
        lambda w, i, o, mode, padding_idx: aten._embedding_bag.default(
            w,
            i,
            o,
            False,
            ["sum", "mean", "max"].index(mode),
            False,
            None,
            False,
            -1 if padding_idx is None else padding_idx,
        )[0],
        _embedding_bag,
        (torch.float32, torch.float64),
        dynamic=False,
    ),
    OpSpec("repeat.default", aten.repeat.default, _repeat, ALL, dynamic=False),
    OpSpec("flip.default", aten.flip.default, _flip, ALL),
    OpSpec("roll.default", aten.roll.default, _roll, ALL),
    OpSpec("tril.default", aten.tril.default, _tri, ALL),
    OpSpec("triu.default", aten.triu.default, _tri, ALL),
    OpSpec("diagonal.default", aten.diagonal.default, _diagonal, ALL),
    OpSpec("gather.default", lambda x, i, dim: aten.gather.default(x, dim, i), _gather, ALL, dynamic=False),
    OpSpec(
        "index_select.default",
        lambda x, i, dim: aten.index_select.default(x, dim, i),
        _index_select,
        ALL,
        dynamic=False,
    ),
    OpSpec("index.Tensor", _index, _index_tensor, ALL, dynamic=False),
    OpSpec("index_put.default", _index_put_fn, _index_put, NUMERIC, dynamic=False, tolerances=LOW_PRECISION_SUM),
    OpSpec("scatter.src", lambda x, i, s, dim: aten.scatter.src(x, dim, i, s), _scatter("src"), NUMERIC, dynamic=False),
    OpSpec(
        "scatter.value",
        lambda x, i, dim, value: aten.scatter.value(x, dim, i, value),
        _scatter("value"),
        NUMERIC,
        dynamic=False,
    ),
    OpSpec(
        "scatter_add.default",
        lambda x, i, s, dim: aten.scatter_add.default(x, dim, i, s),
        _scatter_add,
        NUMERIC,
        dynamic=False,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec(
        "scatter_reduce.two",
        lambda x, i, s, dim, reduce, include_self: aten.scatter_reduce.two(
            x, dim, i, s, reduce, include_self=include_self
        ),
        _scatter("reduce"),
        FLOATS + (torch.int64, torch.int32),
        dynamic=False,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec(
        "scatter_reduce.two(mean, include_self=False)",
        lambda x, i, s: (
            aten.scatter_reduce.two(x, 0, i, s, "mean"),
            aten.scatter_reduce.two(x, 0, i, s, "sum", include_self=False),
        ),
        lambda draw, dtype: (
            (torch.ones(3, 2, dtype=dtype), torch.tensor([[0, 2]]), torch.ones(1, 2, dtype=dtype)),
            {},
        ),
        F32,
        dynamic=False,
    ),
    OpSpec("embedding.default", aten.embedding.default, _embedding, NUMERIC, dynamic=False),
    OpSpec("masked_fill.Scalar", aten.masked_fill.Scalar, _masked_fill, ALL),
    OpSpec("slice_scatter.default", aten.slice_scatter.default, _slice_scatter, NUMERIC, dynamic=False),
    OpSpec("select_scatter.default", aten.select_scatter.default, _select_scatter, NUMERIC, dynamic=False),
    OpSpec("masked_scatter.default", aten.masked_scatter.default, _masked_scatter, NUMERIC, dynamic=False),
]
