"""What a weight quantization is asked to do (:class:`WeightQuantization`), and the algorithms
that turn a float weight into integers and per-block scales (:class:`QuantizedWeight`).

Algorithms are looked up by name in a small registry: ``"rtn"`` (round to nearest) is built in;
:func:`register_weight_quantizer` adds others (GPTQ, HQQ, ...) without touching the graph
rewrite, which only reads the :class:`QuantizedWeight` an algorithm returns.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch

__all__ = [
    "KnownWeights",
    "QuantizedWeight",
    "WeightQuantization",
    "WeightQuantizer",
    "register_weight_quantizer",
    "round_to_nearest",
    "weight_quantizer",
]

BITS = (4, 8)
BLOCK_SIZES = (16, 32, 64, 128, 256)
TARGETS = ("onnxruntime", "portable")
# MatMulNBits' accuracy_level: the lowest precision A may be computed in (1 fp32, 2 fp16,
# 3 bf16, 4 int8); 0 leaves it to onnxruntime (A's own float type).
ACCURACY_LEVELS = (0, 1, 2, 3, 4)


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A weight ``[N, K]`` (N output features, K input features) as integers and per-block
    scales along K: ``weight[n, k] ≈ (values[n, k] - zero_points[n, k // block_size]) *
    scales[n, k // block_size]``.

    Attributes:
        values: integers ``[N, K]`` of any integer type that holds them (:func:`round_to_nearest`
            gives int8, uint8 with zero points); in ``[-2^(bits-1), 2^(bits-1) - 1]`` when
            ``zero_points`` is None (symmetric), else in ``[0, 2^bits - 1]``.
        scales: float32 ``[N, ceil(K / block_size)]``.
        zero_points: int32 like ``scales`` (asymmetric), or None.
        bits, block_size: as quantized; a block of ``K`` means one scale per output feature.
    """

    values: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    bits: int
    block_size: int

    @property
    def symmetric(self) -> bool:
        return self.zero_points is None

    def dequantize(self) -> torch.Tensor:
        """The float32 weight ``[N, K]`` these integers stand for."""
        k = self.values.shape[1]
        expand = lambda per_block: per_block.repeat_interleave(self.block_size, dim=1)[:, :k]
        values = self.values.to(torch.int32)
        shifted = values if self.zero_points is None else values - expand(self.zero_points)
        return shifted.to(torch.float32) * expand(self.scales)


class KnownWeights:
    """Weights quantized before the export (a torchao model), found again in the exported graph
    by the exact float values they stood as during the capture: the graph rewrite stores those
    weights from their own integers instead of quantizing them."""

    def __init__(self, source: str):
        self.source = source  # who quantized them ("torchao"), recorded in the model's metadata
        self._weights: dict[tuple, tuple[Callable[[], QuantizedWeight], str]] = {}
        self._found: set[str] = set()

    def add(self, values: torch.Tensor, quantized: Callable[[], QuantizedWeight], name: str) -> None:
        """``values``: the float ``[N, K]`` weight that stands in the model for the weight
        ``quantized()`` gives (made when it is stored: its int32 codes take 4 bytes a weight)."""
        self._weights[_fingerprint(values)] = (quantized, name)

    def find(self, matrix: torch.Tensor) -> QuantizedWeight | None:
        """The quantized weight whose stand-in is ``matrix`` (``[N, K]``, any float type), or
        None; a ``matrix`` whose rows are several stand-ins one after the other (products
        packed by the optimizer, passes/onnx/pack_matmuls.py) gives their weights stacked, when
        they are quantized alike."""
        entry = self._weights.get(_fingerprint(matrix))
        entries = [entry] if entry is not None else self._stacked(matrix)
        if not entries:
            return None
        parts = [quantized() for quantized, _ in entries]
        first = parts[0]
        if any((q.bits, q.block_size, q.symmetric) != (first.bits, first.block_size, first.symmetric) for q in parts):
            return None
        self._found.update(name for _, name in entries)
        if len(parts) == 1:
            return first
        zero_points = None if first.symmetric else torch.cat([q.zero_points for q in parts])
        return QuantizedWeight(torch.cat([q.values for q in parts]), torch.cat([q.scales for q in parts]), zero_points,
                               first.bits, first.block_size)

    def _stacked(self, matrix: torch.Tensor) -> list[tuple[Callable[[], QuantizedWeight], str]]:
        """The stand-ins whose rows, one after the other, are ``matrix``'s (each found by its
        exact values, so no two readings are possible in practice); [] when there are none."""
        rows, columns = matrix.shape
        heights = sorted({shape[0] for shape, _ in self._weights if shape[1] == columns and shape[0] < rows})
        entries, start = [], 0
        while start < rows:
            for height in heights:
                if start + height <= rows and (entry := self._weights.get(_fingerprint(matrix[start : start + height]))):
                    break
            else:
                return []
            entries.append(entry)
            start += height
        return entries

    def missing(self) -> list[str]:
        """The names of the weights :meth:`find` has not found."""
        return sorted(name for _, name in self._weights.values() if name not in self._found)


