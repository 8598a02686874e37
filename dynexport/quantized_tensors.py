"""Quantized tensors as their float values, while a quantized model is captured.

torch.export cannot trace PyTorch's quantized tensors: its fake tensors have no quantized
kernels. During the capture (dynexport/quantized_modules.py), each quantized tensor is
represented by its dequantized float value, tagged with its :class:`QParams` in a side table
(:class:`QuantizedTensors`, a torch function mode keyed by the tensor object). Functions called
on such a tensor are computed in float and quantized again (``quantized_decomposed`` quantize ->
dequantize, later QuantizeLinear/DequantizeLinear) where PyTorch's quantized kernel produces new
values, with the parameters that kernel gives its output: the input's (averaging, clamping,
``cat`` into its first input's), fixed ones (``sigmoid``, ``tanh``, ``hardsigmoid``) or the
call's (``torch.ops.quantized.add`` ...). Views, ``relu`` and max pooling keep the input's values
and parameters. Any other function given a quantized tensor is refused, naming it: dynexport does
not guess how a kernel it does not know rounds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # defines torch.ops.quantized_decomposed
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

__all__ = ["QParams", "QuantizedCaptureError", "QuantizedTensors"]

quantized_decomposed = torch.ops.quantized_decomposed

_STORAGE = {
    torch.quint8: (torch.uint8, 0, 255),
    torch.qint8: (torch.int8, -128, 127),
    torch.qint32: (torch.int32, -(2**31), 2**31 - 1),
}


class QuantizedCaptureError(RuntimeError):
    """A quantized tensor or module that dynexport cannot represent in float soundly."""


@dataclasses.dataclass(frozen=True)
class QParams:
    """How a quantized tensor maps to floats: per tensor (``axis`` None; scale and zero point
    Python numbers, or 0-d tensors where the model holds them as buffers) or per channel."""

    scale: float | torch.Tensor
    zero_point: int | torch.Tensor
    dtype: torch.dtype
    axis: int | None = None

    def quantize_dequantize(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded to this grid, saturated to the dtype's range, as floats."""
        storage, low, high = _storage(self.dtype)
        x = x.float()
        if self.axis is not None:
            q = quantized_decomposed.quantize_per_channel(x, self.scale, self.zero_point, self.axis, low, high, storage)
            return quantized_decomposed.dequantize_per_channel(
                q, self.scale, self.zero_point, self.axis, low, high, storage
            )
        per_tensor = self._overload("quantize")
        q = per_tensor(x, self.scale, self.zero_point, low, high, storage)
        return self._overload("dequantize")(q, self.scale, self.zero_point, low, high, storage)

    def integers(self, x: torch.Tensor) -> torch.Tensor:
        """The stored integers of the quantized tensor whose float value is ``x``."""
        storage, low, high = _storage(self.dtype)
        if self.axis is not None:
            return quantized_decomposed.quantize_per_channel(
                x, self.scale, self.zero_point, self.axis, low, high, storage
            )
        return self._overload("quantize")(x, self.scale, self.zero_point, low, high, storage)

    def dequantize(self, integers: torch.Tensor) -> torch.Tensor:
        """The float values of stored ``integers``."""
        storage, low, high = _storage(self.dtype)
        if self.axis is not None:
            return quantized_decomposed.dequantize_per_channel(
                integers, self.scale, self.zero_point, self.axis, low, high, storage
            )
        return self._overload("dequantize")(integers, self.scale, self.zero_point, low, high, storage)

    def _overload(self, kind: str):
        packet = getattr(quantized_decomposed, f"{kind}_per_tensor")
        return packet.tensor if isinstance(self.scale, torch.Tensor) else packet.default


def _storage(dtype: torch.dtype) -> tuple[torch.dtype, int, int]:
    if dtype not in _STORAGE:
        raise QuantizedCaptureError(f"quantized dtype {dtype} has no QuantizeLinear form (quint8, qint8 or qint32)")
    return _STORAGE[dtype]


# -- the side table and the functions on quantized tensors -------------------------------------


