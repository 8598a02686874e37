"""SymInt, SymFloat and SymBool arithmetic: int64, double and bool scalar shape computations."""

from __future__ import annotations

import math
import operator

import onnx_ir as ir
import torch

from dynexport.ops._helpers import bitwise, cast, least_value, scalar, shape_tensor
from dynexport.ops.elementwise import floor_divide, remainder
from dynexport.registry import translates

aten = torch.ops.aten


@translates(operator.getitem)
def getitem(ctx, outputs, index):
    # Multi-output ops return Python lists of values; getitem only picks one.
    return outputs[index]


@translates(aten.sym_size.int)
def sym_size(ctx, self, dim):
    return ctx.sym_size(self, dim)


@translates(aten.sym_numel.default)
def sym_numel(ctx, self):
    return ctx.op.Size(self)


def _binary(onnx_op: str):
    def rule(ctx, a, b):
        dtype = ctx.out_dtype
        return getattr(ctx.op, onnx_op)(scalar(ctx, a, dtype), scalar(ctx, b, dtype))

    rule.__name__ = rule.__qualname__ = f"sym_{onnx_op.lower()}"
    return rule


translates(operator.add)(_binary("Add"))
translates(operator.sub)(_binary("Sub"))
translates(operator.mul)(_binary("Mul"))
translates(operator.truediv)(_binary("Div"))
translates(operator.pow)(_binary("Pow"))
translates(torch.sym_max)(_binary("Max"))
translates(torch.sym_min)(_binary("Min"))


def _surely_nonnegative(arg) -> bool:
    """Whether an FX argument is an int or a SymInt that is at least 0 at every size the export
    accepts (``(height - 3) // 2`` where the height's declared range starts at 3)."""
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
    return isinstance(val, (int, torch.SymInt)) and least_value(val) >= 0


@translates(operator.floordiv)
def sym_floordiv(ctx, a, b):
    dtype = ctx.out_dtype
    a, b = scalar(ctx, a, dtype), scalar(ctx, b, dtype)
    if dtype == ir.DataType.INT64 and all(_surely_nonnegative(arg) for arg in ctx.node.args):
        return ctx.op.Div(a, b)  # truncation is floor division for nonnegative operands
    return floor_divide(ctx, a, b)


@translates(operator.mod)
def sym_mod(ctx, a, b):
    dtype = ctx.out_dtype
    return remainder(ctx, scalar(ctx, a, dtype), scalar(ctx, b, dtype))


@translates(operator.neg)
def sym_neg(ctx, a):
    return ctx.op.Neg(a)


def _compare(onnx_op: str, negate: bool = False):
    def rule(ctx, a, b):
        dtype = ir.DataType.DOUBLE if any(
            isinstance(v, float) or (isinstance(v, ir.Value) and v.dtype == ir.DataType.DOUBLE) for v in (a, b)
        ) else ir.DataType.INT64
        result = getattr(ctx.op, onnx_op)(scalar(ctx, a, dtype), scalar(ctx, b, dtype))
        return ctx.op.Not(result) if negate else result

    rule.__name__ = rule.__qualname__ = f"sym_{onnx_op.lower()}"
    return rule


translates(operator.eq)(_compare("Equal"))
translates(operator.ne)(_compare("Equal", negate=True))
translates(operator.lt)(_compare("Less"))
translates(operator.le)(_compare("LessOrEqual"))
translates(operator.gt)(_compare("Greater"))
translates(operator.ge)(_compare("GreaterOrEqual"))


@translates(torch.sym_not, operator.not_)
def sym_not(ctx, a):
    return ctx.op.Not(a)


def _logical_or_bitwise(op_type: str):
    """``&`` and ``|`` giving a SymBool are logical (TorchScript may pass its booleans as ints);
    giving a SymInt they are bitwise on int64, as in Python."""

    def rule(ctx, a, b):
        if isinstance(ctx.node.meta.get("val"), (torch.SymBool, bool)):
            return getattr(ctx.op, op_type)(scalar(ctx, a, ir.DataType.BOOL), scalar(ctx, b, ir.DataType.BOOL))
        return bitwise(ctx, op_type, scalar(ctx, a, ir.DataType.INT64), scalar(ctx, b, ir.DataType.INT64))

    rule.__name__ = rule.__qualname__ = f"sym_{op_type.lower()}"
    return rule


translates(operator.and_)(_logical_or_bitwise("And"))
translates(operator.or_)(_logical_or_bitwise("Or"))


@translates(torch.sym_ite)
def sym_ite(ctx, condition, then, otherwise):
    dtype = ctx.out_dtype
    return ctx.op.Where(scalar(ctx, condition, ir.DataType.BOOL), scalar(ctx, then, dtype), scalar(ctx, otherwise, dtype))


@translates(torch.sym_float)
def sym_float(ctx, a):
    return scalar(ctx, a, ir.DataType.DOUBLE)


@translates(torch.sym_int)
def sym_int(ctx, a):
    # int() truncates toward zero.
    if a.dtype == ir.DataType.INT64:
        return a
    return cast(ctx, ctx.op.Mul(ctx.op.Sign(a), ctx.op.Floor(ctx.op.Abs(a))), ir.DataType.INT64)


@translates(math.ceil, math.floor, math.trunc)
def sym_round(ctx, a):
    if a.dtype == ir.DataType.INT64:
        return a
    name = ctx.node.target.__name__
    rounded = ctx.op.Ceil(a) if name == "ceil" else ctx.op.Floor(a) if name == "floor" else sym_int(ctx, a)
    return cast(ctx, rounded, ir.DataType.INT64)


@translates(math.sqrt)
def sym_sqrt(ctx, a):
    return ctx.op.Sqrt(scalar(ctx, a, ir.DataType.DOUBLE))


@translates(aten.scalar_tensor.default)
def scalar_tensor(ctx, s, *, dtype=None):
    return scalar(ctx, s, ctx.out_dtype)


@translates(aten._local_scalar_dense.default)
def local_scalar_dense(ctx, self):
    # .item(): the scalar stays a tensor; shape arithmetic downstream treats it as a SymInt.
    return cast(ctx, ctx.op.Reshape(self, shape_tensor(ctx, [])), ctx.out_dtype)
