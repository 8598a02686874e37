"""Whole models exported with dynamic dims and checked in onnxruntime at a second size."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dynexport.examples import EXAMPLES
from dynexport.examples.__main__ import main as examples_main
from tests.equivalence import assert_exports_equivalent, op_histogram

Dim = torch.export.Dim


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_models(name):
    """MLP, AlexNet-like CNN, ResNet-like CNN with BatchNorm, TransformerEncoder, GPT-like LM."""
    model, args, dynamic_shapes, resized = EXAMPLES[name]()
    program = assert_exports_equivalent(model, args, dynamic_shapes=dynamic_shapes, resized=[resized], atol=1e-4)
    histogram = op_histogram(program)
    assert "Dropout" not in histogram
    dynamic_dims = [d for d in program.model.graph.inputs[0].shape if not isinstance(d, int)]
    assert len(dynamic_dims) == sum(len(spec) for spec in dynamic_shapes)


def test_resnet_inplace_relus_are_functionalized_without_retrace(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the program was re-traced")

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", forbidden)
    model, args, dynamic_shapes, _ = EXAMPLES["tiny_resnet"]()
    program = assert_exports_equivalent(model, args, dynamic_shapes=dynamic_shapes)
    assert op_histogram(program)["Conv"] == 9


def test_transformer_encoder_with_padding_mask():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False).eval()
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    batch, seq = Dim("batch"), Dim("seq")
    resized_mask = torch.tensor([[False] * 9, [False] * 5 + [True] * 4, [False] * 8 + [True]])
    assert_exports_equivalent(
        lambda src, key_padding_mask: model(src, src_key_padding_mask=key_padding_mask),
        (x, mask), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
        resized=[(torch.randn(3, 9, 16), resized_mask)], atol=1e-4,
    )


def test_gpt2_from_tiny_transformers_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4, use_cache=False
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    input_ids = torch.randint(0, 128, (2, 12))
    resized = torch.randint(0, 128, (3, 20))
    program = assert_exports_equivalent(
        model, (input_ids,), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq", max=64)},),
        resized=[(resized,)], atol=1e-4,
    )
    assert [v.name for v in program.model.graph.inputs] == ["input_ids"]


def test_examples_main_verifies_every_example(tmp_path, capsys):
    assert examples_main(["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in EXAMPLES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.onnx" for name in EXAMPLES)


def test_llama_from_tiny_transformers_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    assert_exports_equivalent(
        model, (torch.randint(0, 128, (2, 12)),), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq", max=256)},),
        resized=[(torch.randint(0, 128, (3, 20)),)], atol=1e-4,
    )