class QuantizedTensors(TorchFunctionMode):
    """The float values that stand for quantized tensors, each with its :class:`QParams`, and the
    torch functions called on them."""

    def __init__(self):
        super().__init__()
        self._qparams: dict[int, tuple[torch.Tensor, QParams]] = {}
        self._twin_depth = 0

    def mark(self, value: torch.Tensor, qparams: QParams) -> torch.Tensor:
        self._qparams[id(value)] = (value, qparams)
        return value

    def qparams(self, value: Any) -> QParams | None:
        entry = self._qparams.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None

    def quantized_input(self, value: torch.Tensor, module: torch.nn.Module) -> QParams:
        qparams = self.qparams(value)
        if qparams is None:
            raise QuantizedCaptureError(
                f"{type(module).__name__} takes a quantized tensor and was given a float one (PyTorch "
                "fails the same way): put a QuantStub before it"
            )
        return qparams

    @contextlib.contextmanager
    def inside_twin(self) -> Iterator[None]:
        """A twin module's own float computation: its functions pass through untouched."""
        self._twin_depth += 1
        try:
            yield
        finally:
            self._twin_depth -= 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._twin_depth:
            return func(*args, **kwargs)
        constructor = _CONSTRUCTORS.get(func)
        if constructor is not None:
            return constructor(self, *args, **kwargs)
        quantized = [self.qparams(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        quantized = [q for q in quantized if q is not None]
        if not quantized:
            return func(*args, **kwargs)
        rule = _RULES.get(func)
        if rule is not None:
            return rule(self, quantized[0], func, args, kwargs)
        result = func(*args, **kwargs)
        if any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(result)):
            raise QuantizedCaptureError(
                f"{_name(func)} on a quantized tensor: dynexport does not know how PyTorch's "
                "quantized kernel rounds it; dequantize the tensor before it (DeQuantStub or "
                "x.dequantize()) or use a quantized module"
            )
        return result  # sizes, dims and other metadata

    def mark_floats(self, result: Any, qparams: QParams) -> Any:
        for leaf in pytree.tree_leaves(result):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                self.mark(leaf, qparams)
        return result


def _name(func: Callable) -> str:
    """``torch.exp``, ``Tensor.exp``, ``torch.nn.functional.gelu``: how the model calls it."""
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    owner, _, name = qualname.rpartition(".")
    if owner == "_VariableFunctionsClass":
        return f"torch.{name}"
    if owner == "TensorBase" or owner == "Tensor":
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None)
    return f"{module}.{qualname}" if module else qualname


def _on_grid(tensors: QuantizedTensors, qparams: QParams, func, args, kwargs):
    """Functions whose results hold input values (views, relu, max pooling): PyTorch keeps the
    input's parameters, and the values are on its grid already."""
    if qparams.axis is not None and func not in _AXIS_KEEPING:
        raise QuantizedCaptureError(
            f"{_name(func)} on a per-channel quantized tensor (it may move the channel axis): dequantize it first"
        )
    return tensors.mark_floats(func(*args, **kwargs), qparams)


_AXIS_KEEPING = frozenset({torch.Tensor.clone, torch.Tensor.contiguous, torch.Tensor.detach})


def _requantized(tensors: QuantizedTensors, qparams: QParams, func, args, kwargs):
    """Functions whose quantized kernels compute new values in the input's parameters."""
    if qparams.axis is not None:
        raise QuantizedCaptureError(f"{_name(func)} on a per-channel quantized tensor has no quantized kernel")
    return tensors.mark(qparams.quantize_dequantize(func(*args, **kwargs)), qparams)


# The quantized kernels of these give fixed parameters that depend only on the dtype.
_FIXED_QPARAMS = {
    "sigmoid": {torch.quint8: (1.0 / 256, 0), torch.qint8: (1.0 / 256, -128)},
    "hardsigmoid": {torch.quint8: (1.0 / 256, 0), torch.qint8: (1.0 / 256, -128)},
    "tanh": {torch.quint8: (2.0 / 256, 128), torch.qint8: (2.0 / 256, 0)},
}


def _fixed(kind: str):
    def rule(tensors: QuantizedTensors, qparams: QParams, func, args, kwargs):
        if qparams.dtype not in _FIXED_QPARAMS[kind]:
            raise QuantizedCaptureError(f"{_name(func)} on a {qparams.dtype} tensor has no quantized kernel")
        scale, zero_point = _FIXED_QPARAMS[kind][qparams.dtype]
        output = QParams(scale, zero_point, qparams.dtype)
        return tensors.mark(output.quantize_dequantize(func(*args, **kwargs)), output)

    return rule


def _dequantize(tensors: QuantizedTensors, qparams, func, args, kwargs):
    (value,) = args
    return torch.ops.aten.alias(value)  # the same floats, no longer standing for a quantized tensor


def _integers(tensors: QuantizedTensors, qparams: QParams, func, args, kwargs):
    return qparams.integers(args[0])


def _number(name: str):
    def rule(tensors: QuantizedTensors, qparams: QParams, func, args, kwargs):
        value = getattr(qparams, name)
        if isinstance(value, torch.Tensor) or qparams.axis is not None:
            raise QuantizedCaptureError(
                f"{_name(func)}: the quantization parameter is data of the traced program, not a number"
            )
        return value

    return rule


def _is_quantized(tensors: QuantizedTensors, qparams, func, args, kwargs):
    return True


