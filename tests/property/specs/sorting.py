"""Property specs: sort, topk, kthvalue, median (dynexport/ops/sorting.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.property.specs.common import OpSpec, aten, composite, distinct
from tests.property.strategies import NUMERIC, Domain, dim, shapes, tensors


def _sort(kind: str):
    @composite
    def sample(draw, dtype):
        x = distinct(
            draw,
            dtype,
            min_rank=1 if kind in ("topk", "kthvalue") else 0,
            min_side=1 if kind in ("topk", "kthvalue") else 0,
        )
        d = draw(dim(x.dim()))
        if kind == "sort":
            return (x,), {"dim": d, "descending": draw(st.booleans())}
        if kind == "topk":
            return (x,), {
                "k": draw(st.integers(0, x.shape[d] if x.dim() else 1)),
                "dim": d,
                "largest": draw(st.booleans()),
            }
        if kind == "kthvalue":
            return (x,), {"k": draw(st.integers(1, x.shape[d])), "dim": d, "keepdim": draw(st.booleans())}
        return (x,), {"dim": d}

    return sample


SPECS: list[OpSpec] = [
    OpSpec("sort.default", aten.sort.default, _sort("sort"), NUMERIC),
    OpSpec(
        "sort.stable",
        lambda x, dim, descending: aten.sort.stable(x, stable=True, dim=dim, descending=descending),
        lambda draw, dtype: (
            (draw(tensors(draw(shapes()), dtype, Domain(-3, 3))),),
            {"dim": -1, "descending": draw(st.booleans())},
        ),
        NUMERIC,
    ),
    OpSpec("topk.default", aten.topk.default, _sort("topk"), NUMERIC, dynamic=False),
    OpSpec("kthvalue.default", aten.kthvalue.default, _sort("kthvalue"), NUMERIC, dynamic=False),
    OpSpec("median.dim", aten.median.dim, _sort("median"), NUMERIC),
]
