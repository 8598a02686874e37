"""Models that live on a CUDA device, exported as users export them there: the model and its
example inputs on the GPU (``model.cuda()``), the ONNX model then run in onnxruntime against the
model run eagerly on the GPU, at the example and at other sizes of the dynamic dims.

On CUDA, torch dispatches to other kernels than on the CPU (SDPA's flash and memory-efficient
attention, cuDNN's RNNs and batch norm), and the weights and constants the graph captures are
GPU tensors: these tests prove that the export reads through both. They need a CUDA device and
are skipped without one (CI has none); ``DYNEXPORT_TEST_DEVICE=cpu`` runs them on the CPU."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import dynexport
from dynexport.verification import float32_without_tf32
from tests.equivalence import assert_close

DEVICE = torch.device(os.environ.get("DYNEXPORT_TEST_DEVICE", "cuda"))

pytestmark = pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device (none here)"
)

Dim = torch.export.Dim


def _on_device(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(DEVICE) for t in tensors)


def _eager(model: torch.nn.Module, *args, **kwargs):
    """The model's outputs on the CPU, computed without TF32 (cuDNN's default rounding on CUDA)."""
    with torch.no_grad(), float32_without_tf32():
        return torch.utils._pytree.tree_map(
            lambda v: v.cpu() if isinstance(v, torch.Tensor) else v, model(*args, **kwargs)
        )


def _assert_runs_as_eager(model, program, calls, **tolerances):
    for args in calls:
        assert_close(program(*args), _eager(model, *args), where=str([tuple(a.shape) for a in args]), **tolerances)


class _ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
            torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), torch.nn.BatchNorm2d(8), torch.nn.Hardswish(),
        )
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def test_a_convolutional_network_on_cuda():
    torch.manual_seed(0)
    model = _ConvNet().to(DEVICE).eval()
    for bn in (model.features[1], model.features[4]):  # statistics that are not the identity
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x, = _on_device(torch.randn(2, 3, 16, 16))
    program = dynexport.export(model, (x,), dynamic_shapes=({0: Dim("batch"), 2: Dim("h"), 3: Dim("w")},))
    assert not [n.op_type for n in program.model.graph if n.op_type == "BatchNormalization"]
    _assert_runs_as_eager(model, program, [(x,), _on_device(torch.randn(3, 3, 20, 12))])


class _Upsampler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.norm = torch.nn.GroupNorm(2, 4)

    def forward(self, x):
        smooth = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.norm(self.up(x) + smooth)


def test_an_upsampling_block_on_cuda():
    torch.manual_seed(0)
    model = _Upsampler().to(DEVICE).eval()
    x, = _on_device(torch.randn(2, 4, 6, 6))
    program = dynexport.export(model, (x,), dynamic_shapes=({0: Dim("batch"), 2: Dim("h"), 3: Dim("w")},))
    _assert_runs_as_eager(model, program, [(x,), _on_device(torch.randn(1, 4, 9, 5))])


def test_timm_efficientnet_on_cuda(timm):
    torch.manual_seed(0)
    model = timm.create_model("efficientnet_b0", pretrained=False).to(DEVICE).eval()
    x, = _on_device(torch.randn(2, 3, 64, 64))
    program = dynexport.export(model, (x,), dynamic_shapes=({0: Dim("batch")},))
    _assert_runs_as_eager(model, program, [(x,), _on_device(torch.randn(3, 3, 64, 64))])


class _Attention(torch.nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x, mask):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, 4, 8).permute(2, 0, 3, 1, 4)
        if self.causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "masked"])
def test_scaled_dot_product_attention_on_cuda(causal, dtype):
    # On CUDA, SDPA runs flash or memory-efficient attention (float16) or the math kernel.
    torch.manual_seed(0)
    model = _Attention(causal).to(DEVICE, dtype).eval()

    def call(batch, seq):
        mask = torch.ones(batch, seq, dtype=torch.bool)
        mask[-1, seq // 2:] = False
        return _on_device(torch.randn(batch, seq, 32).to(dtype), mask)

    dims = ({0: Dim("batch"), 1: Dim("seq")}, {0: Dim("batch"), 1: Dim("seq")})
    program = dynexport.export(model, call(2, 8), dynamic_shapes=dims)
    _assert_runs_as_eager(model, program, [call(2, 8), call(3, 13)])


def test_a_bidirectional_lstm_on_cuda():
    # cuDNN's RNN kernel on CUDA.
    torch.manual_seed(0)
    model = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True).to(DEVICE).eval()
    x, = _on_device(torch.randn(2, 5, 6))
    program = dynexport.export(model, (x,), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq")},))
    _assert_runs_as_eager(model, program, [(x,), _on_device(torch.randn(3, 9, 6))])


def test_torchvision_resnet18_on_cuda(torchvision, tmp_path):
    torch.manual_seed(0)
    model = torchvision.models.resnet18().to(DEVICE).eval()
    x, = _on_device(torch.randn(1, 3, 64, 64))
    program = dynexport.export(model, (x,), dynamic_shapes=({0: Dim("batch")},))
    _assert_runs_as_eager(model, program, [(x,), _on_device(torch.randn(2, 3, 64, 64))])
    # verify() compares with the model run without TF32, which cuDNN's convolutions use by default.
    report = program.verify(model=model, resized=True)
    assert report.passed, report
    # Saved with its weights in a separate file, as large models are: the file is what runs.
    program.save(tmp_path / "resnet18.onnx", external_data=True)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "resnet18.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})
    assert_close(torch.from_numpy(logits), _eager(model, x))


def test_the_seed_alexnet_example_on_cuda(torchvision, tmp_path, capsys):
    # The torch.onnx docs' first example as written there (weights=None for pretrained=True).
    dummy_input = torch.randn(10, 3, 224, 224, device=DEVICE)
    model = torchvision.models.alexnet(weights=None).to(DEVICE)
    input_names = ["actual_input_1"] + ["learned_%d" % i for i in range(16)]
    output_names = ["output1"]
    path = tmp_path / "alexnet.onnx"
    dynexport.export(model, dummy_input, str(path), verbose=True, input_names=input_names, output_names=output_names)
    assert "%learned_15 : float[1000]" in capsys.readouterr().out
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output1,) = session.run(None, {"actual_input_1": dummy_input.cpu().numpy()})
    assert_close(torch.from_numpy(output1), _eager(model.eval(), dummy_input))


def test_bert_with_a_plain_seq_dim_on_cuda():
    from tests.models.families import ENCODERS, text_inputs

    model = ENCODERS["bert"]().to(DEVICE).eval()
    inputs = {name: value.to(DEVICE) for name, value in text_inputs(2, 8).items()}
    dims = {name: {0: Dim("batch"), 1: Dim("seq")} for name in inputs}
    program = dynexport.export(model, (), kwargs=inputs, dynamic_shapes=dims)
    for batch, seq in ((2, 8), (3, 17)):
        inputs = {name: value.to(DEVICE) for name, value in text_inputs(batch, seq).items()}
        expected = _eager(model, **inputs)
        assert_close(program(**inputs).last_hidden_state, expected.last_hidden_state, where=f"{batch}x{seq}")


def _llama(dtype=torch.float32):
    from tests.models.families import DECODERS

    return DECODERS["llama"](True).to(DEVICE, dtype).eval()


def _cache_argument(model) -> str:
    """The name forward takes the cache by (``past_key_values`` until transformers 5.2x)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _decoder_call(model, batch: int, past: int, seq: int) -> dict:
    """A decode call on the model's device: ``past`` random cached keys and values per layer."""
    import transformers

    config, dtype = model.config, next(model.parameters()).dtype
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    generator = torch.Generator().manual_seed(100 * batch + past)
    cached = [
        tuple(torch.randn(batch, config.num_key_value_heads, past, head_dim, generator=generator).to(DEVICE, dtype) for _ in "kv")
        for _ in range(config.num_hidden_layers)
    ]
    return {
        "input_ids": torch.randint(1, config.vocab_size, (batch, seq), generator=generator).to(DEVICE),
        "attention_mask": torch.ones(batch, past + seq, dtype=torch.int64, device=DEVICE),
        "position_ids": torch.arange(past, past + seq, device=DEVICE).expand(batch, seq).contiguous(),
        _cache_argument(model): transformers.DynamicCache(cached),
    }


