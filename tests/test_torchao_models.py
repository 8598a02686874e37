"""Models quantized with torchao's weight-only configs export with their own integers
(dynexport/quantize/torchao.py, docs/llm.md): each graph runs in onnxruntime and gives what the
torchao model computes eagerly, up to float rounding, and stores torchao's codes, scales and
zero points as they are."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
import transformers

import dynexport
from dynexport.quantize.torchao import TorchaoWeightError
from tests.equivalence import assert_close, op_histogram
from tests.models.families import DECODER_COMMON, text_inputs, tiny

torchao = pytest.importorskip("torchao")
from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
from torchao.quantization import (
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    MappingType,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup

Dim = torch.export.Dim

CONFIGS = {
    "int8": lambda: Int8WeightOnlyConfig(),
    "intx-int4-group16": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16)),
    "intx-int4-group16-asym": lambda: IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(16), mapping_type=MappingType.ASYMMETRIC
    ),
    "intx-int8-per-axis": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
    "intx-int8-group16": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerGroup(16)),
}
# What each layer of MLP (K = 64 and 48) becomes: MatMulNBits where the block size is one of
# its (16, 32, ..., 256), else DequantizeLinear (per output feature: one block along K = 48).
ONNXRUNTIME_OPS = {
    "int8": {"MatMulNBits": 1, "DequantizeLinear": 1, "MatMul": 1, "Add": 1, "Relu": 1},
    "intx-int4-group16": {"MatMulNBits": 2, "Relu": 1},
    "intx-int4-group16-asym": {"MatMulNBits": 2, "Relu": 1},
    "intx-int8-per-axis": {"MatMulNBits": 1, "DequantizeLinear": 1, "MatMul": 1, "Add": 1, "Relu": 1},
    "intx-int8-group16": {"MatMulNBits": 2, "Relu": 1},
}


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(64, 48), torch.nn.Linear(48, 32)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def _quantized(model: torch.nn.Module, config, **kwargs) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(model, config, **kwargs)
    return model


def _exact(program: dynexport.ONNXProgram) -> dynexport.ONNXProgram:
    # onnxruntime fuses DequantizeLinear + MatMul into MatMulNBits, by default with int8
    # activations (accuracy level 4): keep them in float to compare with eager.
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return program.with_model(program.model, session_options=options)


def _export(model, args, **kwargs) -> dynexport.ONNXProgram:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dynexport.export(model, args, **kwargs)


@pytest.mark.parametrize("target", ["onnxruntime", None])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_torchao_mlp_runs_as_eager_with_its_integers(name, target):
    model = _quantized(MLP().eval(), CONFIGS[name]())
    weights = [model.first.weight, model.second.weight]
    program = _export(model, (torch.randn(3, 64),), dynamic_shapes=({0: Dim("batch")},), opset_version=21,
                      target=target)
    assert [model.first.weight, model.second.weight] == weights  # the model keeps its torchao weights
    if target == "onnxruntime":
        assert op_histogram(program) == ONNXRUNTIME_OPS[name]
    else:
        assert op_histogram(program) == {"DequantizeLinear": 2, "MatMul": 2, "Add": 2, "Relu": 1}
    assert not any(name.endswith(".weight") for name in program.model.graph.initializers)  # no float copy
    onnx.checker.check_model(program.model_proto, full_check=True)
    for batch in (3, 7):
        x = torch.randn(batch, 64)
        with torch.no_grad():
            assert_close(_exact(program)(x), model(x), where=f"{name}, batch {batch}")


def _unpacked_codes(packed: np.ndarray, k: int) -> np.ndarray:
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    return codes[:, :k].astype(np.int32)


def test_matmul_nbits_holds_torchao_codes_and_scales():
    model = _quantized(MLP().eval(), CONFIGS["intx-int4-group16-asym"]())
    program = _export(model, (torch.randn(3, 64),), opset_version=21, target="onnxruntime")
    initializers = program.model.graph.initializers
    weight = model.first.weight
    codes = _unpacked_codes(initializers["first.weight.nbits.quantized"].const_value.numpy().reshape(48, -1), 64)
    zero_points = _unpacked_codes(initializers["first.weight.nbits.zero_points"].const_value.numpy().reshape(48, -1), 4)
    # torchao's signed int4 codes and zero points, shifted by 8 into MatMulNBits' unsigned ones.
    np.testing.assert_array_equal(codes - 8, weight.qdata.numpy())
    np.testing.assert_array_equal(zero_points - 8, weight.zero_point.numpy())
    scales = initializers["first.weight.nbits.scales"].const_value.numpy()
    np.testing.assert_array_equal(scales, weight.scale.numpy().reshape(-1))


def test_torchao_embedding_becomes_gather_block_quantized():
    class Embedded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed, self.proj = torch.nn.Embedding(100, 32), torch.nn.Linear(32, 16)

        def forward(self, ids):
            return self.proj(self.embed(ids))

    model = _quantized(Embedded().eval(), CONFIGS["intx-int4-group16"](),
                       filter_fn=lambda module, _: isinstance(module, torch.nn.Embedding))
    ids = torch.randint(0, 100, (2, 5))
    for target, ops in (("onnxruntime", {"GatherBlockQuantized": 1, "MatMul": 1, "Add": 1}),
                        (None, {"DequantizeLinear": 1, "Gather": 1, "MatMul": 1, "Add": 1})):
        program = _export(model, (ids,), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq")},), opset_version=21,
                          target=target)
        assert op_histogram(program) == ops and "embed.weight" not in program.model.graph.initializers
        other = torch.randint(0, 100, (3, 9))
        with torch.no_grad():
            assert_close(program(other), model(other), where=f"target {target}")


def test_torchao_llama_exports_with_dynamic_shapes():
    model = transformers.LlamaForCausalLM(tiny(
        transformers.LlamaConfig, **DECODER_COMMON, intermediate_size=64, num_key_value_heads=2, use_cache=False,
    )).eval()
    model = _quantized(model, CONFIGS["intx-int4-group16"]())
    batch, seq = Dim("batch"), Dim("seq", min=2, max=32)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    program = _export(model, (), kwargs=text_inputs(2, 8), dynamic_shapes=dims, opset_version=21,
                      target="onnxruntime")
    # Four products a layer (q|k|v and gate|up packed, passes/onnx/pack_matmuls.py: torchao's
    # integers stacked), and the LM head (its own torchao weight: quantize_ unties it).
    assert op_histogram(program)["MatMulNBits"] == 4 * 2 + 1
    for batch, seq in ((2, 8), (3, 13)):
        call = text_inputs(batch, seq)
        with torch.no_grad():
            assert_close(program(**call), model(**call).logits, where=f"batch {batch}, seq {seq}")


@pytest.mark.parametrize(
    "config, message",
    [
        (lambda: IntxWeightOnlyConfig(weight_dtype=torch.int2, granularity=PerGroup(16)), "torch.int2 codes"),
        (lambda: Int8DynamicActivationInt8WeightConfig(), "also quantizes the activations"),
        (lambda: PrototypeInt4WeightOnlyConfig(group_size=32), "Int4OpaqueTensor.*IntxWeightOnlyConfig"),
    ],
    ids=["int2", "dynamic-activations", "int4-packed-for-a-kernel"],
)
def test_torchao_weights_without_an_onnx_form_are_refused(config, message):
    model = _quantized(MLP().eval(), config())
    with pytest.raises(TorchaoWeightError, match=message) as raised:
        _export(model, (torch.randn(3, 64),))
    assert "first.weight" in str(raised.value)
    assert type(model.first.weight).__name__ != "Parameter"  # put back after the refusal


def test_int4_dequantize_linear_below_opset_21_is_refused():
    model = _quantized(MLP().eval(), CONFIGS["intx-int4-group16"]())
    with pytest.raises(ValueError, match="from opset 21"):
        _export(model, (torch.randn(3, 64),), opset_version=20)


def test_quantize_weights_chooses_the_accuracy_level_and_verify_checks_the_stored_weights():
    model = _quantized(MLP().eval(), CONFIGS["intx-int4-group16"]())
    program = _export(model, (torch.randn(3, 64),), dynamic_shapes=({0: Dim("batch")},), target="onnxruntime",
                      quantize_weights={"accuracy_level": 4}, verify=True)
    assert {n.attributes["accuracy_level"].as_int() for n in program.model.graph if n.op_type == "MatMulNBits"} == {4}
    assert program.verification.passed and program.verification.accuracy.calls == 4


def test_a_torchao_weight_no_product_reads_is_named_in_a_warning():
    class Unused(MLP):
        def forward(self, x):
            self.second(torch.relu(self.first(x)))  # result unused: the graph drops both layers
            return self.first(x)

    model = _quantized(Unused().eval(), CONFIGS["intx-int4-group16"]())
    with pytest.warns(UserWarning, match=r"\['second.weight'\] are not stored quantized"):
        program = dynexport.export(model, (torch.randn(3, 64),), opset_version=21)
    assert op_histogram(program)["DequantizeLinear"] == 1


@pytest.mark.parametrize("target", ["onnxruntime", None])
def test_float16_torchao_model(target):
    model = _quantized(MLP().eval().to(torch.float16), CONFIGS["intx-int4-group16"]())
    program = _export(model, (torch.randn(3, 64, dtype=torch.float16),), dynamic_shapes=({0: Dim("batch")},),
                      opset_version=21, target=target)
    assert {v.dtype for v in program.model.graph.initializers.values() if v.name.endswith(".scales")} == {
        ir.DataType.FLOAT16
    }
    x = torch.randn(5, 64, dtype=torch.float16)
    with torch.no_grad():
        assert_close(_exact(program)(x), model(x))
