"""Complex tensors and the FFTs that make them.

onnxruntime has no complex kernels, so a complex tensor is carried inside the graph as a real
tensor of its parts' type with a trailing dim of 2 holding (real, imaginary)
(:func:`dynexport.dtypes.carried_dtype`) — ONNX DFT's own layout. Only the rules registered
here, with ``accepts_complex=True``, ever see such a tensor; every other rule declines a node that
reads or makes one, and the export refuses it rather than treat the pair dim as data. The
model's inputs and outputs are never complex (the translator refuses them).

``aten.stft`` becomes ONNX STFT, and the ``fft_*`` functions decompose (torch's decompositions)
into the three FFT primitives ``_fft_r2c``, ``_fft_c2c`` and ``_fft_c2r``, which become ONNX DFTs,
one per transformed dim; both from opset 17.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir
import torch

from dynexport.ops import elementwise, indexing
from dynexport.ops._helpers import argument, cast, ints, normalize_dim, rank, reduce, shape_of, shape_tensor, size_of
from dynexport.ops._helpers import reshape as onnx_reshape
from dynexport.registry import involves_complex, translates

aten = torch.ops.aten
prims = torch.ops.prims

_PYTHON_COMPLEX = complex  # the rule named complex below shadows it
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# onnxruntime's float32 DFT is about 250 times less accurate than PyTorch's FFT at lengths that are
# not powers of 2 (n_fft=400 is common in audio); in float64 it is as accurate, so transforms run
# in float64 and round once.
_DFT_TYPE = ir.DataType.DOUBLE

# ATen's fft_norm_mode: the factor applied after an unnormalized transform of n points.
_NORM_NONE, _NORM_BY_ROOT_N, _NORM_BY_N = 0, 1, 2


def _complex_rule(*targets, checker=None):
    """A rule for the complex form of an operator whose real form another module translates
    (``checker``, if given, narrows the complex nodes it takes)."""
    takes = involves_complex if checker is None else lambda node: involves_complex(node) and checker(node)
    return translates(*targets, accepts_complex=True, checker=takes)


def _is_complex(argument) -> bool:
    val = argument.meta.get("val") if isinstance(argument, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def _is_complex_operand(argument) -> bool:
    """A complex tensor or Python complex number."""
    return _is_complex(argument) or isinstance(argument, _PYTHON_COMPLEX)


def _complex_rank(ctx) -> int:
    """The rank PyTorch sees for the node's first argument (its pair dim left out)."""
    return ctx.node.args[0].meta["val"].dim()


def _real_part(ctx, x: ir.Value) -> ir.Value:
    return ctx.op.Gather(x, ctx.constant(0, ir.DataType.INT64), axis=-1)


def _imag_part(ctx, x: ir.Value) -> ir.Value:
    return ctx.op.Gather(x, ctx.constant(1, ir.DataType.INT64), axis=-1)


def _pairs(ctx, real: ir.Value, imag: ir.Value) -> ir.Value:
    axis = ints(ctx, [-1])
    return ctx.op.Concat(ctx.op.Unsqueeze(real, axis), ctx.op.Unsqueeze(imag, axis), axis=-1)


def _as_complex(ctx, x: ir.Value | complex, dtype: ir.DataType) -> ir.Value:
    """A real tensor or a number as pairs, a real one's imaginary part zero (as PyTorch converts
    it, so an infinite real part keeps a zero imaginary part)."""
    if not isinstance(x, ir.Value):
        return ctx.constant([_PYTHON_COMPLEX(x).real, _PYTHON_COMPLEX(x).imag], dtype)
    real = ctx.op.Unsqueeze(cast(ctx, x, dtype), ints(ctx, [-1]))
    return ctx.op.Concat(real, ctx.op.Expand(ctx.constant(0, dtype), ctx.op.Shape(real)), axis=-1)


def _conjugate(ctx, x: ir.Value) -> ir.Value:
    return ctx.op.Mul(x, ctx.constant([1.0, -1.0], x.dtype))


# -- FFTs -------------------------------------------------------------------------------------


