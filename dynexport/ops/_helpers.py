"""Helpers every rule shares: dims, shapes as tensors, constants, casts.

Rules never re-implement these. A "shape" argument is a list whose items are Python ints or ONNX
int64 scalars (SymInts); :func:`shape_tensor` turns it into the 1-D int64 tensor ONNX wants.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir
import torch
from torch.utils._sympy.value_ranges import ValueRanges

from dynexport.dtypes import FLOATING, to_torch_dtype
from dynexport.input_guards import accepted_minimums, size_bounds

__all__ = [
    "argument",
    "arithmetic",
    "bfloat16_as_float",
    "bfloat16_to_float",
    "bitwise",
    "cast",
    "computed_in",
    "floating_input",
    "ints",
    "invert",
    "is_floating",
    "least_value",
    "normalize_dim",
    "normalize_dims",
    "only_first_output_used",
    "pad",
    "per_dim",
    "rank",
    "reduce",
    "reshape",
    "run_batched",
    "scalar",
    "scalar_like",
    "scatter_elements_add",
    "select",
    "shape_of",
    "shape_tensor",
    "size_of",
    "size_of_dims",
    "split_equally",
    "with_shape",
]


def rank(x: ir.Value) -> int:
    return len(x.shape)


def with_shape(value: ir.Value, shape: ir.Shape | Sequence[int | str | None] | None) -> ir.Value:
    """``value``, an intermediate of a rule, with the shape its op gives it, for what reads ranks
    and static sizes later (:func:`rank`, :func:`size_of`, the optimizer's passes). The builder
    types new values by element type only, and a rule's results take their shapes from the FX
    node's ``meta["val"]`` when it returns: this is the one way a rule states a shape."""
    value.shape = shape if shape is None or isinstance(shape, ir.Shape) else ir.Shape(shape)
    return value


def normalize_dim(dim: int, rank_: int) -> int:
    """``dim`` in [0, rank) (a 0-d tensor accepts dims 0 and -1, as in PyTorch)."""
    bound = max(rank_, 1)
    if not -bound <= dim < bound:
        raise IndexError(f"dim {dim} is out of range for a tensor of rank {rank_}")
    return dim % bound


def normalize_dims(dims: int | Sequence[int] | None, rank_: int) -> list[int]:
    """Dims as a sorted list; None or an empty list means every dim."""
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return list(range(rank_))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(normalize_dim(d, rank_) for d in dims)


def is_floating(x: ir.Value) -> bool:
    return x.dtype in FLOATING


def ints(ctx, values: Sequence[int]) -> ir.Value:
    """A 1-D int64 constant."""
    return ctx.constant(list(values), ir.DataType.INT64)


# ReduceSum takes its axes as an input from opset 13, the other reductions from opset 18 (an
# attribute before).
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def reduce(ctx, op_type: str, x: ir.Value, axes: Sequence[int] | None = None, keepdims: bool = True) -> ir.Value:
    """The ONNX reduction ``op_type`` (``"ReduceMax"``) of ``x`` over ``axes`` (None: every
    axis), in the form of the target opset."""
    reduction = getattr(ctx.op, op_type)
    if axes is None:
        return reduction(x, keepdims=int(keepdims))
    if ctx.opset >= _AXES_INPUT_SINCE.get(op_type, 18):
        return reduction(x, ints(ctx, axes), keepdims=int(keepdims))
    return reduction(x, axes=[int(a) for a in axes], keepdims=int(keepdims))


def scalar_like(ctx, value: float | int | bool, like: ir.Value) -> ir.Value:
    """A 0-d constant with the element type of ``like``."""
    return ctx.constant(value, like.dtype)


def cast(ctx, x: ir.Value, dtype: ir.DataType) -> ir.Value:
    if x.dtype == dtype:
        return x
    return with_shape(ctx.op.Cast(x, to=dtype), x.shape)


# Element types onnxruntime has no Where kernel for, and the type each converts to and back from
# exactly (uint64 to int64 and back keeps every bit).
_WHERE_STAND_INS = {
    ir.DataType.BOOL: ir.DataType.UINT8,
    ir.DataType.INT16: ir.DataType.INT32,
    ir.DataType.UINT16: ir.DataType.INT32,
    ir.DataType.UINT64: ir.DataType.INT64,
    ir.DataType.BFLOAT16: ir.DataType.FLOAT,
}


def computed_in(ctx, x: ir.Value, stand_ins: dict[ir.DataType, ir.DataType], compute: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """``compute(x)``, in the dtype ``stand_ins`` maps ``x``'s to (one onnxruntime has a kernel
    for, that ``x``'s converts to and back from exactly), cast back."""
    stand_in = stand_ins.get(x.dtype)
    if stand_in is None:
        return compute(x)
    return cast(ctx, compute(cast(ctx, x, stand_in)), x.dtype)


def select(ctx, condition: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """ONNX ``Where(condition, a, b)`` for ``a`` and ``b`` of one dtype, any dtype."""
    stand_in = _WHERE_STAND_INS.get(a.dtype)
    if stand_in is None:
        return ctx.op.Where(condition, a, b)
    return cast(ctx, ctx.op.Where(condition, cast(ctx, a, stand_in), cast(ctx, b, stand_in)), a.dtype)


def bfloat16_as_float(rule):
    """For ONNX ops that take bfloat16 only from opset 22: before it, ``rule`` computes in float32
    (its bfloat16 tensor arguments cast) and the result is cast back, as PyTorch computes too."""

    @functools.wraps(rule)
    def wrapper(ctx, self, *args, **kwargs):
        if self.dtype != ir.DataType.BFLOAT16 or ctx.opset >= 22:
            return rule(ctx, self, *args, **kwargs)
        args = [bfloat16_to_float(ctx, a) for a in args]
        result = rule(ctx, cast(ctx, self, ir.DataType.FLOAT), *args, **kwargs)
        return cast(ctx, result, ir.DataType.BFLOAT16)

    return wrapper


def bfloat16_to_float(ctx, value):
    """``value`` cast to float32 if it is a bfloat16 tensor (float32 holds each one exactly)."""
    if isinstance(value, ir.Value) and value.dtype == ir.DataType.BFLOAT16:
        return cast(ctx, value, ir.DataType.FLOAT)
    return value


# Add, Sub, Mul and Div take 8- and 16-bit integers from opset 14.
_NARROW_INTEGERS = frozenset({ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16})


def arithmetic(ctx, op_type: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """ONNX ``op_type`` (``"Add"``, ``"Sub"``, ``"Mul"``) of ``a`` and ``b`` of one dtype; below
    opset 14 narrow integers compute in int32, the cast back wrapping around as PyTorch does."""
    if ctx.opset >= 14 or a.dtype not in _NARROW_INTEGERS:
        return getattr(ctx.op, op_type)(a, b)
    wide = getattr(ctx.op, op_type)(cast(ctx, a, ir.DataType.INT32), cast(ctx, b, ir.DataType.INT32))
    return cast(ctx, wide, a.dtype)


def invert(ctx, x: ir.Value) -> ir.Value:
    """``~x`` of an integer tensor. BitwiseNot exists from opset 18; before it ``~x`` is
    ``-1 - x`` (signed: it never overflows) or ``max - x`` (unsigned)."""
    if ctx.opset >= 18:
        return ctx.op.BitwiseNot(x)
    bounds = torch.iinfo(to_torch_dtype(x.dtype))
    # Sub takes 8- and 16-bit integers from opset 14; the difference fits x's dtype.
    wide = cast(ctx, x, ir.DataType.INT32) if bounds.bits < 32 else x
    return cast(ctx, ctx.op.Sub(scalar_like(ctx, -1 if bounds.min < 0 else bounds.max, wide), wide), x.dtype)


def bitwise(ctx, op_type: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """The bitwise ``op_type`` (``"And"``, ``"Or"``, ``"Xor"``) of two integer tensors of one
    dtype. The Bitwise ops exist from opset 18; before it the logical op combines the bits of
    each, and the bits are summed back."""
    if ctx.opset >= 18:
        return getattr(ctx.op, f"Bitwise{op_type}")(a, b)
    bounds = torch.iinfo(to_torch_dtype(a.dtype))
    combined = getattr(ctx.op, op_type)(_bits(ctx, a, bounds.bits), _bits(ctx, b, bounds.bits))
    return cast(ctx, _from_bits(ctx, combined, bounds.bits, signed=bounds.min < 0), a.dtype)


def _bits(ctx, x: ir.Value, width: int) -> ir.Value:
    """The ``width`` bits of the integer tensor ``x``, least significant first, along a new last
    dim (bool). Bit k is set where floor(u / 2**k) is odd, u being the bits below the sign bit
    as a non-negative int64 (``x mod 2**width``; a 64-bit ``x`` with its sign bit cleared)."""
    wide = cast(ctx, x, ir.DataType.INT64)
    int64 = functools.partial(ctx.constant, dtype=ir.DataType.INT64)
    if width < 64:
        # Mod of int64 takes the sign of the divisor.
        unsigned, sign = ctx.op.Mod(wide, int64(1 << width)), None
    else:
        sign = ctx.op.Less(wide, int64(0))
        unsigned = ctx.op.Where(sign, ctx.op.Sub(wide, int64(-(1 << 63))), wide)
    low = min(width, 63)
    shifted = ctx.op.Div(ctx.op.Unsqueeze(unsigned, ints(ctx, [-1])), ints(ctx, [1 << k for k in range(low)]))
    bits = ctx.op.Equal(ctx.op.Mod(shifted, int64(2)), int64(1))
    if sign is not None:
        bits = ctx.op.Concat(bits, ctx.op.Unsqueeze(sign, ints(ctx, [-1])), axis=-1)
    return bits


def _from_bits(ctx, bits: ir.Value, width: int, signed: bool) -> ir.Value:
    """The int64 whose low ``width`` bits are ``bits`` (along the last dim, least significant
    first), sign-extended where ``signed``: the top bit weighs -2**(width - 1) in two's complement
    (in int64 it does for 64-bit unsigned integers too, whose cast back keeps the bits).
    onnxruntime sums int64 inexactly past 2**53: 64 bits are summed as two halves."""
    zero = ctx.constant(0, ir.DataType.INT64)

    def total(first: int, stop: int) -> ir.Value:
        weights = [1 << (k - first) for k in range(first, stop)]
        if stop == width and (signed or width == 64):
            weights[-1] = -weights[-1]
        part = bits
        if (first, stop) != (0, width):
            part = ctx.op.Slice(bits, ints(ctx, [first]), ints(ctx, [stop]), ints(ctx, [-1]))
        return reduce(ctx, "ReduceSum", ctx.op.Where(part, ints(ctx, weights), zero), [-1], keepdims=False)

    if width <= 32:
        return total(0, width)
    return ctx.op.Add(ctx.op.Mul(total(32, width), ctx.constant(1 << 32, ir.DataType.INT64)), total(0, 32))


def scalar(ctx, value: int | float | bool | ir.Value, dtype: ir.DataType) -> ir.Value:
    """A Python number, or an ONNX scalar (a SymInt, a promoted argument), as ``dtype``."""
    if isinstance(value, ir.Value):
        return cast(ctx, value, dtype)
    return ctx.constant(value, dtype)


def argument(node: torch.fx.Node, name: str):
    """The value ``node`` passes for its schema argument ``name`` (positionally, by keyword or
    by default): for checkers, which see FX nodes."""
    for position, schema_argument in enumerate(node.target._schema.arguments):
        if schema_argument.name == name:
            if not schema_argument.kwarg_only and position < len(node.args):
                return node.args[position]
            return node.kwargs.get(name, schema_argument.default_value)
    raise KeyError(name)


def least_value(value: int | torch.SymInt) -> int | float:
    """The least ``value`` takes at any input size the export accepts (``-inf`` where unbounded).
    The shape env takes every dynamic dim to be at least 2 (torch.export specializes 0 and 1),
    yet the program accepts 0 and 1 unless declared otherwise: a range starting at 0 to 2 is
    taken to start at the least value the program's input checks accept
    (:func:`~dynexport.input_guards.accepted_minimums`; ``Dim("h", min=2)`` on a dim the model
    makes ``32*_h`` gives ``_h >= 1``), else at 0."""
    if not isinstance(value, torch.SymInt):
        return value
    expr, known, accepted = value.node.expr, value.node.shape_env.var_to_range, accepted_minimums()
    ranges = {}
    for symbol in expr.free_symbols:
        bounds = known.get(symbol, ValueRanges.unknown())
        if 0 <= bounds.lower <= 2:
            bounds = ValueRanges(min(accepted.get(symbol, 0), bounds.lower), bounds.upper)
        ranges[symbol] = bounds
    return size_bounds(expr, ranges).lower


def only_first_output_used(node: torch.fx.Node) -> bool:
    """Checker for multi-output ops whose other outputs (saved statistics) only feed backward."""
    return all(
        user.target is operator.getitem and (user.args[1] == 0 or not user.users) for user in node.users
    )


def _as_1d(ctx, value: ir.Value) -> ir.Value:
    producer = value.producer()
    if producer is not None and producer.op_type == "Squeeze" and len(producer.inputs) == 1:
        source = producer.inputs[0]
        if source.shape is not None and len(source.shape) == 1:
            return source
    return ctx.op.Reshape(cast(ctx, value, ir.DataType.INT64), ints(ctx, [1]))


def shape_tensor(ctx, sizes: Sequence[int | ir.Value] | ir.Value) -> ir.Value:
    """A 1-D int64 tensor from a list of ints and int64 scalars (consecutive ints grouped)."""
    if isinstance(sizes, ir.Value):
        return sizes if len(sizes.shape) == 1 else _as_1d(ctx, sizes)
    pieces: list[ir.Value] = []
    static: list[int] = []
    for size in sizes:
        if isinstance(size, ir.Value):
            if static:
                pieces.append(ints(ctx, static))
                static = []
            pieces.append(_as_1d(ctx, size))
        else:
            static.append(int(size))
    if static or not pieces:
        pieces.append(ints(ctx, static))
    return pieces[0] if len(pieces) == 1 else ctx.op.Concat(*pieces, axis=0)


def scatter_elements_add(ctx, data: ir.Value, indices: ir.Value, updates: ir.Value, axis: int) -> ir.Value:
    """ONNX ScatterElements of ``updates`` into ``data`` along ``axis`` with reduction "add",
    for ``indices`` (and ``updates``) that match ``data``'s sizes along every other dim. The
    reduction exists from opset 16; before it each target sums the updates whose index names it,
    from an [n, size] comparison along ``axis``."""
    if ctx.opset >= 16:
        return ctx.op.ScatterElements(data, indices, updates, axis=axis, reduction="add")
    r = rank(data)
    zero, one = ctx.constant(0, ir.DataType.INT64), ctx.constant(1, ir.DataType.INT64)
    targets = ctx.op.Reshape(ctx.op.Range(zero, ctx.sym_size(data, axis), one), ints(ctx, [-1] + [1] * (r - 1 - axis)))
    hits = ctx.op.Equal(ctx.op.Unsqueeze(indices, ints(ctx, [axis + 1])), targets)
    terms = ctx.op.Where(hits, ctx.op.Unsqueeze(updates, ints(ctx, [axis + 1])), ctx.constant(0, updates.dtype))
    return ctx.op.Add(data, reduce(ctx, "ReduceSum", terms, [axis], keepdims=False))


def is_inf(ctx, x: ir.Value) -> ir.Value:
    """Where ``x`` is infinite. IsInf takes float16 and bfloat16 from opset 20; before it they
    are checked as float32, which keeps every infinity and every finite value finite."""
    if ctx.opset < 20 and x.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        x = cast(ctx, x, ir.DataType.FLOAT)
    return ctx.op.IsInf(x)


def shape_of(ctx, x: ir.Value, start: int = 0, end: int | None = None) -> ir.Value:
    """The sizes of ``x``'s dims ``start`` to ``end`` (excluded; None: the last) as a 1-D int64
    tensor. Shape takes ``start`` and ``end`` from opset 15; before it a Slice cuts them."""
    if ctx.opset >= 15 or (start == 0 and end is None):
        return ctx.op.Shape(x, start=start or None, end=end)
    return ctx.op.Slice(ctx.op.Shape(x), ints(ctx, [start]), ints(ctx, [_INT64_MAX if end is None else end]))


_INT64_MAX = 2**63 - 1


def reshape(ctx, x: ir.Value, shape: ir.Value | Sequence[int | ir.Value]) -> ir.Value:
    """``x`` reshaped to ``shape`` (a 1-D int64 tensor, or sizes as :func:`shape_tensor` takes
    them), whose 0s are sizes, never copies of ``x``'s. Reshape takes ``allowzero`` from opset
    14."""
    # PyTorch infers a -1 only where no size is 0.
    infers = not isinstance(shape, ir.Value) and -1 in shape
    if not isinstance(shape, ir.Value):
        shape = shape_tensor(ctx, shape)
    if ctx.opset >= 14:
        return ctx.op.Reshape(x, shape, allowzero=1)
    known = ir.convenience.get_const_tensor(shape)
    if infers or (known is not None and 0 not in known.numpy().tolist()):
        return ctx.op.Reshape(x, shape)
    # Before it a 0 copies x's size. A 0 means no elements, where any tensor of the shape is the
    # result: an empty x gets one element, is reshaped to ones and broadcast to the shape.
    zero, one = ctx.constant(0, ir.DataType.INT64), ints(ctx, [1])
    empty = ctx.op.Equal(ctx.op.Size(x), zero)
    filler_count = ctx.op.Reshape(cast(ctx, empty, ir.DataType.INT64), one)
    filler = ctx.op.Expand(ctx.op.Reshape(ctx.constant(0, x.dtype), one), filler_count)
    padded = ctx.op.Concat(ctx.op.Reshape(x, ints(ctx, [-1])), filler, axis=0)
    target = ctx.op.Where(empty, ctx.op.Expand(one, ctx.op.Shape(shape)), shape)
    return ctx.op.Expand(ctx.op.Reshape(padded, target), shape)


def size_of(ctx, x: ir.Value, dim: int) -> int | ir.Value:
    """The size of ``x`` along ``dim``: a Python int when static, else an int64 scalar."""
    size = x.shape[dim]
    if isinstance(size, int):
        return size
    return ctx.sym_size(x, dim)


def size_of_dims(ctx, x: ir.Value, start: int, end: int) -> int | ir.Value:
    """The number of elements in ``x``'s dims ``start`` to ``end`` (excluded), as ``size_of``
    gives a size. Reshapes spell it out rather than write -1, which is ambiguous among zero-size
    dims."""
    sizes = x.shape[start:end]
    if all(isinstance(size, int) for size in sizes):
        return math.prod(sizes)
    return reduce(ctx, "ReduceProd", shape_of(ctx, x, start, end), keepdims=False)


def pad(
    ctx,
    x: ir.Value,
    pads: Sequence[int | ir.Value],
    axes: Sequence[int] | None = None,
    value: ir.Value | None = None,
    mode: str = "constant",
) -> ir.Value:
    """ONNX Pad of ``x``: ``pads`` holds the begins, then the ends, of ``axes`` (None: every
    axis), as ints or int64 scalars. Pad takes ``axes`` as an input from opset 18; before it the
    pads name every axis."""
    if axes is None:
        return ctx.op.Pad(x, shape_tensor(ctx, pads), value, mode=mode)
    if ctx.opset >= 18:
        return ctx.op.Pad(x, shape_tensor(ctx, pads), value, ints(ctx, axes), mode=mode)
    begins, ends = [0] * rank(x), [0] * rank(x)
    for axis, begin, end in zip(axes, pads[: len(axes)], pads[len(axes) :]):
        begins[axis], ends[axis] = begin, end
    return ctx.op.Pad(x, shape_tensor(ctx, begins + ends), value, mode=mode)


def split_equally(ctx, x: ir.Value, axis: int, count: int) -> list[ir.Value]:
    """``x`` split along ``axis`` into ``count`` pieces of one size (which divides the dim).
    Split takes ``num_outputs`` from opset 18; before it the count of outputs says it."""
    if ctx.opset >= 18:
        return list(ctx.op.Split(x, axis=axis, num_outputs=count, _outputs=count))
    return list(ctx.op.Split(x, axis=axis, _outputs=count))


def per_dim(value: int | Sequence[int], n: int) -> list[int]:
    """An ``int[n]`` schema argument as n ints (PyTorch repeats a single value)."""
    values = [value] if isinstance(value, int) else list(value)
    return values * n if len(values) == 1 else values


def run_batched(ctx, x: ir.Value, spatial_rank: int, compute: Callable[[ir.Value], Any]) -> Any:
    """``compute(x)``, where ``compute`` emits ONNX ops that need batch and channel dims.

    PyTorch also takes inputs without a batch dim. Conv, ConvTranspose and the pooling ops take
    bfloat16 only from opset 22; before it they compute in float32. ``compute`` returns a value or
    a list of values; the (first) value is cast back to ``x``'s dtype.
    """
    dtype = x.dtype
    unbatched = rank(x) == spatial_rank + 1
    if unbatched:
        x = ctx.op.Unsqueeze(x, ints(ctx, [0]))
    if dtype == ir.DataType.BFLOAT16 and ctx.opset < 22:
        x = ctx.op.Cast(x, to=ir.DataType.FLOAT)
    results = compute(x)
    values = [results] if isinstance(results, ir.Value) else list(results)
    values[0] = cast(ctx, values[0], dtype)
    if unbatched:
        values = [ctx.op.Squeeze(v, ints(ctx, [0])) for v in values]
    return values[0] if isinstance(results, ir.Value) else values


def floating_input(node: torch.fx.Node) -> bool:
    """Whether the node's first argument is floating point, as ONNX Conv and the pooling ops need."""
    return node.args[0].meta["val"].dtype.is_floating_point
