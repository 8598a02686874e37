"""Property specs: matrix products, einsum, det (dynexport/ops/linalg.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tests.property.specs.common import F32, OpSpec, aten, composite
from tests.property.strategies import FLOATS, NUMERIC, Domain, broadcast_shapes, shapes, tensors


@composite
def _matmul(draw, dtype):
    m, k, n = (draw(st.integers(0, 4)) for _ in range(3))
    batch_a, batch_b = draw(broadcast_shapes(2, max_rank=2))
    rank_a, rank_b = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    a = [*batch_a, m, k] if rank_a == 2 else ([k] if not batch_a else [*batch_a, m, k])
    b = [*batch_b, k, n] if rank_b == 2 else ([k] if not batch_b else [*batch_b, k, n])
    return (draw(tensors(a, dtype, Domain(-4, 4))), draw(tensors(b, dtype, Domain(-4, 4)))), {}


def _mm(batch: bool = False, bias: str | None = None, vector: bool = False):
    @composite
    def sample(draw, dtype):
        m, k, n = (draw(st.integers(0, 4)) for _ in range(3))
        lead = [draw(st.integers(0, 3))] if batch else []
        inputs = [
            draw(tensors([*lead, m, k], dtype, Domain(-4, 4))),
            draw(tensors([*lead, k] if vector else [*lead, k, n], dtype, Domain(-4, 4))),
        ]
        args = {}
        if bias is not None:
            out = [*lead, m] if vector else [*lead, m, n]
            inputs.insert(0, draw(tensors(out[draw(st.integers(0, len(out))) :], dtype, Domain(-4, 4))))
            args = {"beta": draw(st.sampled_from([1, 0.5, 0])), "alpha": draw(st.sampled_from([1, 2, -0.5]))}
            if not dtype.is_floating_point:
                args = {k: int(v) if v == int(v) else 1 for k, v in args.items()}
        return tuple(inputs), args

    return sample


@composite
def _linear(draw, dtype):
    shape = draw(shapes(min_rank=1, max_rank=4))
    out = draw(st.integers(0, 4))
    x = draw(tensors(shape, dtype, Domain(-4, 4)))
    w = draw(tensors([out, shape[-1]], dtype, Domain(-4, 4)))
    if draw(st.booleans()):
        return (x, w, draw(tensors([out], dtype, Domain(-4, 4)))), {}
    return (x, w), {}


def _vectors(same: bool):
    @composite
    def sample(draw, dtype):
        n = draw(st.integers(0, 5))
        m = n if same else draw(st.integers(0, 5))
        return (draw(tensors([n], dtype, Domain(-4, 4))), draw(tensors([m], dtype, Domain(-4, 4)))), {}

    return sample


@composite
def _square(draw, dtype):
    n = draw(st.integers(1, 3))
    return (draw(tensors([*draw(shapes(max_rank=1, min_side=1)), n, n], dtype, Domain(-2, 2))),), {}


@composite
def _einsum(draw, dtype):
    i, j, k, b = (draw(st.integers(1, 3)) for _ in range(4))
    equation, a_shape, b_shape = draw(
        st.sampled_from(
            [
                ("ij,jk->ik", [i, j], [j, k]),
                ("bij,bjk->bik", [b, i, j], [b, j, k]),
                ("ij,ij->i", [i, j], [i, j]),
                ("i,j->ij", [i], [j]),
                ("bi,bi->b", [b, i], [b, i]),
                ("ij->ji", [i, j], None),
            ]
        )
    )
    a = draw(tensors(a_shape, dtype, Domain(-3, 3)))
    other = draw(tensors(b_shape or a_shape, dtype, Domain(-3, 3)))
    if b_shape is None:
        equation = "ij,ij->ji"
    return (a, other), {"equation": equation}


SPECS: list[OpSpec] = [
    OpSpec("mm.default", aten.mm.default, _mm(), NUMERIC),
    OpSpec("bmm.default", aten.bmm.default, _mm(batch=True), NUMERIC),
    OpSpec("addmm.default", aten.addmm.default, _mm(bias="yes"), NUMERIC),
    OpSpec("baddbmm.default", aten.baddbmm.default, _mm(batch=True, bias="yes"), NUMERIC),
    OpSpec("mv.default", aten.mv.default, _mm(vector=True), NUMERIC),
    OpSpec("matmul.default", aten.matmul.default, _matmul, NUMERIC),
    OpSpec("linear.default", aten.linear.default, _linear, FLOATS),
    OpSpec("dot.default", aten.dot.default, _vectors(same=True), NUMERIC),
    OpSpec("outer.default", aten.outer.default, _vectors(same=False), NUMERIC),
    OpSpec(
        "linalg_det.default",
        aten.linalg_det.default,
        _square,
        F32 + (torch.float64,),
        tolerances={torch.float32: (1e-3, 1e-3)},
    ),
    OpSpec(
        "einsum.default",
        lambda a, b, equation: aten.einsum.default(equation, [a, b]),
        _einsum,
        FLOATS,
    ),
]
