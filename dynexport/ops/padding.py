"""Padding: constant, reflect, replicate and circular, each one ONNX Pad.

PyTorch lists pads from the last dim backwards, (left, right) per dim; negative pads crop, in
every mode, before reflecting, replicating or wrapping. ONNX Pad does the same with its ``axes``
input naming the padded dims.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import ints, scalar, shape_tensor
from dynexport.registry import translates

aten = torch.ops.aten

_ONNX_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
# at::padding_mode, the int that aten._pad_enum takes.
_ENUM_MODES = ["reflect", "replicate", "circular", "constant"]


def _pads(ctx, pad) -> tuple[ir.Value, ir.Value]:
    """ONNX Pad's ``pads`` and ``axes`` inputs for a PyTorch pad list."""
    lefts, rights = pad[0::2], pad[1::2]
    return shape_tensor(ctx, [*lefts, *rights]), ints(ctx, [-1 - i for i in range(len(lefts))])


def _fill(ctx, value, dtype: ir.DataType) -> ir.Value:
    # An integer tensor padded with a float value takes it truncated, as PyTorch's fill does.
    if isinstance(value, float) and dtype != ir.DataType.BOOL and not dtype.is_floating_point():
        value = int(value)
    return scalar(ctx, 0 if value is None else value, dtype)


def _pad(ctx, self, pad, mode: str, value=None) -> ir.Value:
    pads, axes = _pads(ctx, pad)
    if mode == "constant":
        return ctx.op.Pad(self, pads, _fill(ctx, value, self.dtype), axes, mode="constant")
    return ctx.op.Pad(self, pads, None, axes, mode=_ONNX_MODES[mode])


def _wrap_composed(ctx, self, pad) -> ir.Value:
    """Circular padding from slices, for opsets before Pad's ``wrap`` mode (19)."""
    y = self
    for i, (left, right) in enumerate(zip(pad[0::2], pad[1::2])):
        axis = ints(ctx, [-1 - i])
        if left < 0 or right < 0:
            end = right if right < 0 else 2**63 - 1
            y = ctx.op.Slice(y, ints(ctx, [max(-left, 0)]), ints(ctx, [end]), axis)
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


@translates(aten.pad.default, aten._pad_enum.default, aten._pad_circular.default, min_opset=19)
def pad(ctx, self, pad, mode="constant", value=None):
    return _pad(ctx, self, pad, _mode(ctx.node), value)


@translates(
    aten.pad.default, aten._pad_enum.default, aten._pad_circular.default,
    checker=lambda node: _mode(node) != "circular" or _static_pads(node),
)
def pad_before_wrap(ctx, self, pad, mode="constant", value=None):
    mode = _mode(ctx.node)
    if mode == "circular":
        return _wrap_composed(ctx, self, pad)
    return _pad(ctx, self, pad, mode, value)
