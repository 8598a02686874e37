"""``Resize`` with an ``axes`` attribute -> the same Resize with scales (of 1 on the other dims,
any input of known rank) or sizes (the other dims' static sizes) for every dim.

The two compute the same, but onnxruntime's NCHWc layout optimizer only rewrites a Resize whose
sizes or scales cover every dim into its blocked-layout Upsample; one with ``axes`` runs in NCHW
between reorders (DeepLabV3-MobileNetV3 at 224 px: its two Resizes take 1.7 ms against 0.4 ms).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import add_initializer, constant_array, nodes_of

__all__ = ["full_rank_resize"]


def full_rank_resize(graph: ir.Graph) -> int:
    """Rewrite each eligible Resize to cover every dim; return how many."""
    rewritten = 0
    for node in nodes_of(graph, "Resize"):
        x = node.inputs[0]
        if "axes" not in node.attributes or x.shape is None:
            continue
        policy = node.attributes.get("keep_aspect_ratio_policy")
        if policy is not None and policy.as_string() != "stretch":
            continue
        _, roi, scales, sizes = list(node.inputs) + [None] * (4 - len(node.inputs))
        if roi is not None and (constant_array(roi) is None or constant_array(roi).size):
            continue  # a roi per resized axis would need widening too
        axes = np.array(node.attributes["axes"].as_ints()) % len(x.shape)
        if sizes is not None:
            if not all(isinstance(d, int) for i, d in enumerate(x.shape) if i not in axes):
                continue  # a dynamic dim kept as it is has no size to write
            index, name = 3, "resize_sizes"
            full = np.array([d if isinstance(d, int) else 0 for d in x.shape], dtype=np.int64)
        else:
            index, full, name = 2, np.ones(len(x.shape), np.float32), "resize_scales"
        given = constant_array(node.inputs[index])
        if given is None or given.size != axes.size:
            continue
        full[axes] = given
        node.replace_input_with(index, add_initializer(graph, full.astype(given.dtype), name))
        del node.attributes["axes"]
        rewritten += 1
    return rewritten
