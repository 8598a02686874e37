"""Property specs: unique and unique_consecutive (dynexport/ops/unique.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.property.specs.common import OpSpec, aten, composite
from tests.property.strategies import ALL, Domain, maybe, shapes, tensors


@composite
def _unique_consecutive(draw, dtype):
    # Few distinct values, so that runs repeat; a dim counted from the front (see the rule).
    shape = draw(shapes(min_rank=1, max_rank=3))
    along = draw(maybe(st.integers(0, len(shape) - 1)))
    x = draw(tensors(shape, dtype, Domain(0, 2, integral=True)))
    return (x,), {"return_inverse": True, "return_counts": True, "dim": along}


SPECS: list[OpSpec] = [
    OpSpec("unique_consecutive.default", aten.unique_consecutive.default, _unique_consecutive, ALL),
    OpSpec(
        "_unique2.default", lambda x, dim, **flags: aten._unique2.default(x, True, **flags), _unique_consecutive, ALL
    ),
    OpSpec(
        "unique_dim.default",
        lambda x, dim, **flags: (
            aten.unique_dim.default(x, dim, True, **flags)
            if dim is not None
            else aten._unique2.default(x, True, **flags)
        ),
        _unique_consecutive,
        ALL,
    ),
]
