"""Max, average and adaptive pooling: ONNX MaxPool, AveragePool and GlobalAveragePool, and
adaptive bins that do not divide the input evenly as gathers or matrix products."""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir
import torch

from dynexport.ops._helpers import (
    cast,
    floating_input,
    ints,
    only_first_output_used,
    per_dim,
    rank,
    reduce,
    run_batched,
    scalar,
    shape_of,
    size_of,
)
from dynexport.registry import translates

aten = torch.ops.aten


def _spatial_rank(node: torch.fx.Node) -> int:
    # The schema's int[N] says 1d, 2d or 3d; the input's rank cannot, as it may lack a batch dim.
    return node.target._schema.arguments[1].N


def _max_pool_input(node: torch.fx.Node) -> bool:
    # MaxPool takes floating types and, of the integers, int8 and uint8 only.
    dtype = node.args[0].meta["val"].dtype
    return dtype.is_floating_point or dtype in (torch.int8, torch.uint8)


def _static_output_size(node: torch.fx.Node) -> bool:
    return all(isinstance(s, int) for s in node.args[1])


def _evenly_divided(spatial: Sequence, output_size: Sequence) -> bool:
    return all(isinstance(s, int) and s % o == 0 for s, o in zip(spatial, output_size))


def _adaptive_max_pool_supported(node: torch.fx.Node) -> bool:
    return _max_pool_input(node) and _static_output_size(node)


def _adaptive_bins(length: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive pooling bins: [floor(i * length / out), ceil((i + 1) * length / out))."""
    return [(i * length // out, -(-(i + 1) * length // out)) for i in range(out)]


def _window(kernel_size, stride, padding, n: int) -> dict[str, list[int]]:
    kernel = per_dim(kernel_size, n)
    # An empty stride means stride = kernel_size.
    strides = per_dim(stride, n) if stride else kernel
    return dict(kernel_shape=kernel, strides=strides, pads=per_dim(padding, n) * 2)


def _drop_ceil_windows_in_padding(
    ctx, outputs: list[ir.Value], spatial: Sequence, window: dict, dilations: list[int]
) -> list[ir.Value]:
    # The ONNX spec, PyTorch and onnxruntime drop a last ceil-mode window that would start in the
    # right padding, but onnx's shape inference counts it; slicing to the true size keeps static
    # shapes consistent (and is a no-op at run time).
    axes, ends = [], []
    for i, (length, k, s, p, d) in enumerate(
        zip(spatial, window["kernel_shape"], window["strides"], window["pads"], dilations)
    ):
        if not isinstance(length, int):
            continue
        count = -(-(length + 2 * p - d * (k - 1) - 1) // s) + 1
        if (count - 1) * s >= length + p:
            axes.append(2 + i)
            ends.append(count - 1)
    if not axes:
        return outputs
    starts, ends, axes = ints(ctx, [0] * len(axes)), ints(ctx, ends), ints(ctx, axes)
    return [ctx.op.Slice(y, starts, ends, axes) for y in outputs]


def _plane_size(ctx, spatial: Sequence, x: ir.Value) -> ir.Value:
    if all(isinstance(s, int) for s in spatial):
        return ctx.constant(math.prod(spatial), ir.DataType.INT64)
    return reduce(ctx, "ReduceProd", shape_of(ctx, x, 2), keepdims=False)


def _max_pool(ctx, self, n, window, dilations, ceil_mode, with_indices):
    spatial = list(self.shape)[-n:]
    attributes = dict(window, dilations=dilations, ceil_mode=int(ceil_mode))

    def compute(x):
        if with_indices:
            values, indices = ctx.op.MaxPool(x, _outputs=2, **attributes)
            # ONNX numbers elements across the whole tensor, PyTorch within each (batch, channel)
            # plane.
            outputs = [values, ctx.op.Mod(indices, _plane_size(ctx, spatial, x))]
        else:
            outputs = [ctx.op.MaxPool(x, **attributes)]
        if ceil_mode:
            outputs = _drop_ceil_windows_in_padding(ctx, outputs, spatial, window, dilations)
        return outputs if with_indices else outputs[0]

    return run_batched(ctx, self, n, compute)


@translates(
    aten.max_pool1d.default, aten.max_pool2d.default, aten.max_pool3d.default, checker=_max_pool_input
)
def max_pool(ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = _spatial_rank(ctx.node)
    window = _window(kernel_size, stride, padding, n)
    return _max_pool(ctx, self, n, window, per_dim(dilation, n), ceil_mode, with_indices=False)


@translates(
    aten.max_pool1d_with_indices.default, aten.max_pool2d_with_indices.default,
    aten.max_pool3d_with_indices.default, checker=_max_pool_input,
)
def max_pool_with_indices(ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = _spatial_rank(ctx.node)
    window = _window(kernel_size, stride, padding, n)
    with_indices = not only_first_output_used(ctx.node)
    pooled = _max_pool(ctx, self, n, window, per_dim(dilation, n), ceil_mode, with_indices)
    return pooled if with_indices else [pooled, None]


def _bin_positions(ctx, x: ir.Value, axis: int, out: int) -> tuple[ir.Value, ir.Value, ir.Value]:
    """PyTorch's ``out`` adaptive bins along ``axis`` of ``x``: the positions of each, ``(out,
    widest bin)``, a narrower bin repeating its last position (which leaves its maximum as it
    is); and each bin's first and last position, ``(out,)``. Constants for a static length."""
    length = size_of(ctx, x, axis)
    if isinstance(length, int):
        bins = _adaptive_bins(length, out)
        width = max(end - start for start, end in bins)
        positions = [[min(start + j, end - 1) for j in range(width)] for start, end in bins]
        return (
            ctx.constant(torch.tensor(positions), ir.DataType.INT64),
            ints(ctx, [start for start, _ in bins]),
            ints(ctx, [end - 1 for _, end in bins]),
        )
    starts, ends = _bin_bounds(ctx, length, out)
    lasts = ctx.op.Sub(ends, 1)
    widest = reduce(ctx, "ReduceMax", ctx.op.Sub(ends, starts), [0], keepdims=False)
    steps = ctx.op.Unsqueeze(ctx.op.Range(0, widest, 1), ints(ctx, [0]))
    column = ints(ctx, [1])
    positions = ctx.op.Min(ctx.op.Add(ctx.op.Unsqueeze(starts, column), steps), ctx.op.Unsqueeze(lasts, column))
    return positions, starts, lasts