def _decoder_dims(model) -> dict:
    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past", min=0)
    return {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},
        "position_ids": {0: batch, 1: seq},
        _cache_argument(model): [[{0: batch, 2: past}] * model.config.num_hidden_layers] * 2,
    }


def test_a_llama_decoder_with_its_cache_generates_as_eager_on_cuda():
    from dynexport.generation import greedy_generate
    from tests.test_generation import NEW_TOKENS, _prompts

    model = _llama()
    program = dynexport.export(model, (), kwargs=_decoder_call(model, 2, 3, 4), dynamic_shapes=_decoder_dims(model))
    for batch in (1, 2):
        ids, mask = _prompts(batch)
        with torch.no_grad():
            expected = model.generate(
                input_ids=ids.to(DEVICE), attention_mask=mask.to(DEVICE), do_sample=False,
                max_new_tokens=NEW_TOKENS, pad_token_id=0,
            )
        actual = greedy_generate(
            program, ids.to(DEVICE), mask.to(DEVICE), max_new_tokens=NEW_TOKENS,
            eos_token_id=model.generation_config.eos_token_id, pad_token_id=0,
        )
        assert actual.device == expected.device and actual.tolist() == expected.tolist(), f"batch {batch}"


def test_a_float16_llama_decoder_on_cuda():
    model = _llama(torch.float16)
    program = dynexport.export(model, (), kwargs=_decoder_call(model, 2, 3, 4), dynamic_shapes=_decoder_dims(model))
    for batch, past, seq in ((2, 3, 4), (1, 0, 6), (3, 7, 1)):
        call = _decoder_call(model, batch, past, seq)
        expected = _eager(model, **_decoder_call(model, batch, past, seq))  # eager fills its cache in place
        actual = program(**call)
        assert actual.logits.dtype == torch.float16
        assert_close(actual.logits, expected.logits, where=f"batch {batch} past {past} seq {seq}")


def test_int4_weights_from_a_model_on_cuda():
    model = _llama()
    call = _decoder_call(model, 2, 3, 4)
    program = dynexport.export(
        model, (), kwargs=call, dynamic_shapes=_decoder_dims(model), target="onnxruntime",
        quantize_weights={"bits": 4, "accuracy_level": 4},
    )
    assert any(n.op_type == "MatMulNBits" for n in program.model.graph)
    report = program.verify(model=model, kwargs=_decoder_call(model, 2, 3, 4))
    assert report.accuracy is not None


def test_the_compile_backend_on_cuda_tensors():
    torch.manual_seed(0)
    model = _ConvNet().to(DEVICE).eval()
    compiled = torch.compile(model, backend=dynexport.backend(fallback="raise"), dynamic=True)
    for batch in (2, 5):
        x, = _on_device(torch.randn(batch, 3, 16, 16))
        with torch.no_grad():
            actual = compiled(x)
            assert actual.device == x.device
            assert_close(actual.cpu(), model(x).cpu())