def _dft(ctx, x: ir.Value, axis: int, *, inverse: bool = False, onesided: bool = False) -> ir.Value:
    """ONNX DFT of ``x`` (pairs, or a real tensor with a trailing dim of 1) along ``axis``, in
    the form of the target opset (the axis an attribute at 17, an input from 20)."""
    if ctx.opset >= 20:
        return ctx.op.DFT(x, None, ctx.constant(axis, ir.DataType.INT64), inverse=int(inverse), onesided=int(onesided))
    return ctx.op.DFT(x, axis=axis, inverse=int(inverse), onesided=int(onesided))


def _real_bins_exact(ctx, spectrum: ir.Value, rank_: int, axis: int, n: int | ir.Value) -> ir.Value:
    """``spectrum`` (pairs, of rank ``rank_``), the DFT of a real signal of ``n`` points along
    ``axis``, with the imaginary parts of bins 0 and n/2 exactly 0, as PyTorch's FFT gives them
    (they round to ±1e-16 otherwise, which flips angle() between pi and -pi)."""
    one = ctx.constant(1, ir.DataType.INT64)
    bins = ctx.op.Range(ctx.constant(0, ir.DataType.INT64), ctx.sym_size(spectrum, axis), one)
    real_bin = ctx.op.Or(ctx.op.Equal(bins, ctx.constant(0, ir.DataType.INT64)),
                         ctx.op.Equal(ctx.op.Mul(bins, ctx.constant(2, ir.DataType.INT64)), _int64(ctx, n)))
    real_bin = ctx.op.Reshape(real_bin, ints(ctx, [-1] + [1] * (rank_ - 1 - axis)))
    imaginary = ctx.op.And(real_bin, ctx.constant([False, True], ir.DataType.BOOL))
    return ctx.op.Where(imaginary, ctx.constant(0.0, spectrum.dtype), spectrum)


def _signal_size(ctx, x: ir.Value, dims: Sequence[int]) -> int | ir.Value:
    """The number of points the transform over ``dims`` of ``x`` spans: an int when static."""
    sizes = [size_of(ctx, x, d) for d in dims]
    if all(isinstance(s, int) for s in sizes):
        return math.prod(sizes)
    return reduce(ctx, "ReduceProd", ctx.op.Concat(*[shape_of(ctx, x, d, d + 1) for d in dims], axis=0), keepdims=False)


def _normalized(ctx, x: ir.Value, points: int | ir.Value, normalization: int, inverse: bool) -> ir.Value:
    """``x``, the transform of ``points`` points, scaled as ATen's ``normalization`` asks. ONNX's
    inverse DFT divides by its length already; ATen's inverse transforms do not."""
    power = {_NORM_NONE: 0.0, _NORM_BY_ROOT_N: -0.5, _NORM_BY_N: -1.0}[normalization] + (1.0 if inverse else 0.0)
    if power == 0.0:
        return x
    if isinstance(points, int):
        return ctx.op.Mul(x, ctx.constant(float(points) ** power, x.dtype))
    factor = ctx.op.Pow(cast(ctx, points, x.dtype), ctx.constant(power, x.dtype))
    return ctx.op.Mul(x, factor)


@translates(aten._fft_r2c.default, accepts_complex=True, min_opset=17)
def fft_r2c(ctx, self, dim, normalization, onesided):
    r = rank(self)
    dims = [normalize_dim(d, r) for d in dim]
    x = cast(ctx, self, _DFT_TYPE)
    points = _signal_size(ctx, x, dims)
    # The last dim is transformed real to complex (one-sided if asked), the others complex to complex.
    result = _dft(ctx, ctx.op.Unsqueeze(x, ints(ctx, [-1])), dims[-1], onesided=onesided)
    result = _real_bins_exact(ctx, result, r + 1, dims[-1], size_of(ctx, x, dims[-1]))
    for d in dims[:-1]:
        result = _dft(ctx, result, d)
    return cast(ctx, _normalized(ctx, result, points, normalization, inverse=False), ctx.out_dtype)


