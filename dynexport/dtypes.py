"""Conversions between torch dtypes and ONNX element types."""

from __future__ import annotations

import onnx_ir as ir
import torch

__all__ = ["FLOATING", "INTEGRAL", "carried_dtype", "scalar_dtype", "to_onnx_dtype", "to_torch_dtype"]

_TORCH_TO_ONNX: dict[torch.dtype, ir.DataType] = {
    torch.float32: ir.DataType.FLOAT,
    torch.float16: ir.DataType.FLOAT16,
    torch.bfloat16: ir.DataType.BFLOAT16,
    torch.float64: ir.DataType.DOUBLE,
    torch.int8: ir.DataType.INT8,
    torch.int16: ir.DataType.INT16,
    torch.int32: ir.DataType.INT32,
    torch.int64: ir.DataType.INT64,
    torch.uint8: ir.DataType.UINT8,
    torch.uint16: ir.DataType.UINT16,
    torch.uint32: ir.DataType.UINT32,
    torch.uint64: ir.DataType.UINT64,
    torch.bool: ir.DataType.BOOL,
    torch.complex64: ir.DataType.COMPLEX64,
    torch.complex128: ir.DataType.COMPLEX128,
    torch.float8_e4m3fn: ir.DataType.FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: ir.DataType.FLOAT8E4M3FNUZ,
    torch.float8_e5m2: ir.DataType.FLOAT8E5M2,
    torch.float8_e5m2fnuz: ir.DataType.FLOAT8E5M2FNUZ,
}
_ONNX_TO_TORCH = {onnx_type: torch_type for torch_type, onnx_type in _TORCH_TO_ONNX.items()}

FLOATING = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.FLOAT16,
        ir.DataType.BFLOAT16,
        ir.DataType.DOUBLE,
    }
)
INTEGRAL = frozenset(
    {
        ir.DataType.INT8,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.UINT16,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
    }
)


def to_onnx_dtype(dtype: torch.dtype) -> ir.DataType:
    try:
        return _TORCH_TO_ONNX[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no ONNX equivalent") from None


# onnxruntime has no complex kernels: inside a graph a complex tensor is carried as a real tensor
# of its parts' type with a trailing dim of 2 holding (real, imaginary).
_COMPLEX_PARTS: dict[torch.dtype, ir.DataType] = {
    torch.complex32: ir.DataType.FLOAT16,
    torch.complex64: ir.DataType.FLOAT,
    torch.complex128: ir.DataType.DOUBLE,
}


def carried_dtype(dtype: torch.dtype) -> ir.DataType:
    """The ONNX element type a tensor of ``dtype`` has in an exported graph: its own, or for a
    complex dtype its parts' (the tensor then has a trailing dim of 2, real and imaginary)."""
    parts = _COMPLEX_PARTS.get(dtype)
    return parts if parts is not None else to_onnx_dtype(dtype)


def to_torch_dtype(dtype: ir.DataType) -> torch.dtype:
    try:
        return _ONNX_TO_TORCH[dtype]
    except KeyError:
        raise TypeError(f"ONNX type {dtype.name} has no torch equivalent") from None


def scalar_dtype(val: object) -> ir.DataType:
    """The ONNX element type of a Python or symbolic scalar (SymInt, SymFloat, SymBool)."""
    if isinstance(val, (bool, torch.SymBool)):
        return ir.DataType.BOOL
    if isinstance(val, (int, torch.SymInt)):
        return ir.DataType.INT64
    if isinstance(val, (float, torch.SymFloat)):
        # Python floats are doubles, and so is SymFloat arithmetic in PyTorch.
        return ir.DataType.DOUBLE
    raise TypeError(f"no ONNX type for {type(val).__name__} value {val!r}")
