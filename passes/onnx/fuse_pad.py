"""Zero ``Pad`` of the spatial dims -> the ``pads`` of the Conv that reads it.

TensorFlow-style "same" padding (transformers' MobileNet with ``tf_padding``) pads each Conv's
input by a separate Pad node, whose amounts fold to constants at static sizes: the Conv pads
the same zeros itself, without writing the padded copy.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import (
    constant_array,
    constant_scalar,
    insert_replacement,
    nodes_of,
    producer,
    single_consumer,
)

__all__ = ["fuse_pad"]


def fuse_pad(graph: ir.Graph) -> int:
    """Merge each eligible Pad into the Conv after it; return how many."""
    fused = 0
    for conv in nodes_of(graph, "Conv"):
        pad = producer(conv.inputs[0], "Pad")
        if pad is None or single_consumer(pad.outputs[0]) is not conv or _auto_pads(conv):
            continue
        amounts = _zero_padding(pad)
        rank = len(amounts) // 2 if amounts is not None else 0
        if amounts is None or any(amounts[i] or amounts[rank + i] for i in (0, 1)) or (amounts < 0).any():
            continue
        spatial = rank - 2
        pads = conv.attributes["pads"].as_ints() if "pads" in conv.attributes else [0] * (2 * spatial)
        merged = [int(p) + int(a) for p, a in zip(pads, [*amounts[2:rank], *amounts[rank + 2:]])]
        attributes = [a for name, a in conv.attributes.items() if name != "pads"] + [ir.AttrInt64s("pads", merged)]
        fused_conv = ir.Node("", "Conv", [pad.inputs[0], *conv.inputs[1:]], attributes)
        fused += insert_replacement(graph, conv, fused_conv, conv.outputs[0])
    return fused


def _auto_pads(conv: ir.Node) -> bool:
    return "auto_pad" in conv.attributes and conv.attributes["auto_pad"].as_string() != "NOTSET"


def _zero_padding(pad: ir.Node):
    """The constant amounts of a constant-mode Pad by zeros, begins then ends of every axis (those
    its ``axes`` input leaves out padded by 0), else None."""
    if "mode" in pad.attributes and pad.attributes["mode"].as_string() != "constant":
        return None
    x, amounts, value, axes = list(pad.inputs) + [None] * (4 - len(pad.inputs))
    if value is not None and constant_scalar(value) != 0:
        return None
    amounts = constant_array(amounts)
    rank = len(x.shape) if x.shape is not None else 0
    axes = np.arange(rank) if axes is None else constant_array(axes)
    if amounts is None or axes is None or not rank or amounts.shape != (2 * axes.size,):
        return None
    axes = axes.reshape(-1) % rank
    if len(set(axes.tolist())) != axes.size:
        return None
    full = np.zeros(2 * rank, dtype=np.int64)
    full[axes], full[rank + axes] = amounts[: axes.size], amounts[axes.size :]
    return full