def _fingerprint(matrix: torch.Tensor) -> tuple:
    values = matrix.detach().to(torch.float32).contiguous()
    return tuple(values.shape), hashlib.sha1(values.numpy()).hexdigest()


class WeightQuantizer(Protocol):
    """An algorithm: a float weight ``[N, K]`` to a :class:`QuantizedWeight` blocked along K.
    The weight is valid during the call only (a packed q|k|v is read from a buffer the next
    packed weight reuses): keep results, not the weight."""

    def __call__(self, weight: torch.Tensor, *, bits: int, block_size: int, symmetric: bool) -> QuantizedWeight: ...


_QUANTIZERS: dict[str, WeightQuantizer] = {}


def register_weight_quantizer(name: str) -> Callable[[WeightQuantizer], WeightQuantizer]:
    """Register an algorithm under ``name`` (the ``algorithm=`` of :class:`WeightQuantization`)."""

    def register(quantizer: WeightQuantizer) -> WeightQuantizer:
        if name in _QUANTIZERS:
            raise ValueError(f"a weight quantizer named {name!r} is already registered")
        _QUANTIZERS[name] = quantizer
        return quantizer

    return register


def weight_quantizer(name: str) -> WeightQuantizer:
    """The algorithm registered under ``name``."""
    if name not in _QUANTIZERS:
        raise ValueError(
            f"algorithm={name!r} is not a registered weight quantizer; choose one of {sorted(_QUANTIZERS)}"
        )
    return _QUANTIZERS[name]


# Weights rounded per chunk of rows: the float temporaries (about 1 MB) stay in the CPU's cache
# and the float copy of a large table (an embedding) is never made whole.
_ROUNDED_PER_CHUNK = 1 << 18


