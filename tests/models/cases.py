"""The model suite's models as cases the runtime and opset tests share: each a model, the calls
to check it at (the first is the export example, the others resize its dynamic dims) and its
``dynamic_shapes``, built from the suite's own definitions (the shipped examples,
tests/models/test_nn_blocks.py, families.py, test_transformers.py and test_torchvision.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dynexport.examples import EXAMPLES
from tests.models.test_nn_blocks import Cells, Tagger, UNet

Dim = torch.export.Dim

__all__ = ["CASES", "HEAVY_CASES", "Case"]


@dataclass(frozen=True)
class Case:
    model: Any
    calls: list[tuple[tuple, dict]]  # the first is the export example
    dynamic_shapes: Any
    atol: float = 1e-4

    @property
    def resized(self) -> list[tuple[tuple, dict]]:
        return self.calls[1:]


def _example(name: str) -> Callable[[], Case]:
    def build() -> Case:
        model, args, dynamic_shapes, resized = EXAMPLES[name]()
        return Case(model, [(args, {}), (resized, {})], dynamic_shapes)

    return build


def lstm_gru_tagger() -> Case:
    torch.manual_seed(0)
    calls = [((torch.randint(0, 50, size),), {}) for size in [(2, 7), (3, 12), (1, 3)]]
    return Case(Tagger().eval(), calls, ({0: Dim("batch"), 1: Dim("steps")},), atol=1e-5)


def recurrent_cells() -> Case:
    torch.manual_seed(0)
    calls = [((torch.randn(b, 5), torch.randn(b, 6), torch.randn(b, 6)), {}) for b in (2, 5, 1)]
    batch = Dim("batch")
    return Case(Cells().eval(), calls, ({0: batch}, {0: batch}, {0: batch}), atol=1e-5)


def unet() -> Case:
    torch.manual_seed(0)
    calls = [((torch.randn(b, 3, h, w),), {}) for b, (h, w) in zip([2, 3, 1], [(16, 16), (24, 32), (12, 20)])]
    dims = {0: Dim("batch"), 2: 4 * Dim("height_blocks", min=2, max=32), 3: 4 * Dim("width_blocks", min=2, max=32)}
    return Case(UNet().eval(), calls, (dims,))


TEXT_SIZES = [(2, 7), (3, 11), (1, 16)]  # (batch, sequence): the first is the export size


def encoder(family: str) -> Callable[[], Case]:
    def build() -> Case:
        from tests.models.families import ENCODERS, text_dims, text_inputs

        torch.manual_seed(0)
        calls = [((), text_inputs(b, s)) for b, s in TEXT_SIZES]
        return Case(ENCODERS[family]().eval(), calls, text_dims(["input_ids", "attention_mask"]))

    return build


def decoder_with_kv_cache(family: str) -> Callable[[], Case]:
    """A decoder LM fed past keys and values as plain tensors (as tests/models/test_transformers.py
    checks it): batch, new tokens and past length dynamic."""

    def build() -> Case:
        from tests.models.families import DECODERS
        from tests.models.test_transformers import _cached_inputs, _WithPlainCache

        torch.manual_seed(0)
        model = DECODERS[family](True).eval()
        calls = [((), _cached_inputs(model, *sizes)) for sizes in [(2, 5, 3), (3, 9, 1), (1, 2, 4)]]
        batch, past, seq = Dim("batch"), Dim("past", min=1, max=32), Dim("seq", min=1, max=16)
        layers = len(calls[0][1]["past_key_values"])
        dynamic_shapes = {
            "input_ids": {0: batch, 1: seq},
            "attention_mask": {0: batch, 1: Dim.DYNAMIC},
            "past_key_values": [({0: batch, 2: past}, {0: batch, 2: past})] * layers,
        }
        return Case(_WithPlainCache(model), calls, dynamic_shapes)

    return build


def encoder_decoder(family: str) -> Callable[[], Case]:
    def build() -> Case:
        from tests.models.families import text_inputs
        from tests.models.test_transformers import _SEQ2SEQ

        torch.manual_seed(0)
        calls = []
        for (b, s), target in zip(TEXT_SIZES, [5, 2, 9]):
            inputs = text_inputs(b, s)
            inputs["decoder_input_ids"] = text_inputs(b, target, mask=False)["input_ids"]
            calls.append(((), inputs))
        batch, seq, target = Dim("batch"), Dim("seq", min=2, max=32), Dim("target", min=2, max=32)
        dims = {
            "input_ids": {0: batch, 1: seq},
            "attention_mask": {0: batch, 1: seq},
            "decoder_input_ids": {0: batch, 1: target},
        }
        return Case(_SEQ2SEQ[family]().eval(), calls, dims)

    return build


def torchvision_classifier(name: str) -> Callable[[], Case]:
    """A torchvision classifier, its BatchNorms calibrated (as tests/models/test_torchvision.py
    does), batch and image sides dynamic; compared within 1e-3 of its largest logit."""

    def build() -> Case:
        from tests.models.test_torchvision import calibrated
        from tests.torchvision_ops import load_torchvision

        torch.manual_seed(0)
        model = calibrated(getattr(load_torchvision().models, name)(weights=None), torch.rand(4, 3, 64, 64))
        calls = [((torch.rand(*size),), {}) for size in [(2, 3, 64, 64), (3, 3, 96, 80)]]
        with torch.no_grad():
            scale = max(float(model(*args).abs().max()) for args, _ in calls)
        sides = {2: Dim("height", min=64, max=512), 3: Dim("width", min=64, max=512)}
        return Case(model, calls, ({0: Dim("batch"), **sides},), atol=1e-3 * scale)

    return build


# Quick to export (a few seconds at most each): the shipped examples, torch.nn blocks, a tiny
# BERT and a tiny GPT-2 with its KV cache.
CASES: dict[str, Callable[[], Case]] = {
    **{name: _example(name) for name in EXAMPLES},
    "lstm_gru_tagger": lstm_gru_tagger,
    "recurrent_cells": recurrent_cells,
    "unet": unet,
    "bert": encoder("bert"),
    "gpt2_kv_cache": decoder_with_kv_cache("gpt2"),
}

# The rest of the transformers families and torchvision's ResNet-18 (slow where tests use them).
HEAVY_CASES: dict[str, Callable[[], Case]] = {
    **{family: encoder(family) for family in ["roberta", "distilbert", "albert", "electra"]},
    **{
        f"{family}_kv_cache": decoder_with_kv_cache(family)
        for family in ["gpt_neox", "opt", "llama", "mistral", "qwen2", "phi", "gemma"]
    },
    "t5": encoder_decoder("t5"),
    "bart": encoder_decoder("bart"),
    "resnet18": torchvision_classifier("resnet18"),
}