def _bin_bounds(ctx, length: ir.Value, out: int) -> tuple[ir.Value, ir.Value]:
    """Each adaptive bin's start, ``floor(i * length / out)``, and end, ``ceil((i + 1) * length /
    out)``, for a dynamic ``length``."""
    bins = ints(ctx, list(range(out)))
    starts = ctx.op.Div(ctx.op.Mul(bins, length), out)
    ends = ctx.op.Div(ctx.op.Add(ctx.op.Mul(ctx.op.Add(bins, 1), length), out - 1), out)
    return starts, ends


def _adaptive_max(ctx, x: ir.Value, output_size: list[int]) -> ir.Value:
    # Max is separable: gather each spatial dim's bins as (bins, widest bin) and reduce the bin.
    r, n = rank(x), len(output_size)
    y = x
    for axis, out in zip(range(r - n, r), output_size):
        positions, _, _ = _bin_positions(ctx, x, axis, out)
        y = reduce(ctx, "ReduceMax", ctx.op.Gather(y, positions, axis=axis), [axis + 1], keepdims=False)
    return y


def _adaptive_max_with_indices(ctx, x: ir.Value, output_size: list[int]) -> list[ir.Value]:
    # As in _adaptive_max, one spatial dim at a time, last dim first, so that ArgMax's first
    # maximum is PyTorch's: the first in row-major order within the bin. The flat position of
    # each maximum within its plane gathers along with the values.
    r, n = rank(x), len(output_size)
    values, indices, stride = x, None, 1
    for axis, out in reversed(list(zip(range(r - n, r), output_size))):
        positions, firsts, lasts = _bin_positions(ctx, x, axis, out)
        candidates = ctx.op.Gather(values, positions, axis=axis)
        best = ctx.op.ArgMax(candidates, axis=axis + 1, keepdims=1)
        values = ctx.op.Squeeze(ctx.op.GatherElements(candidates, best, axis=axis + 1), ints(ctx, [axis + 1]))
        per_bin = ints(ctx, list(range(1, r - axis + 1)))  # (out,) -> (out, 1, *ones for the dims after)
        firsts, lasts = ctx.op.Unsqueeze(firsts, per_bin), ctx.op.Unsqueeze(lasts, per_bin)
        here = ctx.op.Squeeze(ctx.op.Min(ctx.op.Add(firsts, best), lasts), ints(ctx, [axis + 1]))
        if indices is None:
            indices = here
        else:
            inner = ctx.op.GatherElements(ctx.op.Gather(indices, positions, axis=axis), best, axis=axis + 1)
            inner = ctx.op.Squeeze(inner, ints(ctx, [axis + 1]))
            indices = ctx.op.Add(ctx.op.Mul(here, scalar(ctx, stride, ir.DataType.INT64)), inner)
        length = size_of(ctx, x, axis)
        stride = stride * length if isinstance(stride, int) and isinstance(length, int) else ctx.op.Mul(scalar(ctx, stride, ir.DataType.INT64), length)
    return [values, indices]


