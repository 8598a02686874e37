"""Quantized and quantization-aware models made capturable, for the capture only.

torch.export cannot trace the packed weights of ``torch.ao.nn.quantized`` modules, nor the
quantized tensors they pass each other, and a QAT model's ``FakeQuantize`` modules branch on
their observer flags and read their scale as data. While :func:`quantized_modules_as_float` is
active:

- quantized tensors are their dequantized float values, tagged with their parameters, and
  functions on them are computed in float (dynexport/quantized_tensors.py);
- each quantized module is swapped for a float twin: the float computation on the dequantized
  input and weights (int8 weights stay int8 behind a ``dequantize_per_channel``/``_per_tensor``),
  followed by ``quantized_decomposed`` quantize -> dequantize with the module's output scale and
  zero point. Those ops become QuantizeLinear/DequantizeLinear (dynexport/ops/quantization.py);
- each ``FakeQuantize`` module is swapped for fake quantization with its current scale and zero
  point as constants (what ``convert`` would freeze).

The user's modules are put back when the scope ends, and torch is left unchanged.

PyTorch's quantized kernels accumulate in integers and requantize once, the exported graph
computes in float: an output can differ from eager by one quantization step of that output
where the two round a value that lies within float error of a rounding tie (averaging kernels
also round their ties their own way). docs/quantization.md states the bound and its tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
import torch.nn.functional as F
from torch.ao.quantization.fake_quantize import FakeQuantizeBase, FixedQParamsFakeQuantize
from torch.utils._python_dispatch import _disable_current_modes

from dynexport.quantized_tensors import QParams, QuantizedCaptureError, QuantizedTensors

__all__ = ["QuantizedCaptureError", "quantized_modules_as_float", "uses_quantization"]


def _weight_qparams(weight: torch.Tensor) -> tuple[torch.Tensor, QParams]:
    """A quantized weight's stored integers and parameters."""
    if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        qparams = QParams(weight.q_scale(), weight.q_zero_point(), weight.dtype)
    elif weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        qparams = QParams(
            weight.q_per_channel_scales().float(),
            weight.q_per_channel_zero_points(),
            weight.dtype,
            weight.q_per_channel_axis(),
        )
    else:
        raise QuantizedCaptureError(f"weights quantized {weight.qscheme()} have no QuantizeLinear form")
    return weight.int_repr(), qparams


# -- float twins of the quantized modules -------------------------------------------------------


class _Twin(torch.nn.Module):
    """A quantized module's float computation, for the capture."""

    def __init__(self, tensors: QuantizedTensors, original: torch.nn.Module):
        super().__init__()
        self._tensors = tensors
        self._original_type = type(original).__name__

    def _output(self, value: torch.Tensor, scale: float, zero_point: int, dtype: torch.dtype) -> torch.Tensor:
        qparams = QParams(float(scale), int(zero_point), dtype)
        return self._tensors.mark(qparams.quantize_dequantize(value), qparams)

    def _register_weight(self, weight: torch.Tensor) -> None:
        """The int8 weight as a buffer, dequantized by a node of the graph (QDQ on an int8
        initializer, which onnxruntime fuses into QLinear operators)."""
        integers, self._weight_qparams = _weight_qparams(weight)
        self.register_buffer("weight", integers)
        if self._weight_qparams.axis is not None:
            self.register_buffer("weight_scale", self._weight_qparams.scale)
            self.register_buffer("weight_zero_point", self._weight_qparams.zero_point)

    def _weight(self) -> torch.Tensor:
        qparams = self._weight_qparams
        if qparams.axis is not None:
            qparams = dataclasses.replace(qparams, scale=self.weight_scale, zero_point=self.weight_zero_point)
        return qparams.dequantize(self.weight)

    def extra_repr(self) -> str:
        return f"float twin of {self._original_type}"


class _Quantize(_Twin):
    def __init__(self, tensors, original: nnq.Quantize):
        super().__init__(tensors, original)
        self.qparams = QParams(float(original.scale), int(original.zero_point), original.dtype)

    def forward(self, x):
        with self._tensors.inside_twin():
            return self._tensors.mark(self.qparams.quantize_dequantize(x), self.qparams)