def _quantized_op(float_op: Callable[..., torch.Tensor]):
    """``torch.ops.quantized`` arithmetic called directly (FX's converted graphs do): the float
    op, quantized with the output scale and zero point the call gives."""

    def rule(tensors: QuantizedTensors, qparams: QParams, func, args, kwargs):
        *operands, scale, zero_point = [*args, *kwargs.values()]
        output = QParams(_scalar(scale), _scalar(zero_point), qparams.dtype)
        return tensors.mark(output.quantize_dequantize(float_op(*operands)), output)

    return rule


def _quantized_cat(tensors: QuantizedTensors, qparams: QParams, func, args, kwargs):
    values, dim, scale, zero_point = [*args, *kwargs.values()]
    if scale is None:
        return tensors.mark(torch.cat(values, dim), qparams)
    output = QParams(_scalar(scale), _scalar(zero_point), qparams.dtype)
    return tensors.mark(output.quantize_dequantize(torch.cat(values, dim)), output)


def _quantize_per_tensor(tensors: QuantizedTensors, input, scale, zero_point, dtype):
    if isinstance(input, (list, tuple)):
        return [_quantize_per_tensor(tensors, x, s, z, dtype) for x, s, z in zip(input, scale, zero_point)]
    qparams = QParams(_scalar(scale), _scalar(zero_point), dtype)
    return tensors.mark(qparams.quantize_dequantize(input), qparams)


def _quantize_per_channel(tensors: QuantizedTensors, input, scales, zero_points, axis, dtype):
    qparams = QParams(scales.float(), zero_points, dtype, axis)
    return tensors.mark(qparams.quantize_dequantize(input), qparams)


def _scalar(value: Any) -> float | int | torch.Tensor:
    """A scale or zero point as the model gives it: a number, or a one-element tensor as 0-d."""
    return value.reshape(()) if isinstance(value, torch.Tensor) else value


_CONSTRUCTORS = {torch.quantize_per_tensor: _quantize_per_tensor, torch.quantize_per_channel: _quantize_per_channel}


def _functions(owner: Any, names: str) -> list[Callable]:
    return [getattr(owner, name) for name in names.split() if hasattr(owner, name)]


_TENSOR = torch.Tensor
_RULES: dict[Any, Callable] = {}
for _function in [
    *_functions(
        _TENSOR,
        "view view_as reshape reshape_as flatten permute transpose t squeeze unsqueeze contiguous clone detach "
        "__getitem__ select narrow expand expand_as repeat chunk split unbind relu relu_ flip",
    ),
    *_functions(
        torch,
        "flatten reshape permute transpose squeeze unsqueeze chunk split unbind relu relu_ select narrow flip",
    ),
    *_functions(
        F,
        "relu relu_ max_pool1d max_pool2d max_pool3d adaptive_max_pool1d adaptive_max_pool2d dropout "
        "dropout1d dropout2d dropout3d pixel_shuffle pixel_unshuffle",
    ),
]:
    _RULES[_function] = _on_grid
for _function in [
    *_functions(_TENSOR, "mean clamp clamp_ clip hardtanh"),
    # cat and stack take the first input's parameters and requantize the others into them.
    *_functions(torch, "mean clamp clamp_ clip cat concat concatenate stack"),
    # (pad: a constant other than 0 is rounded to the grid.)
    *_functions(
        F,
        "avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d "
        "interpolate upsample upsample_nearest upsample_bilinear hardtanh hardtanh_ relu6 leaky_relu leaky_relu_ pad",
    ),
]:
    _RULES[_function] = _requantized
for _kind, _owners in {"sigmoid": (_TENSOR, torch, F), "tanh": (_TENSOR, torch, F), "hardsigmoid": (F,)}.items():
    for _owner in _owners:
        _RULES[getattr(_owner, _kind)] = _fixed(_kind)
_RULES.update(
    {
        torch.ops.quantized.add: _quantized_op(torch.add),
        torch.ops.quantized.add_relu: _quantized_op(lambda a, b: torch.relu(a + b)),
        torch.ops.quantized.mul: _quantized_op(torch.mul),
        torch.ops.quantized.mul_relu: _quantized_op(lambda a, b: torch.relu(a * b)),
        torch.ops.quantized.matmul: _quantized_op(torch.matmul),
        torch.ops.quantized.cat: _quantized_cat,
        _TENSOR.dequantize: _dequantize,
        torch.dequantize: _dequantize,
        _TENSOR.int_repr: _integers,
        _TENSOR.q_scale: _number("scale"),
        _TENSOR.q_zero_point: _number("zero_point"),
        _TENSOR.is_quantized.__get__: _is_quantized,
    }
)
