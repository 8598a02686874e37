"""ONNX sequences: lists of tensors whose length is only known at run time.

The ``dynexport::sequence_*`` operators (:mod:`dynexport.torchscript.lists`) stand for them in the FX
graph, where a sequence is a 0-d *handle* tensor: each maps to one ONNX sequence operator, and
its result is given the ONNX sequence type (``seq(tensor(T))``) that the handle's metadata cannot
say. A loop or branch passes a handle through like any other value (see ``control_flow``).
"""

from __future__ import annotations

import operator

import onnx_ir as ir
import torch

from dynexport.dtypes import to_onnx_dtype
from dynexport.ops._helpers import scalar
from dynexport.registry import translates
from dynexport.torchscript import lists  # noqa: F401  (defines the operators translated here)

dynexport_ops = torch.ops.dynexport
higher_order = torch.ops.higher_order

_INT64 = ir.DataType.INT64


@translates(dynexport_ops.sequence_empty.default)
def sequence_empty(ctx):
    dtype = to_onnx_dtype(_inserted_dtype(ctx.node) or torch.float32)
    return ctx.op.SequenceEmpty(dtype=int(dtype))


@translates(dynexport_ops.sequence_construct.default)
def sequence_construct(ctx, tensors):
    return ctx.op.SequenceConstruct(*tensors)


@translates(dynexport_ops.sequence_insert.default)
def sequence_insert(ctx, sequence, element):
    return ctx.op.SequenceInsert(sequence, element)


@translates(dynexport_ops.sequence_set.default)
def sequence_set(ctx, sequence, position, element):
    position = scalar(ctx, position, _INT64)
    return ctx.op.SequenceInsert(ctx.op.SequenceErase(sequence, position), element, position)


@translates(dynexport_ops.sequence_at.default)
def sequence_at(ctx, sequence, index, dtype, shape):
    return ctx.op.SequenceAt(sequence, scalar(ctx, index, _INT64))


@translates(dynexport_ops.sequence_length.default)
def sequence_length(ctx, sequence):
    return ctx.op.SequenceLength(sequence)


@translates(dynexport_ops.sequence_concat.default)
def sequence_concat(ctx, sequence, dim, new_axis, dtype, shape):
    return ctx.op.ConcatFromSequence(sequence, axis=dim, new_axis=int(new_axis))


@translates(dynexport_ops.sequence_split.default)
def sequence_split(ctx, self, split_size, dim, keepdim):
    if not keepdim:
        # Pieces of one, squeezed: ONNX ignores keepdims when given a split size.
        return ctx.op.SplitToSequence(self, axis=dim, keepdims=0)
    return ctx.op.SplitToSequence(self, scalar(ctx, split_size, _INT64), axis=dim)


def _inserted_dtype(start: torch.fx.Node) -> torch.dtype | None:
    """The dtype of the tensors inserted into the sequence an empty sequence starts: ONNX's
    ``SequenceEmpty`` must name it, TorchScript's ``[]`` does not. The sequence is followed
    through inserts and into the bodies of loops and branches it is passed to."""
    pending, seen = [start], set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        for user in node.users:
            if user.target is dynexport_ops.sequence_insert.default:
                return user.args[1].meta["val"].dtype
            if user.target is dynexport_ops.sequence_set.default:
                return user.args[2].meta["val"].dtype
            pending += _same_sequence(node, user)
    return None


def _same_sequence(node: torch.fx.Node, user: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes ``user`` passes ``node`` on as, when ``node`` is a sequence handle."""
    if user.target is operator.getitem or user.target is torch.ops.aten.clone.default:
        return [user]
    if user.target is higher_order.while_loop:
        _, _, carried, invariant = user.args
        positions = [i for i, value in enumerate([*carried, *invariant]) if value is node]
        bodies = [_submodule(user, argument) for argument in user.args[:2]]
        return [_placeholders(body)[i] for body in bodies for i in positions]
    if user.target is higher_order.cond:
        operands = user.args[3]
        positions = [i for i, value in enumerate(operands) if value is node]
        branches = [_submodule(user, argument) for argument in user.args[1:3]]
        return [_placeholders(branch)[i] for branch in branches for i in positions]
    return []


def _submodule(node: torch.fx.Node, attribute: torch.fx.Node) -> torch.fx.GraphModule:
    return node.graph.owning_module.get_submodule(attribute.target)


def _placeholders(module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [node for node in module.graph.nodes if node.op == "placeholder"]