class _DeQuantize(_Twin):
    def forward(self, x):
        if self._tensors.qparams(x) is None:
            return x
        with self._tensors.inside_twin():
            return torch.ops.aten.alias(x)  # the same floats, no longer standing for a quantized tensor


_ACTIVATIONS: dict[type, Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]] = {
    nniq.LinearReLU: lambda module, y: F.relu(y),
    nniq.LinearLeakyReLU: lambda module, y: F.leaky_relu(y, module.negative_slope),
    nniq.LinearTanh: lambda module, y: torch.tanh(y),
    nniq.ConvReLU1d: lambda module, y: F.relu(y),
    nniq.ConvReLU2d: lambda module, y: F.relu(y),
    nniq.ConvReLU3d: lambda module, y: F.relu(y),
    nniq.ConvAddReLU2d: lambda module, y: F.relu(y),
}


def _activation(original: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    activation = _ACTIVATIONS.get(type(original))
    if activation is None:
        return lambda y: y
    return lambda y: activation(original, y)


class _Linear(_Twin):
    def __init__(self, tensors, original: nnq.Linear):
        super().__init__(tensors, original)
        weight, bias = original._weight_bias()
        self._register_weight(weight)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)
        self.scale, self.zero_point = original.scale, original.zero_point
        self.activation = _activation(original)

    def forward(self, x):
        qparams = self._tensors.quantized_input(x, self)
        with self._tensors.inside_twin():
            y = self.activation(F.linear(x, self._weight(), self.bias))
            return self._output(y, self.scale, self.zero_point, qparams.dtype)


class _Conv(_Twin):
    def __init__(self, tensors, original):
        super().__init__(tensors, original)
        self._register_weight(original.weight())
        bias = original.bias()
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)
        self.stride, self.dilation, self.groups = original.stride, original.dilation, original.groups
        self.transposed, self.output_padding = original.transposed, original.output_padding
        self.padding_mode, self.padding = original.padding_mode, original.padding
        self.scale, self.zero_point = original.scale, original.zero_point
        self.activation = _activation(original)
        self.dims = len(self.stride)

    def forward(self, x, extra_input=None):
        qparams = self._tensors.quantized_input(x, self)
        with self._tensors.inside_twin():
            padding = self.padding
            if self.padding_mode != "zeros":
                x = F.pad(x, [p for p in reversed(self.padding) for _ in range(2)], mode=self.padding_mode)
                padding = 0
            if self.transposed:
                convolution = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[self.dims - 1]
                y = convolution(
                    x, self._weight(), self.bias, self.stride, padding, self.output_padding, self.groups, self.dilation
                )
            else:
                convolution = (F.conv1d, F.conv2d, F.conv3d)[self.dims - 1]
                y = convolution(x, self._weight(), self.bias, self.stride, padding, self.dilation, self.groups)
            if extra_input is not None:
                y = y + extra_input
            return self._output(self.activation(y), self.scale, self.zero_point, qparams.dtype)


class _Elementwise(_Twin):
    """Quantized activations and normalizations: the float module's function of the input,
    quantized with the module's output parameters (ReLU6: the input's). The quantized module
    stays a submodule: its float parameters (a norm's weight and statistics) are the twin's."""

    def __init__(self, tensors, original):
        super().__init__(tensors, original)
        self.module = original
        self.function = _ELEMENTWISE[type(original)]
        scale = getattr(original, "scale", getattr(original, "output_scale", None))
        zero_point = getattr(original, "zero_point", getattr(original, "output_zero_point", None))
        self.output = None if scale is None else (float(scale), int(zero_point))

    def forward(self, x):
        qparams = self._tensors.quantized_input(x, self)
        with self._tensors.inside_twin():
            y = self.function(self.module, x)
            if self.output is None:
                return self._tensors.mark(qparams.quantize_dequantize(y), qparams)
            return self._output(y, *self.output, qparams.dtype)


def _batch_norm(module, x):
    return F.batch_norm(x, module.running_mean, module.running_var, module.weight, module.bias, False, 0.0, module.eps)


