"""Weights stored as int4 or int8 with per-block scales (docs/llm.md).

``ONNXProgram.quantize_weights(...)`` and ``dynexport.export(..., quantize_weights=...)`` rewrite
the weight products (and, if asked, the embedding) of an exported model; ``weights`` holds the
options and the algorithms, ``graph`` the rewrite and its float reference, ``accuracy`` what the
quantization costs and the check that the rewrite is right.
"""

from dynexport.quantize.accuracy import AccuracyCost, accuracy_cost, seeded_calls, verify_quantized
from dynexport.quantize.graph import dequantized_model, quantization_of, quantize_model
from dynexport.quantize.weights import (
    KnownWeights,
    QuantizedWeight,
    WeightQuantization,
    WeightQuantizer,
    register_weight_quantizer,
    round_to_nearest,
    weight_quantizer,
)

__all__ = [
    "AccuracyCost",
    "KnownWeights",
    "QuantizedWeight",
    "WeightQuantization",
    "WeightQuantizer",
    "accuracy_cost",
    "dequantized_model",
    "quantization_of",
    "quantize_model",
    "register_weight_quantizer",
    "round_to_nearest",
    "seeded_calls",
    "verify_quantized",
    "weight_quantizer",
]
