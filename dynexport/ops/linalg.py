"""Matrix products: matmul and its BLAS-style variants (mm, bmm, addmm, ...), linear, einsum,
bilinear's _trilinear, and transformers' grouped product of mixture-of-experts layers; the
determinant. (The inverse and solve are in linalg_solve.py.)"""

from __future__ import annotations

import string

import numpy as np
import onnx_ir as ir
import torch

from dynexport.dtypes import FLOATING
from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import (
    argument,
    arithmetic,
    cast,
    ints,
    rank,
    reduce,
    scalar_like,
    shape_of,
    shape_tensor,
    size_of,
)
from dynexport.registry import Promote, translates

aten = torch.ops.aten

# MatMul and Einsum take no bool and no 8- or 16-bit integer types (onnxruntime has no kernels
# for them either). A bool product computed in int32 and cast back is PyTorch's: any term true.
_NARROW_INTEGRAL = frozenset(
    {ir.DataType.BOOL, ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16}
)
# Einsum's subscripts: one letter per dim.
_LETTERS = string.ascii_lowercase + string.ascii_uppercase


def _compute_dtype(op_type: str, result: ir.DataType) -> ir.DataType:
    """The dtype MatMul or Einsum computes a ``result`` in: bools and narrow integers in int32
    (wrapping back agrees with PyTorch, whose narrow integer products wrap too), bfloat16 Einsum in float32
    (Einsum has no bfloat16 in any opset; PyTorch accumulates bfloat16 products in float32)."""
    if result in _NARROW_INTEGRAL:
        return ir.DataType.INT32
    if result == ir.DataType.BFLOAT16 and op_type == "Einsum":
        return ir.DataType.FLOAT
    return result


def _product(ctx, a: ir.Value, b: ir.Value) -> ir.Value:
    """MatMul of ``a`` and ``b``, in their dtype."""
    compute = _compute_dtype("MatMul", a.dtype)
    return cast(ctx, ctx.op.MatMul(cast(ctx, a, compute), cast(ctx, b, compute)), a.dtype)


def _matmul(ctx, a: ir.Value, b: ir.Value) -> ir.Value:
    """torch.matmul of two rule inputs (ranks known)."""
    if rank(b) == 1 and rank(a) >= 2:
        # onnxruntime's Transpose+MatMul fusion miscomputes a transposed matrix times a 1-D
        # vector (seen in 1.31); the same product with a column vector is fused correctly.
        column = ctx.op.Unsqueeze(b, ints(ctx, [1]))
        return ctx.op.Squeeze(_product(ctx, a, column), ints(ctx, [-1]))
    if _broadcasts_correctly(a, b):
        return _product(ctx, a, b)
    if rank(a) == 1:
        row = ctx.op.Unsqueeze(a, ints(ctx, [0]))
        return ctx.op.Squeeze(_product(ctx, *equal_batches(ctx, row, b)), ints(ctx, [-2]))
    return _product(ctx, *equal_batches(ctx, a, b))