_ELEMENTWISE: dict[type, Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]] = {
    nnq.ReLU6: lambda module, x: F.relu6(x),
    nnq.Hardswish: lambda module, x: F.hardswish(x),
    nnq.ELU: lambda module, x: F.elu(x, module.alpha),
    nnq.LeakyReLU: lambda module, x: F.leaky_relu(x, module.negative_slope),
    nnq.Sigmoid: lambda module, x: torch.sigmoid(x),
    nnq.Softmax: lambda module, x: torch.softmax(x, module.dim),
    nnq.BatchNorm2d: _batch_norm,
    nnq.BatchNorm3d: _batch_norm,
    nniq.BNReLU2d: lambda module, x: F.relu(_batch_norm(module, x)),
    nniq.BNReLU3d: lambda module, x: F.relu(_batch_norm(module, x)),
    nnq.LayerNorm: lambda module, x: F.layer_norm(x, module.normalized_shape, module.weight, module.bias, module.eps),
    nnq.GroupNorm: lambda module, x: F.group_norm(x, module.num_groups, module.weight, module.bias, module.eps),
    **{
        norm: lambda module, x: F.instance_norm(x, weight=module.weight, bias=module.bias, eps=module.eps)
        for norm in (nnq.InstanceNorm1d, nnq.InstanceNorm2d, nnq.InstanceNorm3d)
    },
}


class _Dropout(_Twin):
    def forward(self, x):
        return x


def _embedding_table(original: nnq.Embedding | nnq.EmbeddingBag) -> torch.Tensor:
    """The float rows PyTorch's kernel reads from the packed table (a row-wise scale and a float
    zero point, which DequantizeLinear cannot express): the kernel asked for every row."""
    if original.dtype != torch.quint8:
        raise QuantizedCaptureError(f"{type(original).__name__} of {original.dtype} has no float form in dynexport")
    packed, rows = original._packed_params._packed_weight, torch.arange(original.num_embeddings)
    if isinstance(original, nnq.Embedding):
        return torch.ops.quantized.embedding_byte(packed, rows)
    return torch.ops.quantized.embedding_bag_byte(packed, rows, rows, False, 0, False, None, None, False)


class _DynamicLinear(_Twin):
    """``quantize_dynamic``'s Linear: at each call the input is quantized to uint8 with parameters
    chosen from its own range, as fbgemm chooses them (0..127 with ``reduce_range``), then the
    float linear with the dequantized int8 weight (float16 weights: the float16 values)."""

    def __init__(self, tensors, original: nnqd.Linear):
        super().__init__(tensors, original)
        if torch.backends.quantized.engine not in ("x86", "fbgemm"):
            raise QuantizedCaptureError(
                f"dynamic quantized Linear under the {torch.backends.quantized.engine} engine: dynexport "
                "chooses the input's parameters as the x86/fbgemm engine does"
            )
        weight, bias = original._weight_bias()
        self.float16 = original._packed_params.dtype == torch.float16
        if self.float16:
            self.register_buffer("weight", weight)
        else:
            self._register_weight(weight)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)
        self.quant_max = 127 if original.version is not None and original.version >= 4 else 255

    def forward(self, x):
        with self._tensors.inside_twin():
            if self.float16:
                return F.linear(x, self.weight.float(), self.bias).to(x.dtype)
            qparams = QParams(*_dynamic_qparams(x, self.quant_max), torch.quint8)
            return F.linear(qparams.quantize_dequantize(x), self._weight(), self.bias).to(x.dtype)


