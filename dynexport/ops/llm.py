"""dynexport's whole decoder ops (passes/fx/fuse_llm.py puts them in place of their ATen
patterns) as ONNX's RMSNormalization and RotaryEmbedding (opset 23)."""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import shape_tensor, size_of
from dynexport.passes.fx import llm_ops  # noqa: F401  (defines the dynexport:: ops)
from dynexport.registry import translates

fused_ops = torch.ops.dynexport


@translates(fused_ops.rms_norm.default, min_opset=23)
def rms_norm(ctx, x, scale, epsilon):
    # stash_type 1: the mean and the root in float32, as LlamaRMSNorm computes them.
    return ctx.op.RMSNormalization(x, scale, axis=-1, epsilon=float(epsilon), stash_type=int(ir.DataType.FLOAT))


@translates(fused_ops.rotary_embedding.default, min_opset=23)
def rotary_embedding(ctx, x, cos, sin):
    if cos.shape[0] == 1 and x.shape[0] != 1:
        # Tables shared by the batch (positions counted from the cache): the op takes one per row.
        tables = shape_tensor(ctx, [size_of(ctx, x, 0), size_of(ctx, cos, 1), size_of(ctx, cos, 2)])
        cos, sin = ctx.op.Expand(cos, tables), ctx.op.Expand(sin, tables)
    return ctx.op.RotaryEmbedding(x, cos, sin, interleaved=0)
