"""``x * Reciprocal(y)`` -> ``x / y`` (RMS norm's ``x * rsqrt(mean(x**2) + eps)``, as LLaMA,
Mistral, Qwen2 and Gemma write it).

One node fewer and one rounding fewer; the same on zeros, infinities and NaN (``x * (1 / 0)`` and
``x / 0`` are both ±inf, or NaN for ``x = 0``). It is also the form onnxruntime's own
SimplifiedLayerNormalization fusion recognizes: ``x / Sqrt(ReduceMean(x**2) + eps) * w`` becomes
one kernel at session creation, where the reciprocal form stays seven nodes.
"""

from __future__ import annotations

import onnx_ir as ir

from dynexport.passes.onnx.values import insert_replacement, nodes_of, single_consumer

__all__ = ["fuse_division"]


def fuse_division(graph: ir.Graph) -> int:
    """Rewrite every product with a reciprocal read only by it as a division; return how many."""
    fused = 0
    for reciprocal in nodes_of(graph, "Reciprocal"):
        multiply = single_consumer(reciprocal.outputs[0])
        if multiply is None or multiply.op_type != "Mul" or multiply.domain not in ("", "ai.onnx"):
            continue
        inverse = reciprocal.outputs[0]
        x = multiply.inputs[1] if multiply.inputs[0] is inverse else multiply.inputs[0]
        if x is inverse:
            continue
        divide = ir.Node("", "Div", [x, reciprocal.inputs[0]])
        if insert_replacement(graph, multiply, divide, multiply.outputs[0]):
            # Gone now, so that the fusions after this one see y read by the division alone.
            graph.remove([reciprocal, multiply], safe=True)
            fused += 1
    return fused