def _dynamic_qparams(x: torch.Tensor, quant_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fbgemm's ChooseQuantizationParams for [0, quant_max] (PyTorch's quant_utils): the range
    widened to hold 0; the zero point from whichever end loses less, rounded and clamped."""
    low = torch.clamp(x.min(), max=0.0).double()
    high = torch.clamp(x.max(), min=0.0).double()
    scale = (high - low) / quant_max
    degenerate = (scale.float() == 0) | torch.isinf(1.0 / scale.float())
    scale = torch.where(degenerate, torch.full_like(scale, 0.1), scale)
    from_min, from_max = -low / scale, quant_max - high / scale
    from_min_error, from_max_error = -torch.abs(low / scale), quant_max - torch.abs(high / scale)
    zero_point = torch.where(from_min_error < from_max_error, from_min, from_max)
    return scale.float(), torch.clamp(torch.round(zero_point), 0, quant_max).long()


class _Embedding(_Twin):
    """Quantized embeddings return floats: the lookup of the table PyTorch's kernel reads."""

    def __init__(self, tensors, original: nnq.Embedding | nnq.EmbeddingBag):
        super().__init__(tensors, original)
        if getattr(original, "pruned_weights", False):
            raise QuantizedCaptureError(f"{type(original).__name__} with pruned weights has no float form in dynexport")
        self.register_buffer("weight", _embedding_table(original))
        self.include_last_offset = getattr(original, "include_last_offset", False)
        self.bag = isinstance(original, nnq.EmbeddingBag)

    def forward(self, indices, offsets=None, per_sample_weights=None, compressed_indices_mapping=None):
        if not self.bag:
            return F.embedding(indices, self.weight)
        if compressed_indices_mapping is not None:
            raise QuantizedCaptureError("EmbeddingBag's compressed_indices_mapping (pruned weights) has no float form")
        return F.embedding_bag(
            indices,
            self.weight,
            offsets,
            mode="sum",
            per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset,
        )


class _Functional(_Twin):
    """``QFunctional``: float arithmetic on the dequantized operands, quantized with the module's
    output parameters (``add_scalar``/``mul_scalar``: with those PyTorch's kernel derives from
    the input's)."""

    def __init__(self, tensors, original: nnq.QFunctional):
        super().__init__(tensors, original)
        self.scale, self.zero_point = original.scale, original.zero_point

    def _result(self, value: torch.Tensor, operand: torch.Tensor) -> torch.Tensor:
        qparams = self._tensors.quantized_input(operand, self)
        return self._output(value, self.scale, self.zero_point, qparams.dtype)

    def forward(self, x):
        raise RuntimeError("QFunctional is not meant to be called directly: use its methods (add, mul, cat, ...)")

    def add(self, x, y):
        with self._tensors.inside_twin():
            return self._result(x + y, x)

    def add_relu(self, x, y):
        with self._tensors.inside_twin():
            return self._result(F.relu(x + y), x)

    def mul(self, x, y):
        with self._tensors.inside_twin():
            return self._result(x * y, x)

    def matmul(self, x, y):
        with self._tensors.inside_twin():
            return self._result(torch.matmul(x, y), x)

    def cat(self, x, dim=0):
        with self._tensors.inside_twin():
            return self._result(torch.cat(x, dim=dim), x[0])

    def add_scalar(self, x, y):
        return self._scalar_op(torch.ops.quantized.add_scalar, x, y, torch.add)

    def mul_scalar(self, x, y):
        return self._scalar_op(torch.ops.quantized.mul_scalar, x, y, torch.mul)

    def _scalar_op(self, kernel, x, y, float_op):
        qparams = self._tensors.quantized_input(x, self)
        if isinstance(qparams.scale, torch.Tensor):
            raise QuantizedCaptureError(f"QFunctional.{kernel.__name__} needs its input's scale as a number")
        # The kernel's output parameters depend only on the input's and on the scalar: ask it,
        # in eager PyTorch, outside the capture's modes.
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            probe = kernel(
                torch.quantize_per_tensor(torch.zeros(1), qparams.scale, qparams.zero_point, qparams.dtype), y
            )
            scale, zero_point = probe.q_scale(), probe.q_zero_point()
        with self._tensors.inside_twin():
            return self._output(float_op(x, y), scale, zero_point, qparams.dtype)


_TWINS: dict[type, Callable[[QuantizedTensors, torch.nn.Module], _Twin]] = {
    nnq.Quantize: _Quantize,
    nnq.DeQuantize: _DeQuantize,
    nnq.Linear: _Linear,
    nniq.LinearReLU: _Linear,
    nniq.LinearLeakyReLU: _Linear,
    nniq.LinearTanh: _Linear,
    **{
        conv: _Conv
        for conv in (
            nnq.Conv1d,
            nnq.Conv2d,
            nnq.Conv3d,
            nnq.ConvTranspose1d,
            nnq.ConvTranspose2d,
            nnq.ConvTranspose3d,
            nniq.ConvReLU1d,
            nniq.ConvReLU2d,
            nniq.ConvReLU3d,
            nniq.ConvAdd2d,
            nniq.ConvAddReLU2d,
        )
    },
    nnq.Dropout: _Dropout,
    nnq.Embedding: _Embedding,
    nnqd.Linear: _DynamicLinear,
    nnq.EmbeddingBag: _Embedding,
    nnq.QFunctional: _Functional,
    **dict.fromkeys(_ELEMENTWISE, _Elementwise),
}


