"""Weights stored as int4/int8 with per-block scales (dynexport/quantize/, docs/llm.md).

Every form runs in onnxruntime and gives what the same model computes in PyTorch with the
dequantized weights (the same integers, expanded by torch: exact up to float rounding), and
stays close to the float model; the graphs hold the expected ops and initializer types."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
import transformers

import dynexport
from dynexport.quantize import (
    AccuracyCost,
    KnownWeights,
    QuantizedWeight,
    WeightQuantization,
    accuracy_cost,
    quantization_of,
    quantize_model,
    register_weight_quantizer,
    round_to_nearest,
    seeded_calls,
)
from dynexport.quantize import graph as quantize_graph_module
from dynexport.quantize import weights as quantize_weights_module
from tests.equivalence import assert_close, op_histogram
from tests.models.families import DECODER_COMMON, text_inputs, tiny

Dim = torch.export.Dim

# (target, bits, symmetric): every form of a weight product and an embedding.
FORMS = [
    ("onnxruntime", 4, True),
    ("onnxruntime", 4, False),
    ("onnxruntime", 8, True),
    ("onnxruntime", 8, False),
    ("portable", 4, True),
    ("portable", 4, False),
    ("portable", 8, True),
]


def _form_id(form) -> str:
    target, bits, symmetric = form
    return f"{target}-int{bits}-{'sym' if symmetric else 'asym'}"


class MLP(torch.nn.Module):
    """Two Gemms (2-D input, bias) with K = 48 not a multiple of 32 in the second, and a third
    product that reuses the first layer's weight (one stored copy for both)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(64, 48), torch.nn.Linear(48, 64)

    def forward(self, x):
        hidden = torch.relu(self.first(x))
        return self.first(torch.relu(self.second(hidden)))


def _exact_session_options() -> ort.SessionOptions:
    # onnxruntime fuses DequantizeLinear + MatMul into MatMulNBits and, by default, computes
    # its activations in int8 there (accuracy level 4): keep them in float to compare exactly.
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return options


def _exact(program: dynexport.ONNXProgram) -> dynexport.ONNXProgram:
    return program.with_model(program.model, session_options=_exact_session_options())


