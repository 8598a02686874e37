"""Property specs: convolutions (dynexport/ops/convolution.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tests.property.specs.common import F32, OpSpec, aten, composite
from tests.property.strategies import FLOATS, Domain, tensors

CONV = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


def _conv(rank: int, transposed: bool = False):
    @composite
    def sample(draw, dtype):
        # onnxruntime has ConvTranspose for float32 only; onnx's reference evaluator (used for
        # the other dtypes) fails on grouped ConvTranspose.
        groups = draw(st.integers(1, 2 if not transposed or dtype is torch.float32 else 1))
        cin, cout = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
        kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
        stride = [draw(st.integers(1, 2)) for _ in range(rank)]
        dilation = [draw(st.integers(1, 2)) for _ in range(rank)]
        padding = [draw(st.integers(0, (k - 1) * d // 2 + (1 if transposed else 0))) for k, d in zip(kernel, dilation)]
        output_padding = (
            [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)] if transposed else [0] * rank
        )
        spatial = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + 4)) for k, d in zip(kernel, dilation)]
        x = draw(tensors([draw(st.integers(1, 2)), cin, *spatial], dtype, Domain(-3, 3)))
        weight_shape = [cin, cout // groups, *kernel] if transposed else [cout, cin // groups, *kernel]
        w = draw(tensors(weight_shape, dtype, Domain(-3, 3)))
        inputs = [x, w]
        if draw(st.booleans()):
            inputs.append(draw(tensors([cout], dtype, Domain(-3, 3))))
        args = dict(
            stride=stride,
            padding=padding,
            dilation=dilation,
            transposed=transposed,
            output_padding=output_padding,
            groups=groups,
        )
        return tuple(inputs), args

    return sample


def _convolution(x, w, b=None, **args):
    return aten.convolution.default(
        x,
        w,
        b,
        args["stride"],
        args["padding"],
        args["dilation"],
        args["transposed"],
        args["output_padding"],
        args["groups"],
    )


SPECS: list[OpSpec] = [
    OpSpec("convolution.default(1d)", _convolution, _conv(1), FLOATS, tolerances=CONV),
    OpSpec("convolution.default(2d)", _convolution, _conv(2), FLOATS, tolerances=CONV),
    OpSpec("convolution.default(3d)", _convolution, _conv(3), F32 + (torch.float64,)),
    OpSpec("convolution.default(transposed 2d)", _convolution, _conv(2, transposed=True), FLOATS, tolerances=CONV),
    OpSpec(
        "conv3d.default",
        lambda x, w, b=None, **a: F.conv3d(x, w, b, a["stride"], a["padding"], a["dilation"], a["groups"]),
        _conv(3),
        F32 + (torch.float64,),
    ),
]