@translates(
    aten.adaptive_max_pool1d.default, aten.adaptive_max_pool2d.default,
    aten.adaptive_max_pool3d.default, checker=_adaptive_max_pool_supported,
)
def adaptive_max_pool(ctx, self, output_size):
    n = _spatial_rank(ctx.node)
    output_size = per_dim(output_size, n)
    spatial = list(self.shape)[-n:]
    with_indices = not only_first_output_used(ctx.node)
    if not _evenly_divided(spatial, output_size):
        if with_indices:
            return _adaptive_max_with_indices(ctx, self, output_size)
        return [_adaptive_max(ctx, self, output_size), None]
    kernel = [s // o for s, o in zip(spatial, output_size)]
    window = dict(kernel_shape=kernel, strides=kernel, pads=[0] * 2 * n)
    pooled = _max_pool(ctx, self, n, window, [1] * n, False, with_indices)
    return pooled if with_indices else [pooled, None]


def _ceil_window_sizes(ctx, x: ir.Value, y: ir.Value, window: dict) -> ir.Value:
    """Elements, padding included, of each ceil-mode window of ``y``: the last may overhang."""
    n = len(window["kernel_shape"])
    sizes = None
    for i, (k, s, p) in enumerate(zip(window["kernel_shape"], window["strides"], window["pads"])):
        starts = ctx.op.Mul(ctx.op.Range(0, ctx.sym_size(y, 2 + i), 1), s)
        extent = ctx.op.Add(ctx.sym_size(x, 2 + i), 2 * p)
        size = ctx.op.Min(ctx.op.Sub(extent, starts), k)
        if i < n - 1:
            size = ctx.op.Unsqueeze(size, ints(ctx, list(range(1, n - i))))
        sizes = size if sizes is None else ctx.op.Mul(sizes, size)
    return cast(ctx, sizes, y.dtype)


@translates(
    aten.avg_pool1d.default, aten.avg_pool2d.default, aten.avg_pool3d.default, checker=floating_input
)
def avg_pool(
    ctx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
    divisor_override=None,
):
    n = _spatial_rank(ctx.node)
    spatial = list(self.shape)[-n:]
    window = _window(kernel_size, stride, padding, n)
    # With a divisor override, the window sums are the averages over windows with padding.
    count_include_pad = count_include_pad or divisor_override is not None

    def compute(x):
        y = ctx.op.AveragePool(
            x, ceil_mode=int(ceil_mode), count_include_pad=int(count_include_pad), **window
        )
        if ceil_mode:
            (y,) = _drop_ceil_windows_in_padding(ctx, [y], spatial, window, [1] * n)
        if divisor_override is None:
            return y
        if ceil_mode:
            sizes = _ceil_window_sizes(ctx, x, y, window)
            return ctx.op.Div(ctx.op.Mul(y, sizes), ctx.constant(divisor_override, y.dtype))
        scale = math.prod(window["kernel_shape"]) / divisor_override
        return ctx.op.Mul(y, ctx.constant(scale, y.dtype))

    return run_batched(ctx, self, n, compute)


def _adaptive_weights(ctx, length: int | ir.Value, out: int, dtype: ir.DataType) -> ir.Value:
    """The (length, out) matrix that averages each of PyTorch's adaptive bins."""
    if isinstance(length, int):
        weights = torch.zeros(length, out, dtype=torch.float64)
        for i, (start, end) in enumerate(_adaptive_bins(length, out)):
            weights[start:end, i] = 1 / (end - start)
        return ctx.constant(weights, dtype)
    starts, ends = _bin_bounds(ctx, length, out)
    positions = ctx.op.Unsqueeze(ctx.op.Range(0, length, 1), ints(ctx, [1]))
    inside = ctx.op.And(ctx.op.GreaterOrEqual(positions, starts), ctx.op.Less(positions, ends))
    sizes = ctx.op.Cast(ctx.op.Sub(ends, starts), to=dtype)
    return ctx.op.Div(ctx.op.Cast(inside, to=dtype), sizes)


def _adaptive_average(ctx, x: ir.Value, output_size: list[int]) -> ir.Value:
    # Adaptive bins are separable: average along each spatial dim with a matrix, last dim first,
    # then rotate that dim to the front of the spatial dims.
    r, n = rank(x), len(output_size)
    rotate = list(range(r - n)) + [r - 1] + list(range(r - n, r - 1))
    y = x
    for axis, out in reversed(list(zip(range(r - n, r), output_size))):
        y = ctx.op.MatMul(y, _adaptive_weights(ctx, size_of(ctx, x, axis), out, x.dtype))
        if n > 1:
            y = ctx.op.Transpose(y, perm=rotate)
    return y


@translates(
    aten.adaptive_avg_pool1d.default,
    aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d.default,
    checker=lambda node: floating_input(node) and _static_output_size(node),
)
def adaptive_avg_pool(ctx, self, output_size):
    n = _spatial_rank(ctx.node)
    output_size = per_dim(output_size, n)
    spatial = list(self.shape)[-n:]
    if all(o == 1 for o in output_size):
        return run_batched(ctx, self, n, ctx.op.GlobalAveragePool)
    if _evenly_divided(spatial, output_size):
        kernel = [s // o for s, o in zip(spatial, output_size)]
        return run_batched(
            ctx, self, n, lambda x: ctx.op.AveragePool(x, kernel_shape=kernel, strides=kernel)
        )
    return _adaptive_average(ctx, self, output_size)
