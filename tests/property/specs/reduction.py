"""Property specs: reductions, scans and distances (dynexport/ops/reduction.py)."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from tests.property.specs.common import (
    F32,
    LOW_PRECISION_SUM,
    NO_NAN,
    SPECIALS,
    OpSpec,
    aten,
    composite,
    distinct,
    reduce,
)
from tests.property.strategies import ALL, BOOL, FLOATS, NUMERIC, Domain, dim, dim_lists, maybe, shapes, tensors


@composite
def _cumsum(draw, dtype):
    shape = draw(shapes())
    return (draw(tensors(shape, dtype, Domain(-10, 10))),), {"dim": draw(dim(len(shape)))}


def _variance(min_side: int = 0):
    @composite
    def sample(draw, dtype):
        shape = draw(shapes(min_side=min_side))
        args = {
            "dim": draw(maybe(dim_lists(len(shape)))),
            "correction": draw(maybe(st.sampled_from([0, 1, 2]))),
            "keepdim": draw(st.booleans()),
        }
        return (draw(tensors(shape, dtype, Domain(-10, 10))),), args

    return sample


_var = _variance()
_var_nonempty = _variance(min_side=1)


@composite
def _vector_norm(draw, dtype):
    shape = draw(shapes())
    # torch.export's fake kernel rejects an inf norm over a size-1 dim of a tensor with an empty
    # dim, which eager computes: there is no program to translate.
    orders = [2, 1, 3, 0] + ([] if 0 in shape else [math.inf, -math.inf])
    args = {
        "ord": draw(st.sampled_from(orders)),
        "dim": draw(maybe(dim_lists(len(shape)))),
        "keepdim": draw(st.booleans()),
    }
    return (draw(tensors(shape, dtype, SPECIALS)),), args


@composite
def _cdist(draw, dtype):
    batch, rows, others, features = (draw(st.integers(1, 3)) for _ in range(4))
    a, b = (draw(tensors([batch, n, features], dtype, Domain(-4, 4))) for n in (rows, others))
    return (a, b), {"p": draw(st.sampled_from([2.0, 1.0, 0.0, 3.0, math.inf]))}


@composite
def _pdist(draw, dtype):
    x = draw(tensors([draw(st.integers(1, 5)), draw(st.integers(1, 3))], dtype, Domain(-4, 4)))
    return (x,), {"p": draw(st.sampled_from([2.0, 1.0, 0.0, 3.0, math.inf]))}


SPECS: list[OpSpec] = [
    OpSpec("sum.dim_IntList", aten.sum.dim_IntList, reduce(Domain(-10, 10)), ALL, tolerances=LOW_PRECISION_SUM),
    OpSpec(
        "sum.default",
        aten.sum.default,
        reduce(Domain(-10, 10), dims="none", keepdim=False),
        ALL,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec("mean.dim", aten.mean.dim, reduce(Domain(-10, 10), min_side=1), FLOATS, tolerances=LOW_PRECISION_SUM),
    OpSpec(
        "mean.default",
        aten.mean.default,
        reduce(Domain(-10, 10), dims="none", keepdim=False, min_side=1),
        FLOATS,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec(
        "mean.dim(empty)",
        lambda x: aten.mean.dim(x, [0]),
        lambda draw, dtype: ((torch.zeros(0, 2, dtype=dtype),), {}),
        F32,
        dynamic=False,
    ),
    OpSpec("amax.default", aten.amax.default, reduce(NO_NAN), ALL),
    OpSpec("amin.default", aten.amin.default, reduce(NO_NAN), ALL),
    OpSpec("argmax.default", aten.argmax.default, reduce(Domain(-10, 10, integral=True), dims="optional"), NUMERIC),
    OpSpec("argmin.default", aten.argmin.default, reduce(Domain(-10, 10, integral=True), dims="optional"), NUMERIC),
    OpSpec("max.dim", aten.max.dim, reduce(Domain(-10, 10), dims="one"), NUMERIC + BOOL),
    OpSpec("min.dim", aten.min.dim, reduce(Domain(-10, 10), dims="one"), NUMERIC + BOOL),
    OpSpec("max.default", aten.max.default, reduce(NO_NAN, dims="none", keepdim=False, min_side=1), ALL),
    OpSpec("min.default", aten.min.default, reduce(NO_NAN, dims="none", keepdim=False, min_side=1), ALL),
    *(
        OpSpec(
            f"{name}(nan)",
            fn,
            lambda draw, dtype: ((torch.tensor([1.0, math.nan, 2.0], dtype=dtype),), {}),
            F32,
            dynamic=False,
        )
        for name, fn in [
            ("amax.default", lambda x: aten.amax.default(x, [0])),
            ("amin.default", lambda x: aten.amin.default(x, [0])),
            ("max.default", aten.max.default),
            ("min.default", aten.min.default),
        ]
    ),
    # Integers in [-1, 1]: an int64 product that overflows wraps around in PyTorch but saturates in
    # onnxruntime's ReduceProd (a limitation of the runtime, listed in docs/op_coverage.md).
    OpSpec(
        "prod.default",
        aten.prod.default,
        reduce(Domain(-1.5, 1.5), dims="none", keepdim=False),
        ALL,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec("prod.dim_int", aten.prod.dim_int, reduce(Domain(-1.5, 1.5), dims="one"), ALL, tolerances=LOW_PRECISION_SUM),
    OpSpec("any.default", aten.any.default, reduce(SPECIALS, dims="none", keepdim=False), ALL),
    OpSpec("any.dim", aten.any.dim, reduce(SPECIALS, dims="one"), ALL),
    OpSpec("any.dims", aten.any.dims, reduce(SPECIALS), ALL),
    OpSpec("all.default", aten.all.default, reduce(SPECIALS, dims="none", keepdim=False), ALL),
    OpSpec("all.dims", aten.all.dims, reduce(SPECIALS), ALL),
    OpSpec("var.correction", aten.var.correction, _var, FLOATS, tolerances=LOW_PRECISION_SUM),
    OpSpec("std.correction", aten.std.correction, _var, FLOATS, tolerances=LOW_PRECISION_SUM),
    OpSpec(
        "var.dim", aten.var.dim, reduce(Domain(-10, 10), unbiased=st.booleans()), FLOATS, tolerances=LOW_PRECISION_SUM
    ),
    OpSpec("var_mean.correction", aten.var_mean.correction, _var_nonempty, FLOATS, tolerances=LOW_PRECISION_SUM),
    OpSpec("cumsum.default", aten.cumsum.default, _cumsum, NUMERIC, tolerances=LOW_PRECISION_SUM),
    OpSpec("logsumexp.default", aten.logsumexp.default, reduce(Domain(-10, 10)), FLOATS),
    OpSpec("count_nonzero.dim_IntList", aten.count_nonzero.dim_IntList, reduce(SPECIALS, keepdim=False), ALL),
    OpSpec(
        "linalg_vector_norm.default",
        aten.linalg_vector_norm.default,
        _vector_norm,
        FLOATS,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec(
        "_cdist_forward.default",
        lambda a, b, p: aten._cdist_forward(a, b, p, None),
        _cdist,
        (torch.float32, torch.float64),
    ),
    OpSpec("_pdist_forward.default", lambda x, p: aten._pdist_forward(x, p), _pdist, (torch.float32, torch.float64)),
    OpSpec("cumprod.default", aten.cumprod.default, _cumsum, NUMERIC, tolerances=LOW_PRECISION_SUM),
    OpSpec("logcumsumexp.default", aten.logcumsumexp.default, _cumsum, FLOATS, tolerances=LOW_PRECISION_SUM),
    OpSpec(
        "cummax.default",
        aten.cummax.default,
        lambda draw, dtype: ((distinct(draw, dtype, min_rank=1),), {"dim": 0}),
        NUMERIC,
    ),
    OpSpec(
        "cummin.default",
        aten.cummin.default,
        lambda draw, dtype: ((distinct(draw, dtype, min_rank=1),), {"dim": 0}),
        NUMERIC,
    ),
]
