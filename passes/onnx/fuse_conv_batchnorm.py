"""Conv, ConvTranspose or Gemm -> BatchNormalization (inference) with constant parameters -> one
Conv, ConvTranspose or Gemm.

The new weights and bias are computed here, in float64, and stored in the weights' dtype: a
BatchNormalization scales each output channel by ``scale / sqrt(var + eps)`` and shifts it, so
``W' = W * factor`` along the output-channel axis and ``b' = (b - mean) * factor + shift``. A
weight or bias that other nodes read too is cloned, never changed under them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dynexport.passes.onnx.values import (
    add_initializer,
    constant_array,
    insert_replacement,
    nodes_of,
    single_consumer,
)

__all__ = ["fuse_conv_batchnorm"]

_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def fuse_conv_batchnorm(graph: ir.Graph) -> int:
    """Fold each eligible BatchNormalization into the Conv, ConvTranspose or Gemm before it;
    return how many."""
    fused = 0
    for norm in nodes_of(graph, "BatchNormalization"):
        if any(v.uses() or v.is_graph_output() for v in norm.outputs[1:]):
            continue
        if "training_mode" in norm.attributes and norm.attributes["training_mode"].as_int():
            continue
        layer = norm.inputs[0].producer()
        if layer is None or layer.domain not in ("", "ai.onnx") or single_consumer(layer.outputs[0]) is not norm:
            continue
        statistics = [constant_array(v) for v in norm.inputs[1:5]]
        if any(s is None for s in statistics):
            continue
        scale, shift, mean, var = (s.astype(np.float64) for s in statistics)
        epsilon = norm.attributes["epsilon"].as_float() if "epsilon" in norm.attributes else 1e-5
        factor = scale / np.sqrt(var + epsilon)
        fold = _FOLDS.get(layer.op_type)
        if fold is not None and fold(graph, layer, norm, factor, shift - mean * factor):
            fused += 1
    return fused


def _fold_conv(graph: ir.Graph, conv: ir.Node, norm: ir.Node, factor: np.ndarray, shift: np.ndarray) -> bool:
    weight = constant_array(conv.inputs[1])
    if weight is None or weight.shape[0] != factor.size:
        return False
    return _replace(graph, conv, norm, weight * factor.reshape(-1, *[1] * (weight.ndim - 1)), factor, shift)


def _fold_conv_transpose(graph: ir.Graph, conv: ir.Node, norm: ir.Node, factor: np.ndarray, shift: np.ndarray) -> bool:
    # The weight is (in_channels, out_channels / groups, *kernel); output channel g * (out /
    # groups) + j is column j of group g.
    weight = constant_array(conv.inputs[1])
    groups = conv.attributes["group"].as_int() if "group" in conv.attributes else 1
    if weight is None or weight.shape[1] * groups != factor.size:
        return False
    per_group = factor.reshape(groups, 1, weight.shape[1], *[1] * (weight.ndim - 2))
    scaled = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:]) * per_group
    return _replace(graph, conv, norm, scaled.reshape(weight.shape), factor, shift)


def _fold_gemm(graph: ir.Graph, gemm: ir.Node, norm: ir.Node, factor: np.ndarray, shift: np.ndarray) -> bool:
    weight = constant_array(gemm.inputs[1])
    transposed = "transB" in gemm.attributes and gemm.attributes["transB"].as_int()
    if weight is None or weight.ndim != 2 or weight.shape[0 if transposed else 1] != factor.size:
        return False
    # Gemm scales its bias by beta; the folded bias is stored already scaled (beta = 1).
    beta = gemm.attributes["beta"].as_float() if "beta" in gemm.attributes else 1.0
    scaled = weight * (factor[:, None] if transposed else factor[None, :])
    return _replace(graph, gemm, norm, scaled, factor, shift, bias_scale=beta)


_FOLDS = {"Conv": _fold_conv, "ConvTranspose": _fold_conv_transpose, "Gemm": _fold_gemm}


def _replace(
    graph: ir.Graph,
    layer: ir.Node,
    norm: ir.Node,
    weight: np.ndarray,
    factor: np.ndarray,
    shift: np.ndarray,
    *,
    bias_scale: float = 1.0,
) -> bool:
    """Replace ``layer`` and ``norm`` by one copy of ``layer`` reading ``weight`` and the folded
    bias; False, and nothing changed, when the layer's bias is no constant per-channel vector."""
    old_weight = layer.inputs[1]
    old_bias = layer.inputs[2] if len(layer.inputs) > 2 else None
    if old_weight.dtype not in _FLOAT_TYPES:
        return False
    bias = shift
    if old_bias is not None:
        array = constant_array(old_bias)
        # Gemm's bias broadcasts: a column of one value per row is no per-channel shift.
        if array is None or array.size not in (1, factor.size) or array.ndim == 2 and array.shape[0] != 1:
            return False
        bias = bias_scale * array.astype(np.float64).reshape(-1) * factor + shift
    dtype = old_weight.dtype.numpy()
    bias_name = old_bias.name if old_bias is not None else _bias_name(old_weight.name)
    inputs = [
        layer.inputs[0],
        add_initializer(graph, weight.astype(dtype), f"{old_weight.name}.bn_folded"),
        add_initializer(graph, bias.astype(dtype), f"{bias_name}.bn_folded"),
    ]
    attributes = [a for name, a in layer.attributes.items() if name != "beta"]
    fused = ir.Node(layer.domain, layer.op_type, inputs, attributes)
    if not insert_replacement(graph, norm, fused, norm.outputs[0]):
        for value in inputs[1:]:
            del graph.initializers[value.name]
        return False
    graph.remove([layer, norm], safe=True)
    for new, name in zip(inputs[1:], (old_weight.name, bias_name)):
        _take_name(graph, new, name)
    return True


def _bias_name(weight_name: str) -> str:
    return weight_name.removesuffix("weight") + "bias" if weight_name.endswith("weight") else f"{weight_name}.bias"


def _take_name(graph: ir.Graph, value: ir.Value, name: str) -> None:
    """Rename the initializer ``value`` to ``name`` once the initializer that had it is unused."""
    old = graph.initializers.get(name)
    if old is not None and (old.uses() or old.is_graph_input() or old.is_graph_output()):
        return
    graph.initializers.pop(name, None)
    del graph.initializers[value.name]
    value.name = name
    value.const_value.name = name
    graph.register_initializer(value)
