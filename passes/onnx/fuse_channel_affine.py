"""A per-channel scale and shift, ``x * s + b`` with constants that vary along dim 1 only (a
group norm's affine after its groups are merged back, a batch norm written out) ->
BatchNormalization with mean 0, variance 1 and epsilon 0, whose result is ``x * s + b`` again
(its division by ``sqrt(1 + 0)`` is exact).

One pass over the tensor instead of two: 0.014 ms against 0.026 ms for Mul + Add over
2x16x64x64 float32 in onnxruntime (one thread), the same bits. It runs before
``fuse_conv_batchnorm``, so that an affine right after a Conv folds into its weights.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.patterns import channel_vector, per_channel_operand
from dynexport.passes.onnx.values import add_initializer, insert_replacement, nodes_of

__all__ = ["fuse_channel_affine"]

_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


def fuse_channel_affine(graph: ir.Graph) -> int:
    """Replace each per-channel Mul-then-Add of a float32 or float64 tensor of rank 3 or more by
    one BatchNormalization; return how many."""
    fused = 0
    for multiply in nodes_of(graph, "Mul"):
        fused += _fuse(graph, multiply)
    return fused


def _fuse(graph: ir.Graph, multiply: ir.Node) -> bool:
    output = multiply.outputs[0]
    if output.dtype not in _TYPES or output.shape is None or len(output.shape) < 3:
        return False
    rank, channels = len(output.shape), output.shape[1]
    if not isinstance(channels, int) or len(multiply.inputs) != 2:
        return False
    shifted = per_channel_operand(output, "Add", channels, rank)
    for x, other in (multiply.inputs, multiply.inputs[::-1]):
        scale = channel_vector(other, channels, rank)
        if shifted is None or scale is None or x.shape is None or len(x.shape) != rank or x.shape[1] != channels:
            continue
        dtype = output.dtype.numpy()
        parameters = [
            add_initializer(graph, np.asarray(array, dtype), name)
            for array, name in (
                (scale, "channel_scale"),
                (shifted[1], "channel_shift"),
                (np.zeros(channels), "channel_mean"),
                (np.ones(channels), "channel_variance"),
            )
        ]
        norm = ir.Node("", "BatchNormalization", [x, *parameters], [ir.AttrFloat32("epsilon", 0.0)])
        if not insert_replacement(graph, shifted[0], norm, shifted[0].outputs[0]):
            return False
        # Gone now, not at the next dead-code sweep: the layer before may fold the norm only
        # when it is x's one reader.
        graph.remove([shifted[0], multiply], safe=True)
        return True
    return False
