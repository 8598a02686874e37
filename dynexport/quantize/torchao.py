"""Models quantized with torchao's weight-only configs, exported with their own integers.

``torchao.quantization.quantize_(model, Int8WeightOnlyConfig())`` or
``IntxWeightOnlyConfig(weight_dtype=torch.int4 | torch.int8, granularity=PerGroup(g) |
PerAxis(0))`` replaces each linear (or embedding) weight by a tensor subclass holding int8 codes
``qdata [N, K]``, ``scale [N, blocks]`` and ``zero_point [N, blocks]``; eagerly the layer
computes with ``(qdata - zero_point) * scale``. While dynexport captures such a model, each of
those weights stands as the float tensor it dequantizes to (torchao's own ``dequantize()``, the
values the eager layer computes with), and :class:`KnownWeights` remembers the integers behind
it; after the optimizer, :func:`dynexport.quantize.quantize_model` stores every weight product
or lookup of such a float weight in the quantized forms of docs/llm.md (``MatMulNBits``,
``GatherBlockQuantized``, ``DequantizeLinear``) from those integers: nothing is quantized again.
The model's parameters are put back when the export ends.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Iterator

import onnx_ir as ir
import torch

from dynexport.errors import ExportError
from dynexport.quantize.graph import quantize_model
from dynexport.quantize.weights import KnownWeights, QuantizedWeight, WeightQuantization

__all__ = ["TorchaoWeightError", "store_torchao_weights", "torchao_weights"]

# torchao's target dtypes with the forms docs/llm.md describes.
_BITS = {torch.int4: 4, torch.int8: 8}
# Int4WeightOnlyConfig's tensors hold their codes packed for one kernel (tinygemm, mslk), in
# layouts that depend on the device that packed them.
_INT4_HINT = (
    "; for int4 weights quantize with IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)), "
    "whose codes are not packed for a kernel"
)


class TorchaoWeightError(ExportError):
    """A torchao-quantized weight that has no ONNX form here (its kind, its bit width, or
    quantized activations)."""


def torchao_weights(model) -> contextlib.AbstractContextManager[KnownWeights | None]:
    """While active, each torchao-quantized parameter of ``model`` is replaced by the float
    tensor it dequantizes to; yields the :class:`KnownWeights` behind them (None when the model
    has none, or torchao is not imported)."""
    if "torchao" not in sys.modules or not isinstance(model, torch.nn.Module):
        return contextlib.nullcontext()
    return _standing_in_float(model)


def store_torchao_weights(
    model: ir.Model, known: KnownWeights, config: WeightQuantization | None, target: str | None
) -> None:
    """Store the torchao weights of an exported ``model`` from their integers, in the form of
    ``config``'s target and accuracy level (without ``config``: the export's ``target``, None
    giving the portable form); warn about those left float (no weight product or lookup reads
    their exact values any more)."""
    if config is None:
        config = WeightQuantization(target="onnxruntime" if target == "onnxruntime" else "portable")
    quantize_model(model, config, known)
    if known.missing():
        warnings.warn(
            f"the torchao weights {known.missing()} are not stored quantized: no MatMul, Gemm or Gather of the "
            "optimized graph reads them as a constant 2-D weight (one the optimizer changed stays float)",
            stacklevel=3,
        )


@contextlib.contextmanager
def _standing_in_float(model: torch.nn.Module) -> Iterator[KnownWeights | None]:
    from torchao.utils import TorchAOBaseTensor

    replaced: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    known = KnownWeights("torchao")
    stand_ins: dict[int, torch.nn.Parameter] = {}  # a weight tied to several modules, once
    try:
        for module_name, module in model.named_modules(remove_duplicate=False):
            for name, parameter in list(module._parameters.items()):
                if not isinstance(parameter, TorchAOBaseTensor):
                    continue
                path = f"{module_name}.{name}" if module_name else name
                if id(parameter) not in stand_ins:
                    bits = _bits(parameter, path)
                    with torch.no_grad():
                        values = parameter.dequantize()
                    stand_ins[id(parameter)] = torch.nn.Parameter(values, requires_grad=False)
                    known.add(values, functools.partial(_quantized_weight, parameter, bits), path)
                replaced.append((module, name, parameter))
                module._parameters[name] = stand_ins[id(parameter)]
        yield known if replaced else None
    finally:
        for module, name, parameter in reversed(replaced):
            module._parameters[name] = parameter


def _bits(weight, path: str) -> int:
    """The width of a torchao weight's codes; refuses what has no ONNX form here."""
    kind = type(weight).__name__
    if kind == "Int8Tensor":
        bits, activations = 8, getattr(weight, "act_quant_kwargs", None)
    elif kind == "IntxUnpackedToInt8Tensor":
        if weight.target_dtype not in _BITS:
            raise TorchaoWeightError(
                f"the torchao weight {path} holds {weight.target_dtype} codes; dynexport stores int4 and int8 "
                "weights (MatMulNBits, DequantizeLinear). Quantize it with weight_dtype=torch.int4 or torch.int8"
            )
        bits, activations = _BITS[weight.target_dtype], weight.activation_quantization
    else:
        raise TorchaoWeightError(
            f"the torchao weight {path} is a {kind}, which dynexport does not export; it exports the weight-only "
            "Int8WeightOnlyConfig and IntxWeightOnlyConfig(weight_dtype=torch.int4 or torch.int8) tensors "
            "(Int8Tensor, IntxUnpackedToInt8Tensor)" + (_INT4_HINT if kind.startswith("Int4") else "")
        )
    if activations is not None:
        raise TorchaoWeightError(
            f"the torchao weight {path} also quantizes the activations ({kind} with {activations!r}); dynexport "
            "exports weight-only torchao configs (Int8WeightOnlyConfig, IntxWeightOnlyConfig)"
        )
    qdata, scale, zero_point, block = weight.qdata, weight.scale, weight.zero_point, list(weight.block_size)
    if qdata.dim() != 2 or block[0] != 1 or tuple(scale.shape) != (qdata.shape[0], -(-qdata.shape[1] // block[1])):
        raise TorchaoWeightError(
            f"the torchao weight {path} ({kind}, shape {tuple(qdata.shape)}, block {block}) is not blocked along "
            "its last dimension with one scale per block; dynexport exports 2-D weights quantized per group "
            "(PerGroup) or per output feature (PerAxis(0))"
        )
    if zero_point is not None and zero_point.any():
        fractional = zero_point.is_floating_point() and not torch.equal(zero_point, zero_point.round())
        shifted = zero_point.to(torch.int32) + 2 ** (bits - 1)
        if fractional or shifted.min() < 0 or shifted.max() >= 2**bits:
            raise TorchaoWeightError(
                f"the torchao weight {path} has zero points outside the {bits}-bit integers; dynexport stores "
                "integer zero points of the weight's own width"
            )
    return bits


def _quantized_weight(weight, bits: int) -> QuantizedWeight:
    """A torchao weight's int8 codes ``[N, K]``, scales and zero points ``[N, blocks]``; codes
    and zero points shifted into the unsigned range when there are zero points:
    ``(q + 2^(b-1)) - (z + 2^(b-1)) = q - z``."""
    values, zero_point = weight.qdata.to(torch.int32), weight.zero_point
    scales = weight.scale.to(torch.float32).contiguous()
    if zero_point is None or not zero_point.any():
        return QuantizedWeight(values, scales, None, bits, weight.block_size[1])
    offset = 2 ** (bits - 1)
    return QuantizedWeight(values + offset, scales, zero_point.to(torch.int32) + offset, bits, weight.block_size[1])
