"""A ModuleList of like layers traced once (dynexport/repeated_layers.py): the copied graph is the
one a full capture gives and computes what PyTorch does at other sizes; each check that fails
captures the model in full, which still exports it right."""

from __future__ import annotations

import pytest
import torch

import dynexport
from tests.equivalence import assert_close, assert_exports_equivalent, op_histogram

Dim = torch.export.Dim
LAYERS = 8


def _traced_once(program: dynexport.ONNXProgram) -> str | None:
    """What the capture says it traced ("<list>: 2 of 8 layers traced, 6 copied"), None when it
    traced every layer."""
    parts = program.capture_strategy.split("; ")
    return "; ".join(parts[1:]) or None


def _graph_facts(program: dynexport.ONNXProgram) -> tuple:
    graph = program.model.graph
    return len(graph), op_histogram(program), [v.name for v in graph.inputs], [v.name for v in graph.outputs]


def _layers_in_graph(program: dynexport.ONNXProgram, path: str) -> set[int]:
    """The layers of the list at ``path`` that ONNX nodes name as their module."""
    prefix = f"{path}."
    return {
        int(module[len(prefix):].split(".")[0])
        for node in program.model.graph
        if (module := node.metadata_props.get("pkg.dynexport.module", "")).startswith(prefix)
    }


# -- hand-written layers ------------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(
        self, layer_idx: int, scale: float = 1.0, branch_at: int | None = None, pair: bool = False, log: bool = False
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.norm = torch.nn.LayerNorm(16)
        self.linear = torch.nn.Linear(16, 16)
        self.scale = scale
        self.branch_at = branch_at
        self.pair = pair
        self.log = log

    def forward(self, hidden, gate, step=0, seen=None):
        out = hidden + self.scale * torch.tanh(self.linear(self.norm(hidden))) * gate + step
        if self.branch_at is not None and self.layer_idx == self.branch_at:
            out = out * 2
        if self.log:
            seen.append(out.mean())
        return (out, out.mean()) if self.pair else out


class Stack(torch.nn.Module):
    """Blocks applied in turn to an embedding, with one gate tensor shared by all."""

    def __init__(self, blocks, *, steps=False, halve_at=None, collect=False):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList(blocks)
        self.head = torch.nn.Linear(16, 4)
        self.steps, self.halve_at, self.collect = steps, halve_at, collect

    def forward(self, x):
        hidden = self.embed(x)
        gate = torch.sigmoid(x[..., :1])
        outputs, seen = [], []
        for index, block in enumerate(self.blocks):
            if index == self.halve_at:
                hidden = hidden * 0.5
            hidden = block(hidden, gate, index, seen) if self.steps else block(hidden, gate, seen=seen)
            if isinstance(hidden, tuple):
                hidden = hidden[0] + hidden[1]
            outputs.append(hidden)
        logits = self.head(hidden) + sum(seen, torch.zeros(()))
        return (logits, torch.stack(outputs)) if self.collect else logits


def _stack(**options) -> Stack:
    torch.manual_seed(0)
    block_options = {k: options.pop(k) for k in ("branch_at", "pair", "log") if k in options}
    scales = options.pop("scales", {})
    blocks = [Block(i, scale=scales.get(i, 1.0), **block_options) for i in range(LAYERS)]
    return Stack(blocks, **options).eval()


def _export_stack(model: Stack, **options) -> dynexport.ONNXProgram:
    batch, seq = Dim("batch"), Dim("seq")
    return assert_exports_equivalent(
        model, (torch.randn(2, 5, 8),), dynamic_shapes=({0: batch, 1: seq},),
        resized=[(torch.randn(3, 7, 8),), (torch.randn(1, 2, 8),)], **options,
    )


def test_like_layers_are_traced_once_and_copied():
    model = _stack()
    program = _export_stack(model)
    assert _traced_once(program) == "blocks: 2 of 8 layers traced, 6 copied"
    full = _export_stack(model, trace_layers_once=False)
    assert _traced_once(full) is None
    assert _graph_facts(program) == _graph_facts(full)
    assert _layers_in_graph(program, "blocks") == set(range(LAYERS))
    # The program kept is the full model's.
    x = torch.randn(3, 4, 8)
    torch.testing.assert_close(program.exported_program.module()(x), model(x))


def test_layer_outputs_read_by_the_model_are_each_layers():
    program = _export_stack(_stack(collect=True))
    assert _traced_once(program) == "blocks: 2 of 8 layers traced, 6 copied"


def test_a_first_layer_unlike_the_others_is_traced_with_the_next_two():
    program = _export_stack(_stack(scales={0: 0.5}))
    assert _traced_once(program) == "blocks: 3 of 8 layers traced, 5 copied"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"scales": {5: 0.5}}, id="a-later-layer-unlike"),
        pytest.param({"branch_at": 5}, id="a-branch-on-layer_idx"),
        pytest.param({"steps": True}, id="an-argument-that-differs-per-layer"),
        pytest.param({"halve_at": 5}, id="the-model-changes-the-hidden-state-between-layers"),
        pytest.param({"pair": True}, id="layers-returning-more-than-the-hidden-state"),
        pytest.param({"log": True}, id="layers-appending-to-a-list-they-are-given"),
    ],
)
def test_layers_that_may_differ_are_captured_in_full(options):
    program = _export_stack(_stack(**options))
    assert _traced_once(program) is None