@register_weight_quantizer("rtn")
def round_to_nearest(weight: torch.Tensor, *, bits: int, block_size: int, symmetric: bool) -> QuantizedWeight:
    """Round to nearest. Symmetric: ``scale = max|w| / (2^(bits-1) - 1)`` per block, values
    signed (int8). Asymmetric: the block's range (widened to hold 0) over ``2^bits - 1`` levels,
    with the integer zero point that represents 0.0 exactly, values unsigned (uint8). A block of
    zeros has the scale +0.0."""
    n, k = weight.shape
    blocks = -(-k // block_size)
    matrix = weight.detach().to(torch.float32).numpy()
    values = np.empty((n, k), np.int8 if symmetric else np.uint8)
    scales = np.empty((n, blocks), np.float32)
    zero_points = None if symmetric else np.empty((n, blocks), np.int32)
    rows = max(1, _ROUNDED_PER_CHUNK // (blocks * block_size))
    for start in range(0, n, rows):
        chunk = slice(start, min(start + rows, n))
        grouped = _grouped(matrix[chunk], blocks, block_size)
        values[chunk], scales[chunk], chunk_zero_points = _rounded(grouped, bits, symmetric, k)
        if zero_points is not None:
            zero_points[chunk] = chunk_zero_points
    return QuantizedWeight(
        torch.from_numpy(values), torch.from_numpy(scales),
        None if zero_points is None else torch.from_numpy(zero_points), bits, block_size,
    )


def _grouped(rows: np.ndarray, blocks: int, block_size: int) -> np.ndarray:
    """Float32 ``[rows, blocks, block_size]``; K padded with zeros to whole blocks."""
    if rows.shape[1] == blocks * block_size:
        return rows.reshape(len(rows), blocks, block_size)
    padded = np.zeros((len(rows), blocks * block_size), np.float32)
    padded[:, : rows.shape[1]] = rows
    return padded.reshape(len(rows), blocks, block_size)


def _rounded(grouped: np.ndarray, bits: int, symmetric: bool, k: int):
    """The codes ``[rows, k]`` (float, whole numbers), scales and zero points (float, or None)
    of a chunk of blocks ``[rows, blocks, block_size]``. Every step is one float32 operation,
    rounded as torch and numpy both round them, so the result does not depend on the chunking."""
    # torch reduces along the short last axis several times faster than numpy.
    low, high = (reduce(torch.from_numpy(grouped), dim=2).numpy() for reduce in (torch.amin, torch.amax))
    if symmetric:
        largest = 2 ** (bits - 1) - 1
        smallest = -largest - 1
        # abs: +0.0 for a block of zeros, whichever zero max() returns.
        scales = np.abs(np.maximum(high, -low)) / np.float32(largest)
    else:
        largest, smallest = 2**bits - 1, 0
        low, high = np.minimum(low, np.float32(0)), np.maximum(high, np.float32(0))
        scales = np.abs(high - low) / np.float32(largest)
    divisor = np.where(scales == 0, np.float32(1), scales)
    codes = grouped / divisor[..., None]
    np.rint(codes, out=codes)  # to nearest, ties to even, as torch.round
    zero_points = None
    if not symmetric:
        zero_points = np.clip(np.rint(-low / divisor), 0, largest)
        codes += zero_points[..., None]
    np.clip(codes, smallest, largest, out=codes)
    return codes.reshape(len(codes), -1)[:, :k], scales, zero_points


@dataclasses.dataclass(frozen=True)
class WeightQuantization:
    """Which weights to store as integers, in which form.

    Args:
        bits: 4 or 8.
        block_size: weights per scale along the input features: 16, 32, 64, 128 or 256.
        target: ``"onnxruntime"`` (com.microsoft ``MatMulNBits``, ``GatherBlockQuantized``) or
            ``"portable"`` (standard ``DequantizeLinear``: blocked int4/int8 from opset 21, one
            int8 scale per output feature below it; int4 needs opset 21).
        accuracy_level: the onnxruntime target's ``MatMulNBits`` attribute: the lowest precision
            the activations may be computed in (0 unset: A's float type, 1 fp32, 2 fp16,
            3 bf16, 4 int8: fastest on CPU, activations quantized per block at run time).
        symmetric: signed integers and no zero points; False adds a zero point per block.
        embedding: also quantize the token embedding (a ``Gather`` of a constant table).
        lm_head: also quantize output projections (a weight product that is a graph output:
            an LM's logits, a classifier's last layer).
        algorithm: a name registered with :func:`register_weight_quantizer` (``"rtn"``).
    """

    bits: int = 4
    block_size: int = 32
    target: str = "onnxruntime"
    accuracy_level: int = 0
    symmetric: bool = True
    embedding: bool = False
    lm_head: bool = True
    algorithm: str = "rtn"

    def __post_init__(self):
        for name in ("bits", "block_size", "accuracy_level"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.bits not in BITS:
            raise ValueError(f"bits={self.bits} is not supported; choose 4 or 8")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(
                f"block_size={self.block_size} is not supported; choose a power of two from 16 to 256 "
                f"({', '.join(map(str, BLOCK_SIZES))})"
            )
        if self.target not in TARGETS:
            raise ValueError(f"target={self.target!r} is not supported; choose 'onnxruntime' or 'portable'")
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise ValueError(f"accuracy_level={self.accuracy_level} is not supported; choose 0 to 4")
        if self.accuracy_level and self.target != "onnxruntime":
            raise ValueError(
                "accuracy_level is an attribute of onnxruntime's MatMulNBits; the portable target has none "
                "(leave it 0 or use target='onnxruntime')"
            )
        for name in ("symmetric", "embedding", "lm_head"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.algorithm, str):
            raise TypeError(f"algorithm must be the name of a registered weight quantizer, got {self.algorithm!r}")
        weight_quantizer(self.algorithm)

    @classmethod
    def of(cls, spec: WeightQuantization | Mapping[str, Any]) -> WeightQuantization:
        """``spec`` as a WeightQuantization: itself, or built from a dict of its fields."""
        if isinstance(spec, WeightQuantization):
            return spec
        if not isinstance(spec, Mapping):
            raise TypeError(
                f"quantize_weights must be a dynexport.WeightQuantization or a dict of its fields, got {spec!r}"
            )
        unknown = sorted(set(spec) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(
                f"quantize_weights has unknown fields {unknown}; WeightQuantization takes "
                f"{[f.name for f in dataclasses.fields(cls)]}"
            )
        return cls(**spec)

    def metadata(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
