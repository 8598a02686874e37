"""Matrix products: matmul and its BLAS-style variants (mm, bmm, addmm, ...), linear, einsum."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import torch

from dynexport.dtypes import FLOATING
from dynexport.ops._helpers import cast, ints, rank, scalar_like
from dynexport.registry import Promote, translates

aten = torch.ops.aten

# MatMul has no 8- or 16-bit integer types (nor onnxruntime an Einsum kernel for them).
_NARROW_INTEGRAL = frozenset(
    {ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16}
)


def _product(ctx, op_type: str, *operands: ir.Value, **attributes) -> ir.Value:
    """``op_type`` (MatMul, Einsum) over ``operands``, narrow integers computed in int32.

    Wrapping the int32 result back agrees with PyTorch, whose narrow integer products wrap too.
    """
    dtype = operands[0].dtype
    if dtype not in _NARROW_INTEGRAL:
        return getattr(ctx.op, op_type)(*operands, **attributes)
    wide = [cast(ctx, x, ir.DataType.INT32) for x in operands]
    return cast(ctx, getattr(ctx.op, op_type)(*wide, **attributes), dtype)


def _matmul(ctx, a: ir.Value, b: ir.Value) -> ir.Value:
    """torch.matmul of two rule inputs (ranks known)."""
    if rank(b) == 1 and rank(a) >= 2:
        # onnxruntime's Transpose+MatMul fusion miscomputes a transposed matrix times a 1-D
        # vector (seen in 1.31); the same product with a column vector is fused correctly.
        column = ctx.op.Unsqueeze(b, ints(ctx, [1]))
        return ctx.op.Squeeze(_product(ctx, "MatMul", a, column), ints(ctx, [-1]))
    return _product(ctx, "MatMul", a, b)


def _gemm_fits(x: ir.Value, *scalars: float) -> bool:
    """Whether Gemm computes this exactly: onnxruntime has Gemm kernels for floating types
    only, and Gemm's alpha and beta are float32 attributes."""
    return x.dtype in FLOATING and all(float(np.float32(s)) == s for s in scalars)


def _scaled_add(ctx, self: ir.Value, product: ir.Value, beta, alpha) -> ir.Value:
    """``beta * self + alpha * product``; beta=0 ignores self, NaN and inf included, as in PyTorch."""
    if alpha != 1:
        product = ctx.op.Mul(product, scalar_like(ctx, alpha, self))
    if beta == 0:
        return product
    if beta != 1:
        self = ctx.op.Mul(self, scalar_like(ctx, beta, self))
    return ctx.op.Add(self, product)


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
    if _gemm_fits(mat1, alpha, beta):
        bias = [] if beta == 0 else [self]
        return ctx.op.Gemm(mat1, mat2, *bias, alpha=float(alpha), beta=float(beta))
    return _scaled_add(ctx, self, _matmul(ctx, mat1, mat2), beta, alpha)


@translates(aten.baddbmm.default)
def baddbmm(ctx, self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_add(ctx, self, _matmul(ctx, batch1, batch2), beta, alpha)


@translates(aten.addbmm.default)
def addbmm(ctx, self, batch1, batch2, *, beta=1, alpha=1):
    products = _matmul(ctx, batch1, batch2)
    return _scaled_add(ctx, self, ctx.op.ReduceSum(products, ints(ctx, [0]), keepdims=0), beta, alpha)


@translates(aten.addmv.default)
def addmv(ctx, self, mat, vec, *, beta=1, alpha=1):
    return _scaled_add(ctx, self, _matmul(ctx, mat, vec), beta, alpha)


@translates(aten.linear.default)
def linear(ctx, input, weight, bias=None):
    biases = [] if bias is None else [bias]
    if rank(input) == 2 and rank(weight) == 2 and _gemm_fits(input):
        return ctx.op.Gemm(input, weight, *biases, transB=1)
    if rank(weight) == 2:
        product = _product(ctx, "MatMul", input, ctx.op.Transpose(weight, perm=[1, 0]))
    else:
        product = _matmul(ctx, input, weight)
    return ctx.op.Add(product, bias) if biases else product


@translates(aten.outer.default, promote=Promote.RESULT, promoted=("self", "vec2"))
def outer(ctx, self, vec2):
    column = ctx.op.Unsqueeze(self, ints(ctx, [1]))
    if self.dtype == ir.DataType.BOOL:
        return ctx.op.And(column, vec2)
    return ctx.op.Mul(column, vec2)


@translates(aten.einsum.default)
def einsum(ctx, equation, tensors, *, path=None):
    # ONNX's equation grammar has no spaces; its implicit output (no "->") matches PyTorch's.
    equation = equation.replace(" ", "")
    dtype = tensors[0].dtype
    if dtype == ir.DataType.BFLOAT16:
        # Einsum has no bfloat16 in any opset; PyTorch accumulates bfloat16 products in float32.
        wide = [cast(ctx, x, ir.DataType.FLOAT) for x in tensors]
        return cast(ctx, ctx.op.Einsum(*wide, equation=equation), dtype)
    return _product(ctx, "Einsum", *tensors, equation=equation)


@translates(aten.linalg_det.default, aten.det.default)
def linalg_det(ctx, A):
    return ctx.op.Det(A)
