"""Passes over the translated onnx_ir model, run by :func:`optimize_model` in a fixed order:

1. ``lift_constants``: Constant nodes become initializers (one kind of constant, no node).
2. Simplification, repeated until nothing changes (at most ``_MAX_ROUNDS`` rounds):
   ``fold_shapes`` (symbolic shape arithmetic; Reshape/Expand targets), ``fold_constants``
   (onnx's reference evaluator, size-limited), ``remove_no_ops``, ``collapse_chains``,
   ``deduplicate_initializers``, ``eliminate_common_subexpressions``.
3. Fusions: ``fuse_gemm``, ``fuse_layer_norm`` (opset 17), ``fuse_instance_norm``,
   ``fuse_channel_affine`` (a per-channel Mul + Add as BatchNormalization),
   ``fuse_conv_batchnorm`` (into Conv, ConvTranspose and the Gemms just made), ``fuse_clip``,
   ``fuse_pad``, ``full_rank_resize``, ``fuse_gelu`` (opset 20), ``fuse_division``, ``fuse_rms_norm``
   and ``fuse_attention`` (opset 23): each emits only ops of the model's opset, in that opset's
   form. With ``target="onnxruntime"``, then ``fuse_multi_head_attention`` (com.microsoft).
4. ``remove_dead_code``, then ``fold_constants`` once more (what the fusions left computable
   from constants), ``remove_dead_code``, ``deduplicate_initializers`` (the fusions' own
   constants), ``make_names_unique``.

Every pass runs on each subgraph too (If branches, Loop and Scan bodies), one graph at a time; a
subgraph's constants become its own initializers, and names are made unique across all graphs.

Without ``fold_constants`` the two folding passes and the Conv+BatchNorm fusion (which relies
on folding) are skipped. docs/optimizer.md describes each pass.
"""

from __future__ import annotations

import functools

import onnx_ir as ir

from dynexport.passes.onnx.collapse_chains import collapse_chains
from dynexport.passes.onnx.common_subexpressions import eliminate_common_subexpressions
from dynexport.passes.onnx.dead_code import remove_dead_code
from dynexport.passes.onnx.deduplicate_initializers import deduplicate_initializers
from dynexport.passes.onnx.fold_constants import fold_constants as fold_constants_at
from dynexport.passes.onnx.fold_shapes import fold_shapes
from dynexport.passes.onnx.full_rank_resize import full_rank_resize
from dynexport.passes.onnx.fuse_attention import fuse_attention
from dynexport.passes.onnx.fuse_channel_affine import fuse_channel_affine
from dynexport.passes.onnx.fuse_clip import fuse_clip
from dynexport.passes.onnx.fuse_conv_batchnorm import fuse_conv_batchnorm
from dynexport.passes.onnx.fuse_division import fuse_division
from dynexport.passes.onnx.fuse_gelu import fuse_gelu
from dynexport.passes.onnx.fuse_gemm import fuse_gemm
from dynexport.passes.onnx.fuse_instance_norm import fuse_instance_norm
from dynexport.passes.onnx.fuse_layer_norm import fuse_layer_norm
from dynexport.passes.onnx.fuse_multi_head_attention import fuse_multi_head_attention
from dynexport.passes.onnx.fuse_pad import fuse_pad
from dynexport.passes.onnx.fuse_rms_norm import fuse_rms_norm
from dynexport.passes.onnx.lift_constants import lift_constants
from dynexport.passes.onnx.naming import make_names_unique
from dynexport.passes.onnx.remove_no_ops import remove_no_ops
from dynexport.passes.onnx.values import MICROSOFT_DOMAIN

__all__ = ["make_names_unique", "optimize_model", "remove_dead_code"]

_MAX_ROUNDS = 4
# Fusions whose result depends on the opset: each emits only ops that exist at it, in its form.
_OPSET_DEPENDENT_FUSIONS = frozenset(
    {fuse_layer_norm, fuse_gelu, fuse_rms_norm, fuse_attention, fuse_multi_head_attention}
)
# target="onnxruntime": fusions into com.microsoft operators, each kept because
# benchmarks/graph_quality.py measures it faster in onnxruntime (docs/optimizer.md). They run
# last, on what the standard fusions leave (LayerNormalization made from its formula; at opset
# 23 attention stays the standard Attention).
_ONNXRUNTIME_FUSIONS = (fuse_multi_head_attention,)


def optimize_model(
    model: ir.Model,
    *,
    fold_constants: bool = True,
    clamps_as_clip: bool = True,
    shifted_norms: bool = False,
    target: str | None = None,
) -> None:
    """Optimize ``model`` in place, its main graph and every subgraph (If branches, Loop and
    Scan bodies); ``fold_constants=False`` evaluates nothing; ``clamps_as_clip=False`` keeps
    clamps to constant bounds as Max and Min, whose NaN propagation the ONNX standard defines
    (Clip's it leaves open; onnxruntime's Clip propagates NaN too); ``shifted_norms=True``
    feeds InstanceNormalization each channel less its first element, exact where the mean is
    large against the spread (``fuse_instance_norm``); ``target="onnxruntime"``
    also fuses into onnxruntime's com.microsoft operators where they are faster there."""
    graph = model.graph
    # Subgraphs import no opsets of their own: every graph is at the model's opset.
    opset = model.opset_imports.get("", 1)
    fold_constant_nodes = functools.partial(fold_constants_at, opset=opset)
    # Outermost first: removing dead code runs innermost first (reversed), so that an outer value
    # read only by a dead node of a subgraph is dead by the time its own graph is cleaned.
    graphs = [graph, *graph.subgraphs()]
    for each in graphs:
        lift_constants(each)
    cleanups = [remove_no_ops, collapse_chains, deduplicate_initializers, eliminate_common_subexpressions]
    if fold_constants:
        cleanups = [fold_shapes, fold_constant_nodes, *cleanups]
    for _ in range(_MAX_ROUNDS):
        changed = sum(cleanup(each) for each in graphs for cleanup in cleanups)
        _remove_dead_code(graphs)
        if not changed:
            break
    contrib = _ONNXRUNTIME_FUSIONS if target == "onnxruntime" else ()
    fusions = [
        fuse_gemm,
        fuse_layer_norm,
        functools.partial(fuse_instance_norm, shifted=shifted_norms),
        fuse_channel_affine,
        *([fuse_conv_batchnorm] if fold_constants else []),
        *([fuse_clip] if clamps_as_clip else []),
        fuse_pad,
        full_rank_resize,
        fuse_gelu,
        fuse_division,
        fuse_rms_norm,
        fuse_attention,
        *contrib,
    ]
    fusions = [functools.partial(f, opset=opset) if f in _OPSET_DEPENDENT_FUSIONS else f for f in fusions]
    if sum(fuse(each) for each in graphs for fuse in fusions):
        _remove_dead_code(graphs)
        if fold_constants:
            for each in graphs:
                fold_constant_nodes(each)
            _remove_dead_code(graphs)
        for each in graphs:  # the fusions' own constants: each Clip's bounds, each norm's scale
            deduplicate_initializers(each)
    if any(node.domain == MICROSOFT_DOMAIN for each in graphs for node in each):
        model.opset_imports.setdefault(MICROSOFT_DOMAIN, 1)
    make_names_unique(graph)


def _remove_dead_code(graphs: list[ir.Graph]) -> None:
    for graph in reversed(graphs):
        remove_dead_code(graph)