# -- quantization-aware training -----------------------------------------------------------------


class _FrozenFakeQuantize(torch.nn.Module):
    """A FakeQuantize module with its current scale and zero point as constants."""

    def __init__(self, original: FakeQuantizeBase):
        super().__init__()
        self.enabled = bool(original.fake_quant_enabled[0] == 1)
        self.quant_min, self.quant_max = _fake_quantize_range(original)
        self.axis = original.ch_axis if original.is_per_channel else None
        scale, zero_point = original.scale.detach(), original.zero_point.detach()
        if self.axis is None:
            self.scale, self.zero_point = float(scale), int(zero_point)
        else:
            self.register_buffer("scale", scale.float().clone())
            self.register_buffer("zero_point", zero_point.int().clone())

    def forward(self, x):
        if not self.enabled:
            return x
        if self.axis is None:
            return torch.fake_quantize_per_tensor_affine(x, self.scale, self.zero_point, self.quant_min, self.quant_max)
        return torch.fake_quantize_per_channel_affine(
            x, self.scale, self.zero_point, self.axis, self.quant_min, self.quant_max
        )

    def extra_repr(self) -> str:
        return f"frozen fake quantization, range [{self.quant_min}, {self.quant_max}], axis {self.axis}"


def _fake_quantize_range(module: FakeQuantizeBase) -> tuple[int, int]:
    quant_min = getattr(module, "quant_min", None)
    quant_max = getattr(module, "quant_max", None)
    if quant_min is None or quant_max is None:
        observer = module.activation_post_process
        quant_min, quant_max = observer.quant_min, observer.quant_max
    return int(quant_min), int(quant_max)


def _frozen_fake_quantize(module: FakeQuantizeBase) -> torch.nn.Module:
    if not hasattr(module, "scale") or not hasattr(module, "is_per_channel"):
        raise QuantizedCaptureError(
            f"{type(module).__name__}: dynexport exports FakeQuantize modules that hold their scale and "
            "zero point (FakeQuantize, FusedMovingAvgObsFakeQuantize, FixedQParamsFakeQuantize)"
        )
    if module.zero_point.dtype.is_floating_point:
        raise QuantizedCaptureError(
            f"{type(module).__name__} has a fractional zero point, which QuantizeLinear cannot express"
        )
    return _named_like(_FrozenFakeQuantize, type(module))(module)


# -- the scope -----------------------------------------------------------------------------------


_QUANTIZED_NAMES = frozenset({"quantize_per_tensor", "quantize_per_channel", "dequantize"})


