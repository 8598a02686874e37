"""Property specs: sizes read at run time (dynexport/ops/symbolic.py)."""

from __future__ import annotations

import torch

from tests.property.specs.common import F32, OpSpec, aten, one
from tests.property.strategies import FLOATS, NUMERIC, Domain

SPECS: list[OpSpec] = [
    OpSpec(
        "sym_size.int",
        lambda x: x.new_zeros(x.shape[-1]) + x.shape[0] if x.dim() else x,
        one(Domain(-10, 10), min_rank=1),
        NUMERIC,
    ),
    OpSpec(
        "_local_scalar_dense.default",
        lambda x: x * aten._local_scalar_dense.default(x.sum()),
        one(Domain(-3, 3), min_rank=1),
        F32,
        dynamic=False,
    ),
    OpSpec("sym_numel.default", lambda x: x.reshape(-1) * x.numel(), one(Domain(-10, 10)), FLOATS + (torch.int64,)),
]
