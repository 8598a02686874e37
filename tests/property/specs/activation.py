"""Property specs: activations and softmax (dynexport/ops/activation.py)."""

from __future__ import annotations

import torch.nn.functional as F
from hypothesis import strategies as st

from tests.property.specs.common import LOW_PRECISION_SUM, SPECIALS, OpSpec, aten, composite, one
from tests.property.strategies import Domain, dim, shapes, tensors


@composite
def _softmax(draw, dtype):
    shape = draw(shapes())
    return (draw(tensors(shape, dtype, Domain(-10, 10))),), {"dim": draw(dim(len(shape)))}


def _activation(domain=SPECIALS, **args):
    return one(domain, **{k: st.sampled_from(v) for k, v in args.items()})


@composite
def _glu(draw, dtype):
    shape = list(draw(shapes(min_rank=1, min_side=1)))
    d = draw(dim(len(shape)))
    shape[d] *= 2
    return (draw(tensors(shape, dtype, SPECIALS)),), {"dim": d}


SPECS: list[OpSpec] = [
    # Finite inputs: PyTorch's vectorized float32 CPU kernel returns NaN for gelu(inf) (its scalar
    # and float64 paths return inf), so eager itself is no reference there.
    OpSpec(
        "gelu.default",
        aten.gelu.default,
        _activation(Domain(), approximate=["none", "tanh"]),
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec("silu.default", aten.silu.default, _activation()),
    OpSpec("hardswish.default", aten.hardswish.default, _activation()),
    OpSpec("hardsigmoid.default", aten.hardsigmoid.default, _activation()),
    OpSpec("hardtanh.default", aten.hardtanh.default, _activation(min_val=[-1.0, -2.5], max_val=[1.0, 3.0])),
    OpSpec("elu.default", aten.elu.default, _activation(alpha=[1.0, 0.5], scale=[1.0, 2.0], input_scale=[1.0, 0.5])),
    OpSpec("leaky_relu.default", aten.leaky_relu.default, _activation(negative_slope=[0.01, 0.2, -0.5])),
    OpSpec("softplus.default", aten.softplus.default, _activation(beta=[1.0, 2.0], threshold=[20.0, 1.5])),
    OpSpec("mish.default", aten.mish.default, _activation()),
    OpSpec("selu.default", aten.selu.default, _activation()),
    OpSpec("celu.default", aten.celu.default, _activation(alpha=[1.0, 0.7])),
    OpSpec("log_sigmoid", F.logsigmoid, _activation()),
    OpSpec("glu.default", aten.glu.default, _glu),
    OpSpec("threshold.default", aten.threshold.default, _activation(threshold=[0.1, -1.0], value=[20.0, 0.0])),
    OpSpec("_softmax.default", lambda x, dim: aten._softmax.default(x, dim, False), _softmax),
    OpSpec("_log_softmax.default", lambda x, dim: aten._log_softmax.default(x, dim, False), _softmax),
    OpSpec("softmax.int", aten.softmax.int, _softmax),
    OpSpec("log_softmax.int", aten.log_softmax.int, _softmax),
]