def uses_quantization(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds quantized or FakeQuantize modules, or a forward of its modules
    (or a function it calls by a closure, as a function given to ``export`` is called) makes
    quantized tensors (``torch.quantize_per_tensor``, as FX's converted graphs do)."""
    for submodule in module.modules():
        if isinstance(submodule, FakeQuantizeBase) or type(submodule) in _TWINS or _quantized_attributes(submodule):
            return True
        forward = type(submodule).forward
        functions = [forward, *_closure_functions(forward)]
        if any(
            _QUANTIZED_NAMES & set(function.__code__.co_names) for function in functions if inspect.isfunction(function)
        ):
            return True
    return False


def _closure_functions(function: Any) -> list[Any]:
    contents = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            contents.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    return [value for value in contents if inspect.isfunction(value)]


def quantized_modules_as_float(module: torch.nn.Module) -> contextlib.AbstractContextManager:
    """A scope within which ``module``'s quantized and FakeQuantize submodules are float twins
    and quantized tensors are their float values (the module docstring says how); everything is
    put back when it ends. The twins are planned at the call.

    Raises:
        QuantizedCaptureError: a quantized module with no float twin.
    """
    if not uses_quantization(module):
        return contextlib.nullcontext()
    tensors = QuantizedTensors()
    _refuse_quantized_attributes(module)
    return _swapped(_planned_swaps(module, tensors), tensors)


@contextlib.contextmanager
def _swapped(swaps: list[tuple[torch.nn.Module, str, Any, Any]], tensors: QuantizedTensors) -> Iterator[None]:
    try:
        for parent, name, _, twin in swaps:
            setattr(parent, name, twin)
        with tensors:
            yield
    finally:
        for parent, name, original, _ in reversed(swaps):
            setattr(parent, name, original)


def _planned_swaps(module: torch.nn.Module, tensors: QuantizedTensors) -> list[tuple[torch.nn.Module, str, Any, Any]]:
    """(parent, name, module, twin) for each module to swap, found from ``module`` down (not
    into the modules swapped); a module reached by two paths gets one twin."""
    twins: dict[int, torch.nn.Module] = {}
    swaps = []
    pending = [module]
    while pending:
        parent = pending.pop()
        for name, child in parent.named_children():
            if id(child) not in twins:
                twin = _twin(child, tensors)
                if twin is None:
                    pending.append(child)
                    continue
                twins[id(child)] = twin
            swaps.append((parent, name, child, twins[id(child)]))
    observing = [child for _, _, child, _ in swaps if _observes(child)]
    if observing:
        warnings.warn(
            f"{len(observing)} FakeQuantize module(s) still observe (observer_enabled): PyTorch updates "
            "their scale and zero point at every call, the export uses their current values as "
            "constants, as torch.ao.quantization.convert would. Call "
            "model.apply(torch.ao.quantization.disable_observer) to make PyTorch compute the same",
            stacklevel=_user_stacklevel(),
        )
    return swaps


def _observes(module: torch.nn.Module) -> bool:
    """A FakeQuantize whose observer can still change its scale and zero point."""
    return (
        isinstance(module, FakeQuantizeBase)
        and not isinstance(module, FixedQParamsFakeQuantize)
        and module.observer_enabled[0] == 1
    )


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside dynexport, torch and
    contextlib (whose frames run the context managers capture stacks)."""
    own = (os.path.dirname(__file__) + os.sep, os.path.dirname(torch.__file__) + os.sep, contextlib.__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1
    return level


def _twin(child: torch.nn.Module, tensors: QuantizedTensors) -> torch.nn.Module | None:
    if isinstance(child, FakeQuantizeBase):
        return _frozen_fake_quantize(child)
    make = _TWINS.get(type(child))
    if make is not None:
        return _named_like(make, type(child))(tensors, child)
    if type(child).__module__.startswith("torch.ao.nn."):
        # Named whole: its packed weights sit in a child.
        if any(_quantized_attributes(holder) for holder in child.modules()):
            raise QuantizedCaptureError(
                f"{type(child).__name__} ({type(child).__module__}) has no float form in dynexport yet: "
                "leave it in float (qconfig None) or dequantize around it"
            )
        return None
    _refuse_quantized_attributes(child)
    return None


def _refuse_quantized_attributes(module: torch.nn.Module) -> None:
    held = _quantized_attributes(module)
    if held:
        raise QuantizedCaptureError(
            f"{type(module).__name__} holds quantized tensors or packed weights ({', '.join(held)}), which "
            "torch.export cannot trace: hold the int8 values and their scale as plain tensors, or use "
            "torch.ao.nn.quantized modules"
        )


@functools.cache
def _named_like(twin: type, original: type) -> type:
    """``twin`` under ``original``'s name: modules exported as ONNX functions keep the names
    of the model's modules."""
    return type(original.__name__, (twin,), {"__module__": __name__})


def _quantized_attributes(module: torch.nn.Module) -> list[str]:
    """The attributes of ``module`` that are packed weights or quantized tensors, which
    torch.export cannot trace (float modules of the quantized packages, such as reference
    modules and ``nnq.MaxPool2d``, hold none)."""
    return [
        name
        for name, value in vars(module).items()
        if isinstance(value, torch.ScriptObject) or (isinstance(value, torch.Tensor) and value.is_quantized)
    ]
