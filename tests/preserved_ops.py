"""Operators torch has a decomposition for that map to a single ONNX operator (or a short
pattern the optimizer fuses): the table must translate them whole, which
tests/test_decompositions.py checks and tests/property/coverage.py reports."""

from __future__ import annotations

import torch

aten = torch.ops.aten

PRESERVED_OPS: frozenset[torch._ops.OpOverload] = frozenset(
    {
        aten.linear.default,
        aten.addmm.default,
        aten.matmul.default,
        aten.layer_norm.default,
        aten.native_layer_norm.default,
        aten.group_norm.default,
        aten.native_group_norm.default,
        aten.batch_norm.default,
        aten._native_batch_norm_legit_no_training.default,
        aten.scaled_dot_product_attention.default,
        aten.gelu.default,
        aten.silu.default,
        aten.hardswish.default,
        aten.hardsigmoid.default,
        aten.elu.default,
        aten.leaky_relu.default,
        aten.softplus.default,
        aten._softmax.default,
        aten._log_softmax.default,
        aten.softmax.int,
        aten.log_softmax.int,
        aten.var.correction,
        aten.std.correction,
        aten.mean.dim,
        aten.embedding.default,
        aten.stack.default,
        aten.split.Tensor,
        aten.split_with_sizes.default,
        aten.unbind.int,
        aten.flatten.using_ints,
        aten.t.default,
        aten.expand_as.default,
        aten.masked_fill.Scalar,
        aten.masked_fill.Tensor,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
        aten.conv1d.default,
        aten.conv2d.default,
        aten.conv3d.default,
        aten.convolution.default,
        aten.conv_transpose1d.default,
        aten.conv_transpose2d.input,
        aten.conv_transpose3d.input,
        aten.max_pool2d.default,
        aten.avg_pool2d.default,
        aten.adaptive_avg_pool2d.default,
        aten.clamp_min.default,
        aten.clamp_max.default,
        aten.baddbmm.default,
        aten.lstm.input,
        aten.gru.input,
    }
)
