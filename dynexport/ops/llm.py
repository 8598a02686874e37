"""dynexport's whole decoder ops (passes/fx/fuse_llm.py puts them in place of their ATen
patterns) as ONNX's RMSNormalization and RotaryEmbedding (opset 23)."""

from __future__ import annotations

import onnx_ir as ir

import torch

from dynexport.passes.fx import llm_ops  # noqa: F401  (defines the dynexport:: ops)
from dynexport.registry import translates

fused_ops = torch.ops.dynexport


@translates(fused_ops.rms_norm.default, min_opset=23)
def rms_norm(ctx, x, scale, epsilon):
    # stash_type 1: the mean and the root in float32, as LlamaRMSNorm computes them.
    return ctx.op.RMSNormalization(x, scale, axis=-1, epsilon=float(epsilon), stash_type=int(ir.DataType.FLOAT))


@translates(fused_ops.rotary_embedding.default, min_opset=23)
def rotary_embedding(ctx, x, cos, sin):
    return ctx.op.RotaryEmbedding(x, cos, sin, interleaved=0)