def test_weights_tied_between_some_layers_are_captured_in_full():
    # torch.export lifts each name of a tied weight apart today, so a copy would read layer 5's
    # name; the copies do not depend on that (were two traced layers' ties one input, every
    # copy would read it).
    model = _stack()
    model.blocks[5].linear.weight = model.blocks[4].linear.weight
    assert _traced_once(_export_stack(model)) is None


def test_a_weight_shared_by_all_layers_is_read_by_every_copy():
    model = _stack()
    for block in model.blocks[1:]:
        block.linear.weight = model.blocks[0].linear.weight
    assert _traced_once(_export_stack(model)) == "blocks: 2 of 8 layers traced, 6 copied"


def test_the_option_off_captures_every_layer():
    assert _traced_once(_export_stack(_stack(), trace_layers_once=False)) is None


def test_the_option_is_checked():
    with pytest.raises(TypeError, match="trace_layers_once"):
        dynexport.export(_stack(), (torch.randn(2, 5, 8),), trace_layers_once="yes")


# -- transformers --------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")

from tests.models.families import VOCAB, text_dims, text_inputs, tiny  # after the importorskip
from tests.models.test_transformers import _cached_inputs, _WithPlainCache

_DECODERS = {
    "llama": lambda: transformers.LlamaForCausalLM(tiny(
        transformers.LlamaConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
        intermediate_size=64, num_key_value_heads=2,
    )),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(tiny(
        transformers.Qwen2Config, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
        intermediate_size=64, num_key_value_heads=2,
    )),
    "gpt2": lambda: transformers.GPT2LMHeadModel(tiny(
        transformers.GPT2Config, vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=LAYERS, n_head=4,
        bos_token_id=1, eos_token_id=2,
    )),
}
_LIST_PATHS = {"llama": "model.model.layers", "qwen2": "model.model.layers", "gpt2": "model.transformer.h"}


@pytest.mark.parametrize("family", list(_DECODERS))
def test_decoder_with_a_cache(family):
    torch.manual_seed(0)
    model = _DECODERS[family]().eval()
    calls = [_cached_inputs(model, *sizes) for sizes in [(2, 5, 3), (3, 9, 1), (1, 2, 4)]]
    batch, past, seq = Dim("batch"), Dim("past", min=1, max=32), Dim("seq", min=1, max=16)
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},
        "past_key_values": [({0: batch, 2: past}, {0: batch, 2: past})] * LAYERS,
    }
    wrapped = _WithPlainCache(model)
    program = assert_exports_equivalent(
        wrapped, (), calls[0], dynamic_shapes=dynamic_shapes, resized=[((), c) for c in calls[1:]], atol=1e-4,
        verify=True,
    )
    assert _traced_once(program) == f"{_LIST_PATHS[family]}: 2 of 8 layers traced, 6 copied"
    assert _layers_in_graph(program, _LIST_PATHS[family]) == set(range(LAYERS))
    full = dynexport.export(wrapped, (), kwargs=calls[0], dynamic_shapes=dynamic_shapes, trace_layers_once=False)
    assert _graph_facts(program) == _graph_facts(full)


def test_encoder():
    model = transformers.BertModel(tiny(
        transformers.BertConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )).eval()
    dynamic_shapes = text_dims(["input_ids", "attention_mask"])
    program = assert_exports_equivalent(
        model, (), text_inputs(2, 7), dynamic_shapes=dynamic_shapes, resized=[((), text_inputs(3, 11))], atol=1e-4,
    )
    assert _traced_once(program) == "encoder.layer: 2 of 8 layers traced, 6 copied"
    full = dynexport.export(model, (), kwargs=text_inputs(2, 7), dynamic_shapes=dynamic_shapes, trace_layers_once=False)
    assert _graph_facts(program) == _graph_facts(full)


@pytest.mark.parametrize("new_tokens", [3, 7])
def test_decoder_taking_and_returning_its_cache_object(new_tokens):
    # The cache's tensors are the graph's inputs themselves (no per-layer code builds them).
    # With 7 new tokens torch.export once left one layer's past length a symbol of its own
    # (the slots declared with one Dim), and the layers were captured in full.
    torch.manual_seed(0)
    model = _DECODERS["llama"]().eval()

    def call(batch, past, seq):
        generator = torch.Generator().manual_seed(batch * 100 + past * 10 + seq)
        pairs = [tuple(torch.randn(batch, 2, past, 8, generator=generator) for _ in "kv") for _ in range(LAYERS)]
        return {
            "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator),
            "attention_mask": torch.ones(batch, past + seq, dtype=torch.int64),
            "cache": transformers.DynamicCache(pairs),
        }

    batch, past = Dim("batch"), Dim("past", min=1, max=32)
    slots = [{0: batch, 2: past}] * LAYERS
    dynamic_shapes = {"input_ids": {0: batch, 1: Dim("seq", max=16)}, "attention_mask": {0: batch, 1: Dim.DYNAMIC},
                      "cache": [slots, slots]}
    program = dynexport.export(model, (), kwargs=call(2, 5, new_tokens), dynamic_shapes=dynamic_shapes)
    assert _traced_once(program) == "model.layers: 2 of 8 layers traced, 6 copied"
    for sizes in [(2, 5, 3), (3, 9, 1)]:
        with torch.no_grad():
            expected = model(**call(*sizes))
        actual = program(**call(*sizes))
        assert_close(actual.logits, expected.logits, atol=1e-4, where=f"logits at {sizes}")
        for index, (got, want) in enumerate(zip(actual.past_key_values.layers, expected.past_key_values.layers)):
            assert_close((got.keys, got.values), (want.keys, want.values), atol=1e-4, where=f"layer {index} at {sizes}")
