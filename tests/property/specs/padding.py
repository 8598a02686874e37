"""Property specs: constant, reflection and replication pads (dynexport/ops/padding.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tests.property.specs.common import F32, SPECIALS, OpSpec, aten, composite
from tests.property.strategies import FLOATS, NUMERIC, shapes, tensors


@composite
def _constant_pad(draw, dtype):
    shape = draw(shapes(min_rank=1, min_side=2))
    # onnx's reference evaluator (the runtime for bfloat16 and int16 Pad) rejects negative pads.
    low = 0 if dtype in (torch.bfloat16, torch.int16) else -1
    pad = [draw(st.integers(low, 2)) for _ in range(2 * draw(st.integers(1, len(shape))))]
    return (draw(tensors(shape, dtype, SPECIALS)),), {"pad": pad, "value": draw(st.sampled_from([0, 1.5, -2]))}


def _pad_nd(rank: int, mode: str):
    @composite
    def sample(draw, dtype):
        spatial = [draw(st.integers(2, 5)) for _ in range(rank)]
        lead = [draw(st.integers(1, 2)) for _ in range(draw(st.integers(1, 2)))]
        x = draw(tensors([*lead, *spatial], dtype, SPECIALS))
        limit = (lambda s: s - 1) if mode == "reflection" else (lambda s: 3)
        pad = [draw(st.integers(0, limit(s))) for s in reversed(spatial) for _ in range(2)]
        return (x,), {"padding": pad}

    return sample


SPECS: list[OpSpec] = [
    OpSpec("constant_pad_nd.default", aten.constant_pad_nd.default, _constant_pad, NUMERIC, dynamic=False),
    *(
        OpSpec(
            f"{mode}_pad{r}d.default",
            getattr(aten, f"{mode}_pad{r}d").default,
            _pad_nd(r, mode),
            FLOATS if r < 3 else F32 + (torch.float64,),
            dynamic=False,
        )
        for mode in ("reflection", "replication")
        for r in (1, 2, 3)
    ),
]