def equal_batches(ctx, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``a`` and ``b`` with their batch dims (all but the last two) broadcast to each other's."""
    return tuple(
        ctx.op.Expand(x, ctx.op.Concat(shape_of(ctx, other, end=-2), ints(ctx, [1, 1]), axis=0))
        for x, other in ((a, b), (b, a))
    )


def _broadcasts_correctly(a: ir.Value, b: ir.Value) -> bool:
    """Whether onnxruntime's MatMul (1.31) gets this product right whatever the runtime sizes. It
    refuses to broadcast a second operand's size-0 batch dim, and when the inner dim is 0 and the
    batch dims differ it takes the first operand's and leaves the output uninitialized. A 2-D
    second operand and equal batch dims are safe; otherwise the second operand's batch and inner
    sizes must be static and nonzero."""
    if rank(b) <= 2 or a.shape[:-2] == b.shape[:-2]:
        return True
    return all(isinstance(size, int) and size > 0 for size in b.shape[:-1])


def _gemm_fits(x: ir.Value, *scalars: float) -> bool:
    """Whether Gemm computes this exactly: onnxruntime has Gemm kernels for floating types
    only, and Gemm's alpha and beta are float32 attributes."""
    return x.dtype in FLOATING and all(float(np.float32(s)) == s for s in scalars)


def _nonempty_inner_dim(mat1: ir.Value) -> bool:
    # onnxruntime's Gemm returns C itself, not beta * C, when the inner dim is 0.
    size = mat1.shape[-1]
    return isinstance(size, int) and size > 0


def _scaled_add(ctx, self: ir.Value, product: ir.Value, beta, alpha) -> ir.Value:
    """``beta * self + alpha * product``; beta=0 ignores self, NaN and inf included, as in PyTorch."""
    if alpha != 1:
        product = arithmetic(ctx, "Mul", product, scalar_like(ctx, alpha, self))
    if beta == 0:
        return product
    if beta != 1:
        self = arithmetic(ctx, "Mul", self, scalar_like(ctx, beta, self))
    return arithmetic(ctx, "Add", self, product)


@translates(
    aten.matmul.default,
    aten.mm.default,
    aten.bmm.default,
    aten.mv.default,
    aten.dot.default,
    aten.vdot.default,
)
def matmul(ctx, self, other):
    # ONNX MatMul follows numpy.matmul, as torch.matmul does: 1-D operands and batch broadcasting.
    return _matmul(ctx, self, other)


@translates(aten.addmm.default)
def addmm(ctx, self, mat1, mat2, *, beta=1, alpha=1):
    if _gemm_fits(mat1, alpha, beta) and (beta in (0, 1) or _nonempty_inner_dim(mat1)):
        bias = [] if beta == 0 else [self]
        return ctx.op.Gemm(mat1, mat2, *bias, alpha=float(alpha), beta=float(beta))
    return _scaled_add(ctx, self, _matmul(ctx, mat1, mat2), beta, alpha)


@translates(aten.baddbmm.default)
def baddbmm(ctx, self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_add(ctx, self, _matmul(ctx, batch1, batch2), beta, alpha)


@translates(aten.addbmm.default)
def addbmm(ctx, self, batch1, batch2, *, beta=1, alpha=1):
    # The sum of the b products [n, m] @ [m, p] is one product [n, b*m] @ [b*m, p]: one
    # accumulation, as PyTorch's, and no ReduceSum (which has no narrow integer types).
    rows = ctx.op.Reshape(ctx.op.Transpose(batch1, perm=[1, 0, 2]), ints(ctx, [0, -1]))
    columns = ctx.op.Reshape(batch2, shape_tensor(ctx, [-1, size_of(ctx, batch2, 2)]))
    return _scaled_add(ctx, self, _product(ctx, rows, columns), beta, alpha)


@translates(aten.addmv.default)
def addmv(ctx, self, mat, vec, *, beta=1, alpha=1):
    return _scaled_add(ctx, self, _matmul(ctx, mat, vec), beta, alpha)


@translates(aten.linear.default)
def linear(ctx, input, weight, bias=None):
    biases = [] if bias is None else [bias]
    if rank(input) == 2 and rank(weight) == 2 and _gemm_fits(input):
        return ctx.op.Gemm(input, weight, *biases, transB=1)
    if rank(weight) == 2:
        product = _product(ctx, input, ctx.op.Transpose(weight, perm=[1, 0]))
    else:
        product = _matmul(ctx, input, weight)
    return ctx.op.Add(product, bias) if biases else product


@translates("transformers::grouped_mm_fallback")
def grouped_mm_fallback(ctx, input, weight, offs):
    # transformers' mixture-of-experts layers (the experts' default "grouped_mm" implementation,
    # in float32 or while traced): the rows of ``input`` sorted by expert, expert i's rows
    # offs[i - 1]:offs[i] times weight[i]; the rows from offs[-1] on (expert-parallel
    # sentinels) are zeros. One product per expert on its slice of rows.
    experts = weight.shape[0]
    if not isinstance(experts, int):
        raise TranslationError(
            "transformers::grouped_mm_fallback", source_line(ctx.node), "the number of experts is dynamic",
            "keep the experts' weights' first dim static",
        )
    ends = cast(ctx, offs, ir.DataType.INT64)
    start = ints(ctx, [0])
    products = []
    for expert in range(experts):
        end = ctx.op.Slice(ends, ints(ctx, [expert]), ints(ctx, [expert + 1]))
        rows = ctx.op.Slice(input, start, end, ints(ctx, [0]))
        products.append(_product(ctx, rows, ctx.op.Gather(weight, ctx.constant(expert, ir.DataType.INT64), axis=0)))
        start = end
    unrouted = ctx.op.Sub(shape_of(ctx, input, end=1), start)
    pads = ctx.op.Concat(ints(ctx, [0, 0]), unrouted, ints(ctx, [0]), axis=0)  # begins, then ends
    return ctx.op.Pad(ctx.op.Concat(*products, axis=0), pads)


@translates(aten.outer.default, promote=Promote.RESULT, promoted=("self", "vec2"))
def outer(ctx, self, vec2):
    column = ctx.op.Unsqueeze(self, ints(ctx, [1]))
    if self.dtype == ir.DataType.BOOL:
        return ctx.op.And(column, vec2)
    return ctx.op.Mul(column, vec2)


@translates(aten.einsum.default)
def einsum(ctx, equation, tensors, *, path=None):
    # ONNX's equation grammar has no spaces; its implicit output (no "->") matches PyTorch's.
    inputs, arrow, output = equation.replace(" ", "").partition("->")
    tensors, ellipsis_rank = _equal_ellipses(ctx, inputs.split(","), tensors)
    # onnxruntime wants an ellipsis in the output when the inputs have one: keep its dims and
    # sum them afterwards.
    summed = bool(arrow) and ellipsis_rank > 0 and "..." not in output
    if summed:
        output = "..." + output
    # A one-operand integer reduction ("i->") sums into int64, as PyTorch's sum does.
    result = _einsum(ctx, inputs + arrow + output, *tensors)
    if summed:
        result = reduce(ctx, "ReduceSum", result, list(range(ellipsis_rank)), keepdims=False)
    return cast(ctx, result, ctx.out_dtype)


def _einsum(ctx, equation: str, *operands: ir.Value) -> ir.Value:
    """Einsum over ``operands`` computed for the node's result dtype (see :func:`_compute_dtype`)."""
    compute = _compute_dtype("Einsum", ctx.out_dtype)
    return ctx.op.Einsum(*[cast(ctx, x, compute) for x in operands], equation=equation)


def _equal_ellipses(ctx, terms: list[str], tensors: list[ir.Value]) -> tuple[list[ir.Value], int]:
    """The operands with size-1 dims added where their ``...`` covers fewer dims than another's
    (PyTorch broadcasts ellipses right-aligned, ONNX wants them all of one rank), and that rank."""
    covered = [rank(x) - len(term.replace("...", "")) if "..." in term else None for term, x in zip(terms, tensors)]
    widest = max((n for n in covered if n is not None), default=0)
    aligned = []
    for term, x, n in zip(terms, tensors, covered):
        if n is not None and n < widest:
            start = term.index("...")
            x = ctx.op.Unsqueeze(x, ints(ctx, list(range(start, start + widest - n))))
        aligned.append(x)
    return aligned, widest


def _trilinear_dims(expand1, expand2, expand3, sumdim, total: int) -> tuple[list[set[int]], set[int]]:
    """The dims each operand lacks (its expand dims) and the summed dims, in [0, total)."""
    expands = [{d % total for d in expand} for expand in (expand1, expand2, expand3)]
    return expands, {d % total for d in sumdim}


def _trilinear_output_dims_in_an_operand(node: torch.fx.Node) -> bool:
    # PyTorch sizes a kept dim that every operand lacks 0 (an empty result); Einsum cannot.
    expand1 = argument(node, "expand1")
    total = argument(node, "i1").meta["val"].dim() + len(expand1)
    expands, summed = _trilinear_dims(
        expand1, argument(node, "expand2"), argument(node, "expand3"), argument(node, "sumdim"), total
    )
    return all(d in summed or not all(d in expand for expand in expands) for d in range(total))


@translates(aten._trilinear.default, checker=_trilinear_output_dims_in_an_operand)
def trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # The operands, each unsqueezed at its expand dims, multiplied (broadcasting) and summed over
    # sumdim: one Einsum with a letter per dim, which an operand lacks where it is expanded.
    # (unroll_dim only chooses PyTorch's loop order.)
    total = rank(i1) + len(expand1)
    expands, summed = _trilinear_dims(expand1, expand2, expand3, sumdim, total)
    terms = ["".join(_LETTERS[d] for d in range(total) if d not in expand) for expand in expands]
    output = "".join(_LETTERS[d] for d in range(total) if d not in summed)
    return cast(ctx, _einsum(ctx, ",".join(terms) + "->" + output, i1, i2, i3), ctx.out_dtype)


@translates(aten.bilinear.default, promote=Promote.RESULT, promoted=("input1", "input2", "weight", "bias"))
def bilinear(ctx, input1, input2, weight, bias=None):
    # y[..., o] = x1[..., i] W[o, i, j] x2[..., j] (+ b[o]): one Einsum, no _trilinear detour.
    product = cast(ctx, _einsum(ctx, "...i,oij,...j->...o", input1, weight, input2), ctx.out_dtype)
    return product if bias is None else ctx.op.Add(product, bias)


@translates(aten.linalg_det.default, aten.det.default)
def linalg_det(ctx, A):
    return ctx.op.Det(A)


@translates(aten.logdet.default)
def logdet(ctx, self):
    # log of a negative determinant is NaN and of 0 -inf, as PyTorch's logdet.
    return ctx.op.Log(ctx.op.Det(self))


def _sign_and_log_only(node: torch.fx.Node) -> bool:
    # The LU factors and pivots only serve backward.
    return all(user.args[1] in (0, 1) or not user.users for user in node.users)


@translates(aten._linalg_slogdet.default, checker=_sign_and_log_only)
def linalg_slogdet(ctx, A):
    det = ctx.op.Det(A)
    return ctx.op.Sign(det), ctx.op.Log(ctx.op.Abs(det)), None, None
