"""Convolutions and transposed convolutions: ONNX Conv and ConvTranspose."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
import torch

from dynexport.ops._helpers import (
    cast,
    floating_input,
    ints,
    per_dim,
    rank,
    run_batched,
)
from dynexport.registry import translates

aten = torch.ops.aten

_INT64_MAX = 2**63 - 1


def _pads(padding: str | int | Sequence[int], kernel: Sequence[int], dilation: list[int]) -> list[int]:
    n = len(kernel)
    if padding == "valid":
        return [0] * 2 * n
    if padding == "same":
        # An odd total padding puts the extra element at the end, as PyTorch does.
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        begin = [t // 2 for t in total]
        return begin + [t - b for t, b in zip(total, begin)]
    return per_dim(padding, n) * 2


@translates(aten.convolution.default, checker=floating_input)
def convolution(ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = rank(weight) - 2
    dilations = per_dim(dilation, n)
    attributes = dict(
        strides=per_dim(stride, n),
        pads=_pads(padding, list(weight.shape)[2:], dilations),
        dilations=dilations,
        group=groups,
    )

    def compute(x):
        w = cast(ctx, weight, x.dtype)
        b = None if bias is None else cast(ctx, bias, x.dtype)
        if transposed:
            extra = per_dim(output_padding, n)
            if _output_may_be_empty(list(input.shape)[-n:], list(weight.shape)[2:], attributes, extra):
                return _cropped_conv_transpose(ctx, x, w, b, attributes, extra)
            if all(e < s for e, s in zip(extra, attributes["strides"])):
                return ctx.op.ConvTranspose(x, w, b, output_padding=extra, **attributes)
            # onnxruntime takes output_padding below the stride only (PyTorch: below the stride
            # or the dilation). output_padding is less end padding instead; positions past the
            # unpadded output see no input, only the bias.
            begin, end = attributes["pads"][:n], [p - e for p, e in zip(attributes["pads"][n:], extra)]
            trailing = [max(-p, 0) for p in end]
            pads = begin + [max(p, 0) for p in end]
            if not any(trailing):
                return ctx.op.ConvTranspose(x, w, b, **{**attributes, "pads": pads})
            y = ctx.op.ConvTranspose(x, w, **{**attributes, "pads": pads})
            y = ctx.op.Pad(y, ints(ctx, [0] * (n + 2) + [0, 0] + trailing))
            return y if b is None else ctx.op.Add(y, ctx.op.Reshape(b, ints(ctx, [-1] + [1] * n)))
        return ctx.op.Conv(x, w, b, **attributes)

    return run_batched(ctx, input, n, compute)


def _output_may_be_empty(
    spatial: Sequence[int | ir.SymbolicDim], kernel: Sequence[int | ir.SymbolicDim], attributes: dict, extra: Sequence[int]
) -> bool:
    """Whether a transposed convolution's output can have a size-0 spatial dim, which PyTorch
    allows (padding that removes every position) and onnxruntime's ConvTranspose rejects. A
    dynamic input or kernel size is taken at its smallest, 1."""
    n = len(kernel)
    begins, ends = attributes["pads"][:n], attributes["pads"][n:]
    for i, (size, k) in enumerate(zip(spatial, kernel)):
        size, k = (x if isinstance(x, int) else 1 for x in (size, k))
        full = (size - 1) * attributes["strides"][i] + attributes["dilations"][i] * (k - 1) + 1
        if full + extra[i] - begins[i] - ends[i] <= 0:
            return True
    return False


def _cropped_conv_transpose(ctx, x, w, b, attributes: dict, extra: Sequence[int]) -> ir.Value:
    """The transposed convolution unpadded (never empty), then cropped to PyTorch's output:
    the begin padding off the start, the end padding less output_padding off the end (or,
    where output_padding is larger, zeros added there: positions that see only the bias)."""
    n = len(extra)
    begins = attributes["pads"][:n]
    ends = [p - e for p, e in zip(attributes["pads"][n:], extra)]
    y = ctx.op.ConvTranspose(x, w, **{**attributes, "pads": [0] * 2 * n})
    trailing = [max(-p, 0) for p in ends]
    if any(trailing):
        y = ctx.op.Pad(y, ints(ctx, [0] * (n + 2) + [0, 0] + trailing))
    stops = [-p if p > 0 else _INT64_MAX for p in ends]
    y = ctx.op.Slice(y, ints(ctx, begins), ints(ctx, stops), ints(ctx, list(range(2, n + 2))))
    return y if b is None else ctx.op.Add(y, ctx.op.Reshape(b, ints(ctx, [-1] + [1] * n)))


@translates(aten._convolution.default, checker=floating_input)
def _convolution(
    ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *backend_flags
):
    # benchmark, deterministic, cudnn_enabled and allow_tf32 only choose among kernels.
    return convolution(
        ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )


@translates(
    aten.conv1d.default, aten.conv2d.default, aten.conv3d.default,
    aten.conv1d.padding, aten.conv2d.padding, aten.conv3d.padding,
    checker=floating_input,
)
def conv(ctx, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return convolution(ctx, input, weight, bias, stride, padding, dilation, False, 0, groups)


@translates(
    aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input,
    checker=floating_input,
)
def conv_transpose(
    ctx, input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1
):
    return convolution(ctx, input, weight, bias, stride, padding, dilation, True, output_padding, groups)
