"""Random numbers: rand/randn/randint and their _like forms, randperm, bernoulli, normal,
uniform, exponential, multinomial, and dropout in training.

Every sample starts from ONNX RandomUniformLike or RandomNormalLike applied to a tensor of the
output's shape, so shapes read from the inputs at run time stay dynamic. Samples are drawn in
float32 (float64 for float64 outputs) and cast; ONNX draws from its own generator, so values
match PyTorch's distributions, never its streams.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import cast, ints, rank, scalar, shape_of, shape_tensor
from dynexport.registry import translates

aten = torch.ops.aten

_FLOAT = ir.DataType.FLOAT
_DOUBLE = ir.DataType.DOUBLE
# The largest value below 1 in each narrow float type: a float32 sample just below 1 would round
# up to 1 when cast, and rand's range excludes 1.
_BELOW_ONE = {ir.DataType.FLOAT16: 1 - 2**-11, ir.DataType.BFLOAT16: 1 - 2**-8}


def _drawing_type(dtype: ir.DataType) -> ir.DataType:
    return _DOUBLE if dtype == _DOUBLE else _FLOAT


def _shaped(ctx, shape: ir.Value) -> ir.Value:
    """A tensor of ``shape`` (zeros) for the *Like random ops to take their shape from."""
    return ctx.op.ConstantOfShape(shape)


def _uniform(ctx, shape: ir.Value, dtype: ir.DataType) -> ir.Value:
    """Samples in [0, 1), drawn in float32 or float64: ``dtype`` picks which."""
    return ctx.op.RandomUniformLike(_shaped(ctx, shape), dtype=_drawing_type(dtype), low=0.0, high=1.0)


def _normal(ctx, shape: ir.Value, dtype: ir.DataType) -> ir.Value:
    return ctx.op.RandomNormalLike(_shaped(ctx, shape), dtype=_drawing_type(dtype), mean=0.0, scale=1.0)


def _rand(ctx, shape: ir.Value) -> ir.Value:
    dtype = ctx.out_dtype
    u = _uniform(ctx, shape, dtype)
    if dtype in _BELOW_ONE:
        u = ctx.op.Min(u, ctx.constant(_BELOW_ONE[dtype], _FLOAT))
    return cast(ctx, u, dtype)


def _randint(ctx, shape: ir.Value, low, high) -> ir.Value:
    u = _uniform(ctx, shape, _DOUBLE)
    low, high = scalar(ctx, low, _DOUBLE), scalar(ctx, high, _DOUBLE)
    return cast(ctx, ctx.op.Add(ctx.op.Floor(ctx.op.Mul(u, ctx.op.Sub(high, low))), low), ctx.out_dtype)


@translates(aten.rand.default)
def rand(ctx, size, *, dtype=None):
    return _rand(ctx, shape_tensor(ctx, size))


@translates(aten.rand_like.default)
def rand_like(ctx, self, *, dtype=None):
    return _rand(ctx, ctx.op.Shape(self))


@translates(aten.randn.default)
def randn(ctx, size, *, dtype=None):
    return cast(ctx, _normal(ctx, shape_tensor(ctx, size), ctx.out_dtype), ctx.out_dtype)


@translates(aten.randn_like.default)
def randn_like(ctx, self, *, dtype=None):
    return cast(ctx, _normal(ctx, ctx.op.Shape(self), ctx.out_dtype), ctx.out_dtype)


@translates(aten.randint.default)
def randint(ctx, high, size, *, dtype=None):
    return _randint(ctx, shape_tensor(ctx, size), 0, high)


@translates(aten.randint.low)
def randint_low(ctx, low, high, size, *, dtype=None):
    return _randint(ctx, shape_tensor(ctx, size), low, high)


@translates(aten.randint_like.default)
def randint_like(ctx, self, high, *, dtype=None):
    return _randint(ctx, ctx.op.Shape(self), 0, high)


@translates(aten.randint_like.low_dtype)
def randint_like_low(ctx, self, low, high, *, dtype=None):
    return _randint(ctx, ctx.op.Shape(self), low, high)


@translates(aten.randperm.default)
def randperm(ctx, n, *, dtype=None):
    # Sorting uniform samples gives every permutation the same chance (ties have probability ~0).
    count = shape_tensor(ctx, [n])
    _, indices = ctx.op.TopK(_uniform(ctx, count, _FLOAT), count, axis=0, _outputs=2)
    return cast(ctx, indices, ctx.out_dtype)


def _bernoulli(ctx, self, p) -> ir.Value:
    """1 with probability ``p`` (a number or a tensor broadcast to ``self``), in the output dtype;
    ``u < p`` is never true for p = 0 and always for p = 1."""
    u = _uniform(ctx, ctx.op.Shape(self), self.dtype)
    return cast(ctx, ctx.op.Less(u, scalar(ctx, p, u.dtype)), ctx.out_dtype)


@translates(aten.bernoulli.default)
def bernoulli(ctx, self, *, generator=None):
    return _bernoulli(ctx, self, self)


@translates(aten.bernoulli.p, aten.bernoulli.Tensor)
def bernoulli_p(ctx, self, p=0.5, *, generator=None):
    return _bernoulli(ctx, self, p)


def _normal_like(ctx, shape: ir.Value, mean, std) -> ir.Value:
    dtype = ctx.out_dtype
    noise = cast(ctx, _normal(ctx, shape, dtype), dtype)
    return ctx.op.Add(ctx.op.Mul(noise, scalar(ctx, std, dtype)), scalar(ctx, mean, dtype))


@translates(aten.normal.Tensor_float)
def normal_tensor_float(ctx, mean, std=1.0, *, generator=None):
    return _normal_like(ctx, ctx.op.Shape(mean), mean, std)


@translates(aten.normal.float_Tensor)
def normal_float_tensor(ctx, mean, std, *, generator=None):
    return _normal_like(ctx, ctx.op.Shape(std), mean, std)


@translates(aten.normal.Tensor_Tensor)
def normal_tensor_tensor(ctx, mean, std, *, generator=None):
    shape = ctx.op.Shape(ctx.op.Add(cast(ctx, mean, ctx.out_dtype), cast(ctx, std, ctx.out_dtype)))
    return _normal_like(ctx, shape, mean, std)


@translates(aten.normal.float_float)
def normal_float_float(ctx, mean, std, size, *, generator=None, dtype=None):
    return _normal_like(ctx, shape_tensor(ctx, size), mean, std)


@translates(aten.normal_functional.default)
def normal_functional(ctx, self, mean=0.0, std=1.0, *, generator=None):
    return _normal_like(ctx, ctx.op.Shape(self), mean, std)


@translates(aten.uniform.default)
def uniform(ctx, self, low=0.0, high=1.0, *, generator=None):
    dtype = _drawing_type(self.dtype)
    u = _uniform(ctx, ctx.op.Shape(self), dtype)
    low_, high_ = ctx.constant(float(low), dtype), ctx.constant(float(high), dtype)
    return cast(ctx, ctx.op.Add(ctx.op.Mul(u, ctx.op.Sub(high_, low_)), low_), self.dtype)


@translates(aten.exponential.default)
def exponential(ctx, self, lambd=1.0, *, generator=None):
    dtype = _drawing_type(self.dtype)
    u = _uniform(ctx, ctx.op.Shape(self), dtype)
    # -log(1 - u) / lambd, with 1 - u in (0, 1].
    sample = ctx.op.Div(ctx.op.Neg(ctx.op.Log(ctx.op.Sub(ctx.constant(1.0, dtype), u))), ctx.constant(float(lambd), dtype))
    return cast(ctx, sample, self.dtype)


def _kept(ctx, shape: ir.Value, p: float) -> ir.Value:
    """A mask that is True with probability 1 - p."""
    return ctx.op.GreaterOrEqual(_uniform(ctx, shape, _FLOAT), ctx.constant(float(p), _FLOAT))


def _dropped_out(ctx, input, mask: ir.Value, p: float) -> ir.Value:
    # PyTorch scales the kept elements by 1 / (1 - p), computed in double.
    kept = ctx.op.Mul(input, cast(ctx, mask, input.dtype))
    return ctx.op.Mul(kept, ctx.constant(1.0 / (1.0 - p), input.dtype))


@translates(aten.native_dropout.default, checker=lambda node: node.args[2] is True)
def native_dropout(ctx, input, p, train):
    shape = ctx.op.Shape(input)
    if p == 0:
        return ctx.op.Identity(input), ctx.op.Expand(ctx.constant(True, ir.DataType.BOOL), shape)
    if p == 1:
        return ctx.op.Expand(ctx.constant(0, input.dtype), shape), ctx.op.Expand(ctx.constant(False, ir.DataType.BOOL), shape)
    output, mask = _onnx_dropout(ctx, input, p, outputs=2)
    return output, mask


def _onnx_dropout(ctx, input, p: float, outputs: int):
    # ONNX's own Dropout in training mode: one node, which runtimes know as dropout. Runtimes
    # lack bfloat16 Dropout kernels: it runs in float32.
    training = ctx.constant(True, ir.DataType.BOOL)
    x = cast(ctx, input, _FLOAT) if input.dtype == ir.DataType.BFLOAT16 else input
    results = ctx.op.Dropout(x, ctx.constant(float(p), _FLOAT), training, _outputs=outputs)
    if x is input:
        return results
    if outputs == 1:
        return cast(ctx, results, input.dtype)
    return cast(ctx, results[0], input.dtype), results[1]


def _dropout(ctx, input, p: float, noise_shape: ir.Value) -> ir.Value:
    if p == 0:
        return ctx.op.Identity(input)
    if p == 1:
        # PyTorch multiplies by zeros, so NaN and inf inputs give NaN.
        return ctx.op.Mul(input, ctx.constant(0, input.dtype))
    return _dropped_out(ctx, input, _kept(ctx, noise_shape, p), p)


@translates(aten.dropout.default, checker=lambda node: bool(node.args[2]))
def dropout(ctx, input, p, train):
    if 0 < p < 1:
        return _onnx_dropout(ctx, input, p, outputs=1)
    return _dropout(ctx, input, p, ctx.op.Shape(input))


@translates(aten.feature_dropout.default, checker=lambda node: bool(node.args[2]))
def feature_dropout(ctx, input, p, train):
    # Whole channels drop: the mask has the input's batch and channel dims and ones elsewhere.
    noise_shape = ctx.op.Concat(shape_of(ctx, input, end=2), ints(ctx, [1] * (rank(input) - 2)), axis=0)
    return _dropout(ctx, input, p, noise_shape)


# -- sampling category indices: torch.multinomial -------------------------------------------
# With replacement, ONNX Multinomial draws from the log of the weights (it takes unnormalized log
# probabilities). Without replacement, the indices are the ``num_samples`` largest of
# ``log(weight) + Gumbel noise`` (the Gumbel-top-k trick: the distribution of drawing one
# category at a time and removing it).
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
