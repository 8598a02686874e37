"""Property specs: tensors made from sizes and scalars (dynexport/ops/creation.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tests.property.specs.common import F32, OpSpec, aten, composite, like_input, scalar_operand
from tests.property.strategies import ALL, FLOATS, shapes


@composite
def _full(draw, dtype):
    return (), {
        "size": list(draw(shapes())),
        "fill_value": draw(scalar_operand(dtype)) if dtype is not torch.bool else True,
        "dtype": dtype,
    }


@composite
def _arange(draw, dtype):
    start = draw(st.integers(-5, 5))
    end = start + draw(st.integers(0, 8))
    step = draw(st.integers(1, 3))
    if dtype.is_floating_point and draw(st.booleans()):
        start, end, step = start + 0.5, end + 0.25, step / 2
    return (), {"start": start, "end": end, "step": step, "dtype": dtype}


SPECS: list[OpSpec] = [
    OpSpec("full.default", lambda **a: aten.full.default(a["size"], a["fill_value"], dtype=a["dtype"]), _full, ALL),
    OpSpec("zeros_like.default", aten.zeros_like.default, like_input, ALL),
    OpSpec("ones_like.default", aten.ones_like.default, like_input, ALL),
    OpSpec("full_like.default", lambda x: aten.full_like.default(x, 3), like_input, ALL),
    OpSpec(
        "empty.memory_format",
        lambda x: aten.empty.memory_format(x.shape, dtype=x.dtype),
        like_input,
        ALL,
        check_values=False,
    ),
    OpSpec(
        "empty_strided.default",
        lambda x: aten.empty_strided.default(x.shape, [1] * x.dim(), dtype=x.dtype),
        like_input,
        ALL,
        check_values=False,
    ),
    OpSpec("fill.Scalar", lambda x: aten.fill.Scalar(x, 2), like_input, ALL),
    OpSpec(
        "arange.start_step",
        lambda **a: aten.arange.start_step(a["start"], a["end"], a["step"], dtype=a["dtype"]),
        _arange,
        FLOATS + (torch.int64, torch.int32),
    ),
    OpSpec(
        "scalar_tensor.default",
        lambda **a: aten.scalar_tensor.default(a["other"], dtype=torch.float32),
        lambda draw, dtype: ((), {"other": draw(scalar_operand(dtype))}),
        F32,
    ),
]
