"""Property specs: random tensors and dropout (dynexport/ops/random.py)."""

from __future__ import annotations

import torch

from tests.property.specs.common import SPECIALS, OpSpec, aten, like_input, one
from tests.property.strategies import FLOATS

SPECS: list[OpSpec] = [
    # Only the output: eager CPU returns the eval-mode mask in the input's dtype, its meta says bool.
    OpSpec(
        "native_dropout.default(eval)", lambda x: aten.native_dropout.default(x, 0.5, False)[0], one(SPECIALS), FLOATS
    ),
    OpSpec(
        "native_dropout.default(train)",
        lambda x: aten.native_dropout.default(x, 0.5, True)[0],
        one(SPECIALS),
        FLOATS,
        check_values=False,
    ),
    OpSpec(
        "randperm.default", lambda x: aten.randperm.default(x.shape[-1]), like_input, (torch.int64,), check_values=False
    ),
    OpSpec("rand.default", lambda x: aten.rand.default(x.shape, dtype=x.dtype), like_input, FLOATS, check_values=False),
    OpSpec(
        "randn.default", lambda x: aten.randn.default(x.shape, dtype=x.dtype), like_input, FLOATS, check_values=False
    ),
]