@translates(aten._fft_c2c.default, accepts_complex=True, min_opset=17)
def fft_c2c(ctx, self, dim, normalization, forward):
    dims = [normalize_dim(d, _complex_rank(ctx)) for d in dim]
    points = _signal_size(ctx, self, dims)
    result = cast(ctx, self, _DFT_TYPE)
    for d in dims:
        result = _dft(ctx, result, d, inverse=not forward)
    return cast(ctx, _normalized(ctx, result, points, normalization, inverse=not forward), ctx.out_dtype)


@translates(aten._fft_c2r.default, accepts_complex=True, min_opset=17)
def fft_c2r(ctx, self, dim, normalization, last_dim_size):
    """The inverse of a one-sided spectrum: the complex inverses over all dims but the last, then
    the last dim's spectrum completed by its conjugate symmetry (X[n-k] = conj(X[k])) and
    inverted; the real part is the signal. ONNX's one-sided inverse DFT is not in every runtime."""
    dims = [normalize_dim(d, _complex_rank(ctx)) for d in dim]
    result = cast(ctx, self, _DFT_TYPE)
    for d in dims[:-1]:
        result = _dft(ctx, result, d, inverse=True)
    last = dims[-1]
    n = last_dim_size
    half = n // 2 + 1 if isinstance(n, int) else ctx.op.Add(ctx.op.Div(n, ctx.constant(2, ir.DataType.INT64)), ctx.constant(1, ir.DataType.INT64))
    mirrored_end = n - n // 2 if isinstance(n, int) else ctx.op.Sub(n, ctx.op.Div(n, ctx.constant(2, ir.DataType.INT64)))
    head = _slice(ctx, result, last, 0, half)
    # X[1 : n - n//2] reversed: the bins k = n//2 + 1 ... n - 1 of the full spectrum.
    mirrored = _slice(ctx, _slice(ctx, result, last, 1, mirrored_end), last, -1, _INT64_MIN, -1)
    full = ctx.op.Concat(head, _conjugate(ctx, mirrored), axis=last)
    signal = _real_part(ctx, _dft(ctx, full, last, inverse=True))
    points = _signal_size(ctx, self, dims[:-1])
    points = points * n if isinstance(points, int) and isinstance(n, int) else ctx.op.Mul(
        _int64(ctx, points), _int64(ctx, n)
    )
    return cast(ctx, _normalized(ctx, signal, points, normalization, inverse=True), ctx.out_dtype)


def _int64(ctx, value: int | ir.Value) -> ir.Value:
    return cast(ctx, value, ir.DataType.INT64) if isinstance(value, ir.Value) else ctx.constant(value, ir.DataType.INT64)


def _slice(ctx, x: ir.Value, axis: int, start: int | ir.Value, end: int | ir.Value, step: int = 1) -> ir.Value:
    start, end = (ctx.op.Reshape(_int64(ctx, v), ints(ctx, [1])) for v in (start, end))
    return ctx.op.Slice(x, start, end, ints(ctx, [axis]), ints(ctx, [step]))


def _stft_checker(node: torch.fx.Node) -> bool:
    """A real signal, framed as PyTorch frames it (align_to_window changes that)."""
    return not _is_complex(node.args[0]) and not argument(node, "align_to_window")


