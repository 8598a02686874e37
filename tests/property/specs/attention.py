"""Property specs: scaled dot-product attention (dynexport/ops/attention.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tests.property.specs.common import LOW_PRECISION_SUM, OpSpec, composite
from tests.property.strategies import FLOATS, Domain, maybe, shapes, tensors


@composite
def _sdpa(draw, dtype):
    batch = list(draw(shapes(min_rank=0, max_rank=2, min_side=1, max_side=2)))
    lq, lk, e, ev = (draw(st.integers(1, 4)) for _ in range(4))
    q = draw(tensors([*batch, lq, e], dtype, Domain(-2, 2)))
    k = draw(tensors([*batch, lk, e], dtype, Domain(-2, 2)))
    v = draw(tensors([*batch, lk, ev], dtype, Domain(-2, 2)))
    inputs = [q, k, v]
    causal = draw(st.booleans())
    args = {"is_causal": causal, "scale": draw(maybe(st.sampled_from([0.5, 1.0])))}
    if not causal and draw(st.booleans()):
        mask_dtype = draw(st.sampled_from([torch.bool, dtype]))
        mask = draw(tensors([lq, lk], mask_dtype, Domain(-2, 2)))
        if mask_dtype is torch.bool:
            mask[..., 0] = True  # a fully masked row is NaN in PyTorch
        inputs.append(mask)
    return tuple(inputs), args


def _sdpa_fn(q, k, v, mask=None, **args):
    # Keys and values have one sequence length: said, so that the resized inputs keep it so
    # (PyTorch's CPU flash kernel does not check it and reads past a shorter value).
    torch._check(k.shape[-2] == v.shape[-2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **args)


SPECS: list[OpSpec] = [
    OpSpec("scaled_dot_product_attention.default", _sdpa_fn, _sdpa, FLOATS, tolerances=LOW_PRECISION_SUM),
]
