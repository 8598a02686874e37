"""Padding: constant, reflect, replicate and circular, each one ONNX Pad.

PyTorch lists pads from the last dim backwards, (left, right) per dim; negative pads crop, in
every mode, before reflecting, replicating or wrapping. ONNX Pad does the same with its ``axes``
naming the padded dims (``_helpers.pad`` writes them in the form of the target opset).
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import computed_in, ints, rank, scalar, size_of, with_shape
from dynexport.ops._helpers import pad as onnx_pad
from dynexport.registry import translates

aten = torch.ops.aten

_ONNX_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
# at::padding_mode, the int that aten._pad_enum takes.
_ENUM_MODES = ["reflect", "replicate", "circular", "constant"]


def _pads(x: ir.Value, pad) -> tuple[list, list[int]]:
    """ONNX Pad's pads and axes for a PyTorch pad list."""
    lefts, rights = pad[0::2], pad[1::2]
    return [*lefts, *rights], [rank(x) - 1 - i for i in range(len(lefts))]


def _fill(ctx, value, dtype: ir.DataType) -> ir.Value:
    # An integer tensor padded with a float value takes it truncated, as PyTorch's fill does.
    if isinstance(value, float) and dtype != ir.DataType.BOOL and not dtype.is_floating_point():
        value = int(value)
    return scalar(ctx, 0 if value is None else value, dtype)


def _pad(ctx, self, pad, mode: str, value=None) -> ir.Value:
    if mode == "constant":
        # onnxruntime's Pad has no int16 kernel.
        return computed_in(
            ctx, self, {ir.DataType.INT16: ir.DataType.INT32},
            lambda x: onnx_pad(ctx, x, *_pads(x, pad), _fill(ctx, value, x.dtype)),
        )
    if mode == "replicate" and any(isinstance(p, int) and p < 0 for p in pad) and _static_ints(pad):
        return _replicate_by_gather(ctx, self, pad)
    if any(isinstance(p, int) and p < 0 for p in pad):
        # onnxruntime rejects negative pads outside constant mode: crop first, then pad.
        self = _crop(ctx, self, pad)
        pad = [p if not isinstance(p, int) else max(p, 0) for p in pad]
        if not any(pad):
            return self
    return onnx_pad(ctx, self, *_pads(self, pad), mode=_ONNX_MODES[mode])


def _static_ints(pad) -> bool:
    return all(isinstance(p, int) for p in pad)


def _replicate_by_gather(ctx, self, pad) -> ir.Value:
    """Replicate padding with negative pads: position j of a dim reads the input at
    clamp(j - left, 0, size - 1), as PyTorch does, even where the crop leaves nothing."""
    for i, (left, right) in enumerate(zip(pad[0::2], pad[1::2])):
        if left == right == 0:
            continue
        axis = rank(self) - 1 - i
        size = size_of(ctx, self, axis)
        if isinstance(size, int):
            positions = ints(ctx, torch.arange(size + left + right).sub(left).clamp(0, size - 1).tolist())
        else:
            length = ctx.op.Add(size, ctx.constant(left + right, ir.DataType.INT64))
            shifted = ctx.op.Sub(ctx.op.Range(ctx.constant(0, ir.DataType.INT64), length, ctx.constant(1, ir.DataType.INT64)), ctx.constant(left, ir.DataType.INT64))
            last = ctx.op.Sub(size, ctx.constant(1, ir.DataType.INT64))
            positions = ctx.op.Max(ctx.op.Min(shifted, last), ctx.constant(0, ir.DataType.INT64))
        shape = None if self.shape is None else [*self.shape[:axis], None, *self.shape[axis + 1:]]
        self = with_shape(ctx.op.Gather(self, positions, axis=axis), shape)
    return self


def _crop(ctx, self, pad) -> ir.Value:
    """``self`` with the negative pads of ``pad`` cut off."""
    starts, ends, axes = [], [], []
    for i, (left, right) in enumerate(zip(pad[0::2], pad[1::2])):
        left, right = (p if isinstance(p, int) else 0 for p in (left, right))
        if left < 0 or right < 0:
            starts.append(max(-left, 0))
            ends.append(right if right < 0 else 2**63 - 1)
            axes.append(-1 - i)
    return with_shape(ctx.op.Slice(self, ints(ctx, starts), ints(ctx, ends), ints(ctx, axes)), [None] * rank(self))


def _wrap_composed(ctx, self, pad) -> ir.Value:
    """Circular padding from slices: onnxruntime's CPU Pad has no ``wrap`` mode (ONNX's since
    opset 19), so Pad(wrap) is used only where the pads are symbolic."""
    y = _crop(ctx, self, pad) if any(p < 0 for p in pad) else self
    for i, (left, right) in enumerate(zip(pad[0::2], pad[1::2])):
        axis = ints(ctx, [-1 - i])
        pieces = [y]
        if left > 0:
            pieces.insert(0, ctx.op.Slice(y, ints(ctx, [-left]), ints(ctx, [2**63 - 1]), axis))
        if right > 0:
            pieces.append(ctx.op.Slice(y, ints(ctx, [0]), ints(ctx, [right]), axis))
        if len(pieces) > 1:
            y = ctx.op.Concat(*pieces, axis=-1 - i)
    return y


def _static_pads(node: torch.fx.Node) -> bool:
    return all(isinstance(p, int) for p in node.args[1])


def _mode(node: torch.fx.Node) -> str:
    if node.target is aten._pad_circular.default:
        return "circular"
    if node.target is aten._pad_enum.default:
        return _ENUM_MODES[node.args[2]]
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")


@translates(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, self, pad, value=0):
    return _pad(ctx, self, pad, "constant", value)


@translates(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(ctx, self, padding):
    return _pad(ctx, self, padding, "reflect")


@translates(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(ctx, self, padding):
    return _pad(ctx, self, padding, "replicate")


# Before opset 19 (no Pad ``wrap``) symbolic circular pads have no rule: the node decomposes.
@translates(aten.pad.default, aten._pad_enum.default, aten._pad_circular.default, min_opset=19)
@translates(
    aten.pad.default, aten._pad_enum.default, aten._pad_circular.default,
    checker=lambda node: _mode(node) != "circular" or _static_pads(node),
)
def pad(ctx, self, pad, mode="constant", value=None):
    mode = _mode(ctx.node)
    if mode == "circular" and _static_pads(ctx.node):
        return _wrap_composed(ctx, self, pad)
    return _pad(ctx, self, pad, mode, value)