def _dequantized_copy(model: torch.nn.Module, config: WeightQuantization, *, blocked: bool = True) -> torch.nn.Module:
    """``model`` with the weights the quantized graph stores, expanded back to float by torch."""
    model = copy.deepcopy(model)
    modules = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if config.embedding:
        modules += [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    for module in modules:
        weight = module.weight.detach()
        block_size = config.block_size if blocked else weight.shape[1]
        quantized = round_to_nearest(weight, bits=config.bits, block_size=block_size, symmetric=config.symmetric)
        module.weight.data = quantized.dequantize()
    return model


@pytest.fixture(scope="module")
def mlp_programs():
    model = MLP().eval()
    x = torch.randn(3, 64)
    return model, x, {
        opset: dynexport.export(model, (x,), dynamic_shapes=({0: Dim("batch")},), opset_version=opset)
        for opset in (20, 21)
    }


@pytest.fixture(scope="module")
def llama():
    model = transformers.LlamaForCausalLM(tiny(
        transformers.LlamaConfig, **DECODER_COMMON, intermediate_size=64, num_key_value_heads=2, use_cache=False,
    )).eval()
    inputs = text_inputs(2, 8)
    batch, seq = Dim("batch"), Dim("seq", min=2, max=32)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = dynexport.export(model, (), kwargs=inputs, dynamic_shapes=dims, opset_version=21)
    return model, inputs, program


# -- each form runs and equals its dequantized reference --------------------------------------


@pytest.mark.parametrize("form", FORMS, ids=_form_id)
def test_mlp_forms_equal_the_model_with_dequantized_weights(mlp_programs, form):
    target, bits, symmetric = form
    model, x, programs = mlp_programs
    quantized = programs[21].quantize_weights(bits, target=target, symmetric=symmetric, block_size=16)
    config = WeightQuantization(bits=bits, block_size=16, target=target, symmetric=symmetric)
    reference = _dequantized_copy(model, config)
    for batch in (3, 7):
        x = torch.randn(batch, 64)
        with torch.no_grad():
            assert_close(_exact(quantized)(x), reference(x), where=f"batch {batch}")
            float_output = model(x)
        # Close to the float model (as onnxruntime runs it): relative RMS errors are about 0.1
        # in int4 and 0.006 in int8 for these three chained random layers.
        relative_error = (quantized(x) - float_output).norm() / float_output.norm()
        assert relative_error < (0.2 if bits == 4 else 0.02)


@pytest.mark.parametrize("form", FORMS, ids=_form_id)
def test_llama_forms_equal_the_model_with_dequantized_weights(llama, form):
    target, bits, symmetric = form
    model, inputs, program = llama
    quantized = program.quantize_weights(bits, target=target, symmetric=symmetric, embedding=True)
    config = WeightQuantization(bits=bits, target=target, symmetric=symmetric, embedding=True)
    reference = _dequantized_copy(model, config)
    for batch, seq in ((2, 8), (3, 13)):
        call = text_inputs(batch, seq)
        with torch.no_grad():
            assert_close(_exact(quantized)(**call), reference(**call).logits, where=f"batch {batch}, seq {seq}")
    cost = accuracy_cost(quantized, model, seeded_calls((), inputs))
    assert cost.predictions == 4 * 2 * 8
    assert cost.top1_agreement >= (0.6 if bits == 4 else 0.9)


def test_verify_checks_the_stored_weights_and_reports_the_cost_against_the_float_model(llama):
    _, _, program = llama
    quantized = program.quantize_weights(4, embedding=True, accuracy_level=4)
    report = quantized.verify(resized=True)
    assert report.passed and quantized.verification is report
    assert [o.inputs for o in report.outputs] == ["example", "resized"]
    assert isinstance(report.accuracy, AccuracyCost) and report.accuracy.calls == 4
    assert "top-1 agreement" in report.summary() and "max abs error" in report.summary()
    assert program.verify().accuracy is None  # the float program is untouched: verified as before


# -- the graphs -------------------------------------------------------------------------------


def _initializer(program: dynexport.ONNXProgram, value: ir.Value) -> np.ndarray:
    return program.model.graph.initializers[value.name].const_value.numpy()


def test_onnxruntime_form_graph(mlp_programs):
    _, _, programs = mlp_programs
    quantized = programs[20].quantize_weights(4, block_size=32, accuracy_level=4)
    assert op_histogram(quantized) == {"MatMulNBits": 3, "Relu": 2}
    assert quantized.model.opset_imports["com.microsoft"] == 1
    first, second, reused = [n for n in quantized.model.graph if n.op_type == "MatMulNBits"]
    assert first.domain == "com.microsoft"
    attributes = {name: attr.as_int() for name, attr in second.attributes.items()}
    assert attributes == {"K": 48, "N": 64, "bits": 4, "block_size": 32, "accuracy_level": 4}
    # B [N, blocks, block_size * bits / 8] uint8, scales [N * blocks]; symmetric: no zero points;
    # the Gemm's bias is MatMulNBits' bias input.
    assert _initializer(quantized, second.inputs[1]).shape == (64, 2, 16)
    assert _initializer(quantized, second.inputs[1]).dtype == np.uint8
    assert _initializer(quantized, second.inputs[2]).shape == (128,)
    assert second.inputs[3] is None and second.inputs[5].name == "second.bias"
    # The reused weight is stored once.
    assert reused.inputs[1] is first.inputs[1]
    assert not any(name.endswith(".weight") for name in quantized.model.graph.initializers)
    onnx.checker.check_model(quantized.model_proto, full_check=True)


def test_a_bias_added_after_a_matmul_becomes_matmul_nbits_bias():
    model = torch.nn.Linear(32, 16).eval()
    x = torch.randn(2, 5, 32)  # 3-D: MatMul then Add, no Gemm
    program = dynexport.export(model, (x,), dynamic_shapes=({0: Dim("batch")},))
    assert op_histogram(program) == {"MatMul": 1, "Add": 1}
    quantized = program.quantize_weights(4, block_size=16)
    (node,) = quantized.model.graph
    assert node.op_type == "MatMulNBits" and node.inputs[5].name == "bias"
    reference = _dequantized_copy(model, WeightQuantization(bits=4, block_size=16))
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        assert_close(quantized(x), reference(x))


def test_asymmetric_forms_store_packed_zero_points(mlp_programs):
    _, _, programs = mlp_programs
    quantized = programs[21].quantize_weights(4, symmetric=False, block_size=16)
    second = [n for n in quantized.model.graph if n.op_type == "MatMulNBits"][1]
    # 3 blocks of 16 along K = 48: two per byte, rounded up.
    assert _initializer(quantized, second.inputs[3]).shape == (64 * 2,)
    portable = programs[21].quantize_weights(4, symmetric=False, target="portable")
    dequantize = next(n for n in portable.model.graph if n.op_type == "DequantizeLinear")
    assert [v.dtype for v in dequantize.inputs] == [ir.DataType.UINT4, ir.DataType.FLOAT, ir.DataType.UINT4]


def test_portable_form_graph_at_opset_21(mlp_programs):
    _, _, programs = mlp_programs
    quantized = programs[21].quantize_weights(4, target="portable", block_size=16)
    assert op_histogram(quantized) == {"DequantizeLinear": 2, "MatMul": 3, "Add": 3, "Relu": 2}
    assert "com.microsoft" not in quantized.model.opset_imports
    dequantize = next(n for n in quantized.model.graph if n.op_type == "DequantizeLinear")
    assert {name: attr.as_int() for name, attr in dequantize.attributes.items()} == {"axis": 0, "block_size": 16}
    weight, scales = dequantize.inputs
    assert weight.dtype == ir.DataType.INT4 and weight.shape == [64, 48]  # [K, N], as MatMul reads it
    assert scales.shape == [4, 48]
    onnx.checker.check_model(quantized.model_proto, full_check=True)


def test_portable_int8_below_opset_21_has_one_scale_per_output_feature(mlp_programs):
    model, x, programs = mlp_programs
    with pytest.warns(UserWarning, match="one scale per output feature"):
        quantized = programs[20].quantize_weights(8, target="portable")
    dequantize = next(n for n in quantized.model.graph if n.op_type == "DequantizeLinear")
    assert {name: attr.as_int() for name, attr in dequantize.attributes.items()} == {"axis": 1}
    assert dequantize.inputs[0].dtype == ir.DataType.INT8 and dequantize.inputs[1].shape == [48]
    reference = _dequantized_copy(model, WeightQuantization(bits=8, target="portable"), blocked=False)
    with torch.no_grad():
        assert_close(_exact(quantized)(x), reference(x))
    onnx.checker.check_model(quantized.model_proto, full_check=True)


def test_embedding_forms(llama):
    _, _, program = llama
    onnxruntime_form = program.quantize_weights(4, embedding=True, block_size=16)
    gather = next(n for n in onnxruntime_form.model.graph if n.op_type == "GatherBlockQuantized")
    attributes = {name: attr.as_int() for name, attr in gather.attributes.items()}
    assert attributes == {"gather_axis": 0, "quantize_axis": 1, "block_size": 16, "bits": 4}
    assert _initializer(onnxruntime_form, gather.inputs[0]).shape == (96, 16)  # [V, H * 4 / 8]
    assert _initializer(onnxruntime_form, gather.inputs[2]).shape == (96, 2)
    # Stored weights are named after the parameters, also those the optimizer had transposed.
    names = set(onnxruntime_form.model.graph.initializers)
    assert {"model.embed_tokens.weight.gbq.quantized", "model.layers.0.mlp.down_proj.weight.nbits.quantized",
            "lm_head.weight.nbits.scales"} <= names
    portable = program.quantize_weights(4, embedding=True, target="portable")
    table = next(n for n in portable.model.graph if n.op_type == "Gather").inputs[0].producer()
    assert table.op_type == "DequantizeLinear" and table.inputs[0].shape == [96, 32]
    assert {name: attr.as_int() for name, attr in table.attributes.items()} == {"axis": 1, "block_size": 32}
    without = program.quantize_weights(4)
    assert op_histogram(without)["Gather"] == 1 and "GatherBlockQuantized" not in op_histogram(without)


def test_lm_head_left_float_on_request(llama):
    _, _, program = llama
    quantized = program.quantize_weights(8, lm_head=False)
    logits = quantized.model.graph.outputs[0].producer()
    # Four products a layer: q|k|v and gate|up are packed (passes/onnx/pack_matmuls.py).
    assert logits.op_type == "MatMul" and op_histogram(quantized)["MatMulNBits"] == 4 * 2


def test_tied_embedding_and_lm_head():
    model = transformers.LlamaForCausalLM(tiny(
        transformers.LlamaConfig, **DECODER_COMMON, intermediate_size=64, num_key_value_heads=2, use_cache=False,
        tie_word_embeddings=True,
    )).eval()
    inputs = text_inputs(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = dynexport.export(model, (), kwargs=inputs, opset_version=21)
    for target in ("onnxruntime", "portable"):
        quantized = program.quantize_weights(4, target=target, embedding=True)
        assert "model.embed_tokens.weight" not in quantized.model.graph.initializers
        assert quantized.verify().passed
    # GatherBlockQuantized reads the LM head's MatMulNBits weight and scales through Reshapes:
    # one stored copy.
    quantized = program.quantize_weights(4, embedding=True)
    gather = next(n for n in quantized.model.graph if n.op_type == "GatherBlockQuantized")
    assert [v.producer().op_type for v in gather.inputs[::2]] == ["Reshape", "Reshape"]
    assert not any(".gbq." in name for name in quantized.model.graph.initializers)
    assert gather.inputs[0].producer().inputs[0].name == "model.embed_tokens.weight.nbits.quantized"
    onnx.checker.check_model(quantized.model_proto, full_check=True)


def test_known_weights_are_stored_from_their_own_integers_and_the_rest_stays_float(mlp_programs):
    """A weight quantized before the export (torchao's, tests/test_torchao_models.py) is found
    by its float values and stored from the integers given for it, with their block size."""
    model, x, programs = mlp_programs
    given = round_to_nearest(model.second.weight.detach(), bits=8, block_size=16, symmetric=False)
    known = KnownWeights("a test")
    known.add(model.second.weight.detach(), lambda: given, "second.weight")
    onnx_model = programs[21].model.clone()
    quantize_model(onnx_model, WeightQuantization(target="onnxruntime"), known)
    assert known.missing() == []
    assert quantization_of(onnx_model) == {"source": "a test", "target": "onnxruntime", "accuracy_level": 0}
    (node,) = [n for n in onnx_model.graph if n.op_type == "MatMulNBits"]
    attributes = {name: attr.as_int() for name, attr in node.attributes.items()}
    assert attributes == {"K": 48, "N": 64, "bits": 8, "block_size": 16}
    assert op_histogram(programs[21].with_model(onnx_model)) == {"Gemm": 2, "MatMulNBits": 1, "Relu": 2}
    reference = copy.deepcopy(model)
    reference.second.weight.data = given.dequantize()
    with torch.no_grad():
        assert_close(programs[21].with_model(onnx_model)(x), reference(x))


class EmbeddedMLP(torch.nn.Module):
    """An embedding of odd width 33 (K = 33 for the first product, K = 7 < any block after)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(9, 33)
        self.first, self.second = torch.nn.Linear(33, 7), torch.nn.Linear(7, 3)

    def forward(self, ids):
        return self.second(torch.relu(self.first(self.embedding(ids))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_odd_sizes_and_float16(dtype):
    model = EmbeddedMLP().to(dtype).eval()
    ids = torch.randint(0, 9, (2, 5))
    program = dynexport.export(model, (ids,), opset_version=21)
    with pytest.warns(UserWarning, match="embedding table embedding.weight stays float: GatherBlockQuantized"):
        quantized = program.quantize_weights(4, embedding=True)
    assert op_histogram(quantized)["Gather"] == 1 and op_histogram(quantized)["MatMulNBits"] == 2
    scales = next(n for n in quantized.model.graph if n.op_type == "MatMulNBits").inputs[2]
    assert scales.dtype == (ir.DataType.FLOAT16 if dtype == torch.float16 else ir.DataType.FLOAT)
    for options in ({"bits": 4, "embedding": True}, {"bits": 8, "embedding": True, "symmetric": False}):
        for target in ("onnxruntime", "portable"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantized = program.quantize_weights(target=target, **options)
                report = quantized.verify(resized=[(torch.randint(0, 9, (2, 5)),)])
            assert report.passed, report.summary()


# -- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"bits": 3}, ValueError, "bits=3 is not supported; choose 4 or 8"),
        ({"block_size": 20}, ValueError, "block_size=20 is not supported; choose a power of two"),
        ({"target": "tensorrt"}, ValueError, "target='tensorrt' is not supported"),
        ({"target": "portable", "accuracy_level": 4}, ValueError, "accuracy_level is an attribute of onnxruntime"),
        ({"accuracy_level": 7}, ValueError, "accuracy_level=7 is not supported"),
        ({"algorithm": "gptq"}, ValueError, "algorithm='gptq' is not a registered weight quantizer"),
        ({"bits": 4.0}, TypeError, "bits must be an int"),
        ({"symmetric": "yes"}, TypeError, "symmetric must be True or False"),
    ],
)
def test_bad_options_are_refused(mlp_programs, options, error, message):
    _, _, programs = mlp_programs
    with pytest.raises(error, match=message):
        programs[21].quantize_weights(**options)


def test_int4_portable_below_opset_21_names_the_opset(mlp_programs):
    _, _, programs = mlp_programs
    with pytest.raises(ValueError, match="from opset 21; the model is at opset 20"):
        programs[20].quantize_weights(4, target="portable")


def test_a_model_without_weights_is_refused():
    program = dynexport.export(lambda x, y: x @ y, (torch.randn(2, 3), torch.randn(3, 4)))
    with pytest.raises(ValueError, match="no weight to quantize: no MatMul or Gemm multiplies an activation by a"):
        program.quantize_weights(4)


def test_a_quantized_program_is_not_quantized_again(mlp_programs):
    _, _, programs = mlp_programs
    with pytest.raises(ValueError, match="already quantized"):
        programs[21].quantize_weights(4).quantize_weights(8)


def test_the_options_dict_form():
    assert WeightQuantization.of({"bits": 8, "embedding": True}) == WeightQuantization(bits=8, embedding=True)
    with pytest.raises(ValueError, match=r"unknown fields \['bit'\]"):
        WeightQuantization.of({"bit": 8})


# -- algorithms -------------------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_round_to_nearest_is_within_a_step(bits, symmetric):
    torch.manual_seed(0)
    weight = torch.randn(8, 40) * torch.linspace(0.1, 3, 40)
    weight[3, :16] = 0.0  # an all-zero block
    quantized = round_to_nearest(weight, bits=bits, block_size=16, symmetric=symmetric)
    assert quantized.values.shape == (8, 40) and quantized.scales.shape == (8, 3)
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    assert low <= int(quantized.values.min()) and int(quantized.values.max()) <= high
    step = quantized.scales.repeat_interleave(16, dim=1)[:, :40]
    # Symmetric: half a step; asymmetric: the zero point's rounding may add up to half another.
    bound = step / 2 if symmetric else step
    assert ((quantized.dequantize() - weight).abs() <= bound + 1e-6).all()
    assert (quantized.dequantize()[3, :16] == 0).all()


def _reference_round_to_nearest(weight: np.ndarray, bits: int, block_size: int, symmetric: bool):
    """docs/llm.md's round to nearest, one block at a time in float32: codes ``[N, K]`` (signed
    when symmetric), scales and zero points ``[N, blocks]``."""
    n, k = weight.shape
    blocks = -(-k // block_size)
    codes = np.zeros((n, k), np.int64)
    scales = np.zeros((n, blocks), np.float32)
    zero_points = np.zeros((n, blocks), np.int64)
    for row in range(n):
        for block in range(blocks):
            columns = slice(block * block_size, (block + 1) * block_size)
            values = weight[row, columns]
            if symmetric:
                largest = 2 ** (bits - 1) - 1
                smallest, scale, zero_point = -largest - 1, np.abs(values).max() / np.float32(largest), 0
            else:
                largest, smallest = 2**bits - 1, 0
                low, high = min(values.min(), np.float32(0)), max(values.max(), np.float32(0))
                scale = (high - low) / np.float32(largest)
            divisor = scale if scale != 0 else np.float32(1)
            if not symmetric:
                zero_point = int(np.clip(np.rint(-low / divisor), 0, largest))
            codes[row, columns] = np.clip(np.rint(values / divisor) + zero_point, smallest, largest)
            scales[row, block], zero_points[row, block] = scale, zero_point
    return codes, scales, None if symmetric else zero_points


def _reference_packed(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes as bytes along the last axis: two 4-bit codes a byte, low bits first (an
    odd last one with 0 above it)."""
    if bits == 8:
        return codes.astype(np.uint8)
    packed = np.zeros((*codes.shape[:-1], -(-codes.shape[-1] // 2)), np.uint8)
    for index in np.ndindex(codes.shape):
        packed[(*index[:-1], index[-1] // 2)] |= int(codes[index]) << (4 * (index[-1] % 2))
    return packed


def _reference_stored(weight: np.ndarray, bits: int, block_size: int, symmetric: bool, form: str) -> list:
    """The initializers a form stores for ``weight`` ``[N, K]``, from the reference codes."""
    codes, scales, zero_points = _reference_round_to_nearest(weight, bits, block_size, symmetric)
    if form == "dq":  # DequantizeLinear of [K, N] (a MatMul's weight), blocked along K
        return [codes.T, scales.T] + ([] if symmetric else [zero_points.T])
    if form == "table_dq":  # of [N, K] (a Gather's table)
        return [codes, scales] + ([] if symmetric else [zero_points])
    offset = 2 ** (bits - 1) if symmetric else 0  # onnxruntime's forms store unsigned codes
    n, k = codes.shape
    blocks = scales.shape[1]
    if form == "gbq":  # GatherBlockQuantized's table [N, K * bits / 8], scales [N, blocks]
        stored = [_reference_packed(codes + offset, bits), scales]
    else:  # MatMulNBits' [N, blocks, block_size * bits / 8], K padded with the zero point
        padding = np.full((n, blocks * block_size - k), offset) if symmetric else np.repeat(
            zero_points[:, -1:], blocks * block_size - k, axis=1)
        padded = np.concatenate([codes + offset, padding], axis=1).reshape(n, blocks, block_size)
        stored = [_reference_packed(padded, bits), scales.reshape(-1)]
    if not symmetric:
        packed_zero_points = _reference_packed(zero_points, bits)
        stored.append(packed_zero_points if form == "gbq" else packed_zero_points.reshape(-1))
    return stored


def _products_and_table(weights: dict[str, np.ndarray], table: np.ndarray) -> ir.Model:
    """x @ w for each ``[K, N]`` weight (all outputs, so that they are packed into one) and a
    Gather of ``table``, at opset 21."""
    k = next(iter(weights.values())).shape[0]
    helper = onnx.helper
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", k]),
              helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["batch"])]
    nodes = [helper.make_node("MatMul", ["x", name], [f"{name}.out"]) for name in weights]
    nodes.append(helper.make_node("Gather", ["table", "ids"], ["rows"]))
    outputs = [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None) for node in nodes]
    initializers = [onnx.numpy_helper.from_array(array, name) for name, array in {**weights, "table": table}.items()]
    graph = helper.make_graph(nodes, "products", inputs, outputs, initializer=initializers)
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


@pytest.mark.parametrize("form", FORMS, ids=_form_id)
def test_stored_weights_equal_a_blockwise_reference_bit_for_bit(form, monkeypatch):
    """Codes, scales and zero points of every stored form, byte for byte, against a plain
    block-by-block rounding: K not a multiple of the block (and below it), blocks of zeros,
    weights from 1e-7 to 1e3, two products packed into one, an embedding table; rounded and
    stored a few rows at a time (a large weight's chunks)."""
    monkeypatch.setattr(quantize_weights_module, "_ROUNDED_PER_CHUNK", 200)
    monkeypatch.setattr(quantize_graph_module, "_CONVERTED_PER_CHUNK", 200)
    target, bits, symmetric = form
    generator = np.random.default_rng(bits + 2 * symmetric)
    for k, n, block_size in ((70, 5, 32), (48, 3, 16), (40, 6, 64), (128, 4, 128)):
        magnitudes = 10.0 ** generator.uniform(-7, 3, (k, 1))
        weights = {name: (generator.standard_normal((k, columns)) * magnitudes).astype(np.float32)
                   for name, columns in (("first", n), ("second", n + 3))}
        weights["first"][:, 1] = 0.0  # every block of an output feature zero
        weights["second"][: min(k, block_size), 0] = 0.0  # the first block
        table = (generator.standard_normal((7, 2 * k)) * 0.02).astype(np.float32)
        table[2, :block_size] = 0.0
        model = _products_and_table(weights, table)
        config = WeightQuantization(bits, block_size, target, symmetric=symmetric, embedding=True)
        quantize_model(model, config)
        packed = np.concatenate([weights["first"].T, weights["second"].T])  # [N, K]: both products' rows
        forms = ("dq", "table_dq") if target == "portable" else ("nbits", "gbq")
        parts = ("quantized", "scales") + (() if symmetric else ("zero_points",))
        for name, matrix, stored_form in (("first_second", packed, forms[0]), ("table", table, forms[1])):
            expected = _reference_stored(matrix, bits, block_size, symmetric, stored_form)
            for part, reference in zip(parts, expected):
                stored = model.graph.initializers[f"{name}.{stored_form}.{part}"].const_value.numpy()
                where = f"K={k} block {block_size}: {name} {part}"
                assert stored.shape == reference.shape, where
                if stored.dtype == np.float32:  # byte for byte: a block of zeros has the scale +0.0
                    np.testing.assert_array_equal(stored.view(np.uint32), reference.view(np.uint32), err_msg=where)
                else:
                    np.testing.assert_array_equal(stored.astype(np.int64), reference, err_msg=where)


def test_a_registered_algorithm_is_used(mlp_programs):
    _, _, programs = mlp_programs
    seen = []

    @register_weight_quantizer("test-halved-scales")
    def halved(weight, *, bits, block_size, symmetric) -> QuantizedWeight:
        seen.append(tuple(weight.shape))
        plain = round_to_nearest(weight, bits=bits, block_size=block_size, symmetric=symmetric)
        return QuantizedWeight(plain.values, plain.scales / 2, plain.zero_points, bits, block_size)

    quantized = programs[21].quantize_weights(8, algorithm="test-halved-scales")
    assert seen == [(48, 64), (64, 48)]  # the reused weight is quantized once
    assert quantized.verify().passed
    with pytest.raises(ValueError, match="already registered"):
        register_weight_quantizer("rtn")(halved)


# -- at export time ---------------------------------------------------------------------------


def test_export_quantizes_weights_after_optimization_and_verifies(tmp_path):
    model = MLP().eval()
    x = torch.randn(3, 64)
    path = tmp_path / "mlp.onnx"
    program = dynexport.export(
        model, (x,), path, opset_version=21, quantize_weights={"bits": 4, "block_size": 16}, verify=True,
    )
    assert op_histogram(program)["DequantizeLinear"] == 2  # no target: the portable form
    assert isinstance(program.verification.accuracy, AccuracyCost) and "quantize" in program.timings
    reference = _dequantized_copy(model, WeightQuantization(bits=4, block_size=16, target="portable"))
    saved = program.with_model(ir.load(path), session_options=_exact_session_options())
    with torch.no_grad():
        assert_close(saved(x), reference(x))
    onnxruntime_form = dynexport.export(model, (x,), target="onnxruntime", quantize_weights={"bits": 8})
    assert op_histogram(onnxruntime_form)["MatMulNBits"] == 3
    explicit = dynexport.export(model, (x,), quantize_weights=WeightQuantization(bits=8))
    assert op_histogram(explicit)["MatMulNBits"] == 3


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (4, TypeError, "quantize_weights must be a dynexport.WeightQuantization or a dict of its fields"),
        ({"bits": 2}, ValueError, "bits=2 is not supported"),
    ],
)
def test_export_refuses_bad_quantize_weights_before_any_work(spec, error, message):
    def never_called(x):
        raise AssertionError("the model ran before the options were checked")

    with pytest.raises(error, match=message):
        dynexport.export(never_called, (torch.randn(2),), quantize_weights=spec)


def test_verify_of_a_quantized_decoder_returning_its_cache():
    # GPT-2 with use_cache=True returns a DynamicCache: the quantized program's verify flattens
    # it as the float program's does.
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    program = dynexport.export(
        model, (torch.randint(0, 100, (2, 8)),), input_names=["input_ids"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}},
    )
    quantized = program.quantize_weights(8)
    report = quantized.verify(model=model, resized=True, atol=0.05)
    assert [o.inputs for o in report.outputs][:1] == ["example"] and "resized" in {o.inputs for o in report.outputs}
    assert len(report.outputs) == 2 * (1 + 2 * 2) and report.accuracy.calls > 0
