"""Sampling category indices: ``torch.multinomial``.

With replacement, ONNX Multinomial draws from the log of the weights (it takes unnormalized log
probabilities). Without replacement, the indices are the ``num_samples`` largest of
``log(weight) + Gumbel noise``: the Gumbel-top-k trick, which has the distribution of drawing
one category at a time and removing it. ONNX draws from its own generator, so samples follow
PyTorch's distribution, never its stream.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import cast, ints, rank, shape_tensor
from dynexport.registry import translates

aten = torch.ops.aten

_FLOAT = ir.DataType.FLOAT
# Uniform samples are kept inside (0, 1): the Gumbel noise -log(-log(u)) is finite there.
_TINY = 1e-20


def _log_weights(ctx, weights: ir.Value) -> ir.Value:
    """log(weights) in float32 (onnxruntime's Multinomial takes no other type): zero weights
    give -inf, never drawn."""
    return ctx.op.Log(cast(ctx, weights, _FLOAT))


def _with_replacement(ctx, log_weights: ir.Value, num_samples: int) -> ir.Value:
    return ctx.op.Multinomial(log_weights, sample_size=num_samples, dtype=ir.DataType.INT64)


def _without_replacement(ctx, log_weights: ir.Value, num_samples: int) -> ir.Value:
    u = ctx.op.RandomUniformLike(log_weights, dtype=_FLOAT, low=_TINY, high=1.0 - 1e-7)
    gumbel = ctx.op.Neg(ctx.op.Log(ctx.op.Neg(ctx.op.Log(u))))
    _, indices = ctx.op.TopK(
        ctx.op.Add(log_weights, gumbel), shape_tensor(ctx, [num_samples]), axis=-1, largest=1, sorted=1, _outputs=2
    )
    return indices


@translates(aten.multinomial.default)
def multinomial(ctx, self, num_samples, replacement=False, *, generator=None):
    rows = self if rank(self) == 2 else ctx.op.Unsqueeze(self, ints(ctx, [0]))
    log_weights = _log_weights(ctx, rows)
    # Drawing one sample is the same with or without replacement; Multinomial is one op.
    draw = _with_replacement if replacement or num_samples == 1 else _without_replacement
    samples = draw(ctx, log_weights, num_samples)
    return samples if rank(self) == 2 else ctx.op.Squeeze(samples, ints(ctx, [0]))
