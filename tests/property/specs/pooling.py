"""Property specs: max, average and adaptive pools (dynexport/ops/pooling.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tests.property.specs.common import F32, NO_NAN, OpSpec, aten, composite
from tests.property.strategies import FLOATS, Domain, maybe, tensors


def _pool(rank: int, kind: str):
    @composite
    def sample(draw, dtype):
        kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
        stride = [draw(st.integers(1, 3)) for _ in range(rank)]
        padding = [draw(st.integers(0, k // 2)) for k in kernel]
        dilation = [draw(st.integers(1, 2)) for _ in range(rank)] if kind == "max" else [1] * rank
        spatial = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + 5)) for k, d in zip(kernel, dilation)]
        lead = [draw(st.integers(1, 2)) for _ in range(draw(st.integers(1, 2)))]
        # NaN is left out: onnxruntime's MaxPool skips it (see KNOWN_GAPS).
        x = draw(tensors([*lead, *spatial], dtype, NO_NAN if kind == "max" else Domain(-10, 10)))
        # float64 runs on onnx's reference evaluator (onnxruntime has no float64 AveragePool), which
        # shifts ceil-mode windows (it pads half the overhang in front; onnx/onnx#4958).
        reference_run = kind == "avg" and dtype == torch.float64
        args = {"kernel_size": kernel, "stride": stride, "padding": padding}
        args["ceil_mode"] = False if reference_run else draw(st.booleans())
        if kind == "max":
            args["dilation"] = dilation
        else:
            args["count_include_pad"] = draw(st.booleans())
            args["divisor_override"] = draw(maybe(st.integers(1, 4)))
        return (x,), args

    return sample


def _adaptive(rank: int):
    @composite
    def sample(draw, dtype):
        spatial = [draw(st.integers(1, 6)) for _ in range(rank)]
        x = draw(tensors([draw(st.integers(1, 2)), draw(st.integers(1, 2)), *spatial], dtype, Domain(-10, 10)))
        return (x,), {"output_size": [draw(st.integers(1, 4)) for _ in range(rank)]}

    return sample


SPECS: list[OpSpec] = [
    OpSpec("max_pool2d_with_indices.default", aten.max_pool2d_with_indices.default, _pool(2, "max"), FLOATS),
    OpSpec(
        "max_pool3d_with_indices.default", aten.max_pool3d_with_indices.default, _pool(3, "max"), F32 + (torch.float64,)
    ),
    OpSpec("max_pool2d.default", aten.max_pool2d.default, _pool(2, "max"), FLOATS),
    # No float64: onnxruntime has no float64 AveragePool (float64 avg_pool3d checks on the
    # reference evaluator, without ceil mode).
    OpSpec(
        "avg_pool2d.default", aten.avg_pool2d.default, _pool(2, "avg"), (torch.float32, torch.float16, torch.bfloat16)
    ),
    OpSpec("avg_pool3d.default", aten.avg_pool3d.default, _pool(3, "avg"), F32 + (torch.float64,)),
    OpSpec("_adaptive_avg_pool2d.default", aten._adaptive_avg_pool2d.default, _adaptive(2), FLOATS, dynamic=False),
    OpSpec(
        "_adaptive_avg_pool3d.default",
        aten._adaptive_avg_pool3d.default,
        _adaptive(3),
        F32 + (torch.float64,),
        dynamic=False,
    ),
]