@translates(aten.stft.default, accepts_complex=True, checker=_stft_checker, min_opset=17)
def stft(ctx, self, n_fft, hop_length=None, win_length=None, window=None, normalized=False,
         onesided=None, return_complex=None, align_to_window=None):
    """ONNX STFT of the signal (torch.stft pads a centered signal before this operator), its
    window zero-padded to ``n_fft`` about the middle as PyTorch pads it; ONNX gives
    (batch, frames, bins, 2) where PyTorch has (batch, bins, frames)."""
    dtype = _DFT_TYPE
    win_length = n_fft if win_length is None else win_length
    if window is None:
        window = ctx.constant([1.0] * win_length, dtype)
    window = cast(ctx, window, dtype)
    if win_length < n_fft:
        left = (n_fft - win_length) // 2
        window = ctx.op.Pad(window, ints(ctx, [left, n_fft - win_length - left]))
    batched = rank(self) == 2
    signal = ctx.op.Unsqueeze(cast(ctx, self, dtype), ints(ctx, [-1] if batched else [0, -1]))
    hop = ctx.constant(n_fft // 4 if hop_length is None else hop_length, ir.DataType.INT64)
    spectrum = ctx.op.STFT(signal, hop, window, ctx.constant(n_fft, ir.DataType.INT64),
                           onesided=int(onesided is not False))
    spectrum = _real_bins_exact(ctx, ctx.op.Transpose(spectrum, perm=[0, 2, 1, 3]), 4, 1, n_fft)
    if not batched:
        spectrum = ctx.op.Squeeze(spectrum, ints(ctx, [0]))
    if normalized:
        spectrum = ctx.op.Mul(spectrum, ctx.constant(n_fft**-0.5, dtype))
    return cast(ctx, spectrum, ctx.out_dtype)


# -- complex values ---------------------------------------------------------------------------


@translates(aten.view_as_real.default, aten.view_as_complex.default, aten.resolve_conj.default,
            aten.resolve_neg.default, accepts_complex=True)
def view_as_real(ctx, self):
    return self


@translates(aten.real.default, accepts_complex=True)
def real(ctx, self):
    return _real_part(ctx, self) if _is_complex(ctx.node.args[0]) else self


@translates(aten.imag.default, accepts_complex=True)
def imag(ctx, self):
    return _imag_part(ctx, self)


@translates(aten.complex.default, accepts_complex=True)
def complex(ctx, real, imag):
    dtype = ctx.out_dtype
    return _pairs(ctx, ctx.op.Expand(cast(ctx, real, dtype), ctx.op.Shape(imag)),
                  ctx.op.Expand(cast(ctx, imag, dtype), ctx.op.Shape(real)))


@_complex_rule(aten.abs.default)
def abs(ctx, self):
    return ctx.op.Sqrt(reduce(ctx, "ReduceSum", ctx.op.Mul(self, self), [-1], keepdims=False))


@translates(aten.angle.default, accepts_complex=True)
def angle(ctx, self):
    if _is_complex(ctx.node.args[0]):
        return elementwise.atan2(ctx, _imag_part(ctx, self), _real_part(ctx, self))
    # A real number's angle: pi below 0, else 0 (-0.0 included), NaN kept.
    x = cast(ctx, self, ctx.out_dtype)
    zero = ctx.constant(0.0, x.dtype)
    angle = ctx.op.Where(ctx.op.Less(x, zero), ctx.constant(math.pi, x.dtype), zero)
    return ctx.op.Where(ctx.op.IsNaN(x), x, angle)


@_complex_rule(aten.exp.default)
def exp(ctx, self):
    """exp(a + bi) = e^a (cos b + i sin b)."""
    magnitude = ctx.op.Exp(_real_part(ctx, self))
    phase = _imag_part(ctx, self)
    return _pairs(ctx, ctx.op.Mul(magnitude, ctx.op.Cos(phase)), ctx.op.Mul(magnitude, ctx.op.Sin(phase)))


@_complex_rule(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default)
def sum(ctx, self, dim=None, keepdim=False, *, dtype=None):
    """A sum or mean over leading dims (None or []: all of them), the pair dim kept."""
    r = _complex_rank(ctx)
    dims = list(range(r)) if not dim else [normalize_dim(d, r) for d in dim]
    x = cast(ctx, self, ctx.out_dtype)
    if not dims:
        return x
    mean = ctx.node.target in (aten.mean.dim, aten.mean.default)
    return reduce(ctx, "ReduceMean" if mean else "ReduceSum", x, dims, keepdims=keepdim)


@_complex_rule(aten._conj.default, aten.conj_physical.default, aten.conj.default)
def conj(ctx, self):
    return _conjugate(ctx, self)


@_complex_rule(aten.neg.default)
def neg(ctx, self):
    return ctx.op.Neg(self)


@_complex_rule(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx, self, other):
    dtype = ctx.out_dtype
    self_complex, other_complex = (_is_complex_operand(a) for a in ctx.node.args[:2])
    self, other = (_as_complex(ctx, v, dtype) if isinstance(v, _PYTHON_COMPLEX) else v for v in (self, other))
    if self_complex and other_complex:
        self, other = cast(ctx, self, dtype), cast(ctx, other, dtype)
        a, b = _real_part(ctx, self), _imag_part(ctx, self)
        c, d = _real_part(ctx, other), _imag_part(ctx, other)
        return _pairs(ctx, ctx.op.Sub(ctx.op.Mul(a, c), ctx.op.Mul(b, d)), ctx.op.Add(ctx.op.Mul(a, d), ctx.op.Mul(b, c)))
    pairs, factor = (self, other) if self_complex else (other, self)
    return ctx.op.Mul(cast(ctx, pairs, dtype), _real_factor(ctx, factor, dtype))


@_complex_rule(aten.div.Tensor, aten.div.Scalar, checker=lambda node: not _is_complex_operand(node.args[1]))
def div(ctx, self, other):
    dtype = ctx.out_dtype
    return ctx.op.Div(cast(ctx, self, dtype), _real_factor(ctx, other, dtype))


def _real_factor(ctx, factor: ir.Value | float, dtype: ir.DataType) -> ir.Value:
    """A real tensor or number that scales both parts of a complex tensor."""
    if not isinstance(factor, ir.Value):
        return ctx.constant(float(factor), dtype)
    return ctx.op.Unsqueeze(cast(ctx, factor, dtype), ints(ctx, [-1]))


@_complex_rule(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def add(ctx, self, other, alpha=1):
    dtype = ctx.out_dtype
    self, other = (cast(ctx, v, dtype) if _is_complex(n) else _as_complex(ctx, v, dtype)
                   for v, n in zip((self, other), ctx.node.args[:2]))
    if alpha != 1:
        other = ctx.op.Mul(other, ctx.constant(float(alpha), dtype))
    combine = ctx.op.Sub if ctx.node.target in (aten.sub.Tensor, aten.sub.Scalar) else ctx.op.Add
    return combine(self, other)


@_complex_rule(aten._to_copy.default, prims.convert_element_type.default)
def to_copy(ctx, self, *args, **kwargs):
    if not _is_complex(ctx.node.args[0]):
        return _as_complex(ctx, self, ctx.out_dtype)
    if not ctx.out.is_complex():
        # PyTorch discards the imaginary part (with a warning).
        return cast(ctx, _real_part(ctx, self), ctx.out_dtype)
    return cast(ctx, self, ctx.out_dtype)


# -- complex factories ------------------------------------------------------------------------


def _filled(ctx, shape: ir.Value, value) -> ir.Value:
    """A complex tensor of PyTorch shape ``shape`` (a 1-D int64 tensor) holding ``value``."""
    shape = ctx.op.Concat(shape, ints(ctx, [2]), axis=0)
    return ctx.op.Expand(_as_complex(ctx, value, ctx.out_dtype), shape)


@_complex_rule(aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format)
def full(ctx, size, fill_value=None, **kwargs):
    # empty's contents are unspecified; zeros are as good as any and deterministic.
    value = {aten.zeros.default: 0, aten.ones.default: 1, aten.empty.memory_format: 0}.get(ctx.node.target, fill_value)
    return _filled(ctx, shape_tensor(ctx, size), value)


@_complex_rule(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default)
def full_like(ctx, self, fill_value=None, **kwargs):
    fills = {aten.zeros_like.default: 0, aten.ones_like.default: 1, aten.empty_like.default: 0}
    value = fills.get(ctx.node.target, fill_value)
    # A complex tensor's own shape ends in its pair dim already.
    shape = shape_of(ctx, self, 0, -1) if _is_complex(ctx.node.args[0]) else ctx.op.Shape(self)
    return _filled(ctx, shape, value)


# -- shapes of complex tensors: the pair dim stays last ------------------------------------------


@_complex_rule(aten.clone.default, aten.alias.default, aten.detach.default, aten.contiguous.default,
               aten.lift_fresh_copy.default)
def clone(ctx, self, *, memory_format=None):
    return self


@_complex_rule(aten.sym_size.int)
def sym_size(ctx, self, dim):
    return ctx.sym_size(self, normalize_dim(dim, _complex_rank(ctx)))


@_complex_rule(aten.permute.default)
def permute(ctx, self, dims):
    r = _complex_rank(ctx)
    perm = [normalize_dim(d, r) for d in dims] + [r]
    return self if perm == sorted(perm) else ctx.op.Transpose(self, perm=perm)


@_complex_rule(aten.transpose.int)
def transpose(ctx, self, dim0, dim1):
    r = _complex_rank(ctx)
    perm = list(range(r + 1))
    dim0, dim1 = normalize_dim(dim0, r), normalize_dim(dim1, r)
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return self if dim0 == dim1 else ctx.op.Transpose(self, perm=perm)


@_complex_rule(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def reshape(ctx, self, size):
    static = list(ctx.out.shape)
    return onnx_reshape(ctx, self, (static if all(isinstance(s, int) for s in static) else list(size)) + [2])


@_complex_rule(aten.unsqueeze.default)
def unsqueeze(ctx, self, dim):
    return ctx.op.Unsqueeze(self, ints(ctx, [normalize_dim(dim, _complex_rank(ctx) + 1)]))


def _squeezes_only_ones(node: torch.fx.Node) -> bool:
    """The squeezed dims are static: a dynamic one's size decides the rank at run time."""
    shape = node.args[0].meta["val"].shape
    dims = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
    return all(isinstance(shape[d], int) for d in dims)


@_complex_rule(aten.squeeze.dim, aten.squeeze.dims, checker=_squeezes_only_ones)
def squeeze(ctx, self, dim):
    r = _complex_rank(ctx)
    dims = [normalize_dim(d, r) for d in ([dim] if isinstance(dim, int) else dim)]
    ones = [d for d in dims if self.shape[d] == 1]
    return ctx.op.Squeeze(self, ints(ctx, ones)) if ones else self


@_complex_rule(aten.select.int)
def select(ctx, self, dim, index):
    index = index if isinstance(index, ir.Value) else ctx.constant(index, ir.DataType.INT64)
    return ctx.op.Gather(self, index, axis=normalize_dim(dim, _complex_rank(ctx)))


@_complex_rule(aten.slice.Tensor)
def slice(ctx, self, dim=0, start=None, end=None, step=1):
    dim = normalize_dim(dim, _complex_rank(ctx))
    return _slice(ctx, self, dim, 0 if start is None else start, _INT64_MAX if end is None else end, step)


@_complex_rule(aten.roll.default, checker=lambda node: bool(argument(node, "dims")))
def roll(ctx, self, shifts, dims=()):
    # Without dims roll shifts the flattened tensor, which the pairs are not.
    return indexing.roll(ctx, self, shifts, [normalize_dim(d, _complex_rank(ctx)) for d in dims])


@_complex_rule(aten.flip.default)
def flip(ctx, self, dims):
    return indexing.flip(ctx, self, [normalize_dim(d, _complex_rank(ctx)) for d in dims])


@_complex_rule(aten.expand.default)
def expand(ctx, self, size, *, implicit=False):
    sizes = [1 if isinstance(s, int) and s == -1 else s for s in size]
    return ctx.op.Expand(self, shape_tensor(ctx, sizes + [2]))


@_complex_rule(aten.cat.default, aten.concat.default)
def cat(ctx, tensors, dim=0):
    dtype = ctx.out_dtype
    operands = [cast(ctx, t, dtype) if _is_complex(n) else _as_complex(ctx, t, dtype) for t, n in zip(tensors, ctx.node.args[0])]
    return operands[0] if len(operands) == 1 else ctx.op.Concat(*operands, axis=normalize_dim(dim, ctx.out.dim()))


@_complex_rule(aten.stack.default)
def stack(ctx, tensors, dim=0):
    dtype = ctx.out_dtype
    axis = normalize_dim(dim, ctx.out.dim())
    operands = [cast(ctx, t, dtype) if _is_complex(n) else _as_complex(ctx, t, dtype) for t, n in zip(tensors, ctx.node.args[0])]
    unsqueezed = [ctx.op.Unsqueeze(t, ints(ctx, [axis])) for t in operands]
    return unsqueezed[0] if len(unsqueezed) == 1 else ctx.op.Concat(*unsqueezed, axis=axis)
