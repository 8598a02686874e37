"""Property specs: layer, group and batch norms (dynexport/ops/normalization.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tests.property.specs.common import F32, LOW_PRECISION_SUM, OpSpec, aten, composite
from tests.property.strategies import FLOATS, Domain, shapes, tensors

# Near-constant groups divide rounding noise by sqrt(eps).
NORMALIZED = {
    torch.float32: (1e-3, 1e-3),
    torch.float64: (1e-6, 1e-6),
    torch.float16: (5e-2, 5e-2),
    torch.bfloat16: (1e-1, 1e-1),
}


def _norm(kind: str):
    @composite
    def sample(draw, dtype):
        if kind == "layer":
            shape = draw(shapes(min_rank=1, min_side=1))
            n = draw(st.integers(1, len(shape)))
            normalized = list(shape[-n:])
            x = draw(tensors(shape, dtype, Domain(-5, 5)))
            inputs = [x]
            if draw(st.booleans()):
                inputs += [
                    draw(tensors(normalized, dtype, Domain(-2, 2))),
                    draw(tensors(normalized, dtype, Domain(-2, 2))),
                ]
            return tuple(inputs), {"normalized_shape": normalized, "eps": draw(st.sampled_from([1e-5, 1e-3]))}
        groups = draw(st.integers(1, 3))
        channels = groups * draw(st.integers(1, 2))
        x = draw(
            tensors(
                [draw(st.integers(1, 3)), channels, *draw(shapes(min_rank=0, max_rank=2, min_side=1))],
                dtype,
                Domain(-5, 5),
            )
        )
        if kind == "group":
            return (
                x,
                draw(tensors([channels], dtype, Domain(-2, 2))),
                draw(tensors([channels], dtype, Domain(-2, 2))),
            ), {"num_groups": groups, "eps": 1e-5}
        stats = [draw(tensors([channels], dtype, Domain(-2, 2))), draw(tensors([channels], dtype, Domain(0.5, 2)))]
        return (
            x,
            draw(tensors([channels], dtype, Domain(-2, 2))),
            draw(tensors([channels], dtype, Domain(-2, 2))),
            *stats,
        ), {"eps": 1e-5}

    return sample


SPECS: list[OpSpec] = [
    OpSpec(
        "native_layer_norm.default",
        lambda x, w=None, b=None, **a: aten.native_layer_norm.default(x, a["normalized_shape"], w, b, a["eps"]),
        _norm("layer"),
        FLOATS,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec(
        "layer_norm.default",
        lambda x, w=None, b=None, **a: aten.layer_norm.default(x, a["normalized_shape"], w, b, a["eps"]),
        _norm("layer"),
        FLOATS,
        tolerances=LOW_PRECISION_SUM,
    ),
    # bfloat16 is left out: results differ by up to ~0.9 on near-constant groups (reported, not triaged).
    OpSpec(
        "group_norm.default",
        lambda x, w, b, num_groups, eps: F.group_norm(x, num_groups, w, b, eps),
        _norm("group"),
        FLOATS[:2] + FLOATS[3:],
        tolerances=NORMALIZED,
    ),
    OpSpec(
        "native_group_norm.default",
        lambda x, w, b, num_groups, eps: aten.native_group_norm.default(
            x, w, b, x.shape[0], x.shape[1], x[0, 0].numel(), num_groups, eps
        )[0],
        _norm("group"),
        FLOATS[:2] + FLOATS[3:],
        dynamic=False,
        tolerances=NORMALIZED,
    ),
    OpSpec(
        "_native_batch_norm_legit_no_training.default",
        lambda x, w, b, m, v, eps: aten._native_batch_norm_legit_no_training.default(x, w, b, m, v, 0.1, eps)[0],
        _norm("batch"),
        FLOATS,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec(
        "_native_batch_norm_legit.no_stats",
        lambda x, w, b, m, v, eps: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, eps)[0],
        _norm("batch"),
        F32 + (torch.float64,),
        tolerances=LOW_PRECISION_SUM,
    ),
]
