"""transformers model families from tiny configs (random weights, nothing downloaded), each
exported with dynamic batch and sequence (or image, or audio) dims and checked in onnxruntime at
the export size and at three other sizes, so that a size baked into the graph cannot pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.equivalence import assert_exports_equivalent

transformers = pytest.importorskip("transformers")

from tests.models.families import (  # noqa: E402  (after the importorskip)
    DECODERS,
    ENCODERS,
    VOCAB,
    text_dims,
    text_inputs,
    tiny,
)

Dim = torch.export.Dim

TEXT_SIZES = [(2, 7), (3, 11), (1, 16), (4, 4)]  # (batch, sequence): the first is the export size
IMAGE_SIZES = [2, 3, 1, 4]  # batches: images keep the size the config was made for
ATOL = 1e-4


def _check(model, calls: list[dict[str, torch.Tensor]], dynamic_shapes: dict[str, Any], atol: float = ATOL):
    """Export ``model(**calls[0])`` with ``dynamic_shapes`` and compare with eager PyTorch at
    every call's inputs."""
    return assert_exports_equivalent(
        model, (), calls[0], dynamic_shapes=dynamic_shapes, resized=[((), c) for c in calls[1:]], atol=atol
    )


# -- encoders ---------------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(ENCODERS))
def test_encoder_with_padding_mask(family):
    torch.manual_seed(0)
    model = ENCODERS[family]().eval()
    calls = [text_inputs(b, s) for b, s in TEXT_SIZES]
    _check(model, calls, text_dims(["input_ids", "attention_mask"]))


# -- decoder language models ------------------------------------------------------------------

@pytest.mark.parametrize("family", list(DECODERS))
def test_decoder_lm(family):
    torch.manual_seed(0)
    model = DECODERS[family](False).eval()
    calls = [text_inputs(b, s) for b, s in TEXT_SIZES]
    _check(model, calls, text_dims(["input_ids", "attention_mask"]))


class _WithPlainCache(torch.nn.Module):
    """A decoder LM whose past keys and values come in, and go out, as plain tensors (one
    ``(key, value)`` pair per layer) instead of a ``DynamicCache`` object."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, past_key_values):
        cache = transformers.DynamicCache(past_key_values, config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        return out.logits, [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def _cached_inputs(model, batch: int, past: int, seq: int) -> dict[str, Any]:
    """New tokens, a mask over past and new positions (the last row left-padded), and random past
    keys and values shaped like the model's own cache."""
    with torch.no_grad():
        probe = model(input_ids=torch.ones(1, 1, dtype=torch.int64), use_cache=True).past_key_values
    generator = torch.Generator().manual_seed(batch * 1000 + past * 10 + seq)
    past_key_values = []
    for layer in probe.layers:
        _, heads, _, head_size = layer.keys.shape
        past_key_values.append(tuple(torch.randn(batch, heads, past, head_size, generator=generator) for _ in "kv"))
    attention_mask = torch.ones(batch, past + seq, dtype=torch.int64)
    attention_mask[-1, : past // 2] = 0
    return {
        "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator),
        "attention_mask": attention_mask,
        "past_key_values": past_key_values,
    }


@pytest.mark.parametrize("family", list(DECODERS))
def test_decoder_lm_with_kv_cache(family):
    torch.manual_seed(0)
    model = DECODERS[family](True).eval()
    calls = [_cached_inputs(model, *sizes) for sizes in [(2, 5, 3), (3, 9, 1), (1, 2, 4), (4, 12, 2)]]
    batch, past, seq = Dim("batch"), Dim("past", min=1, max=32), Dim("seq", min=1, max=16)
    layers = len(calls[0]["past_key_values"])
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},  # past + seq: torch.export derives it
        "past_key_values": [({0: batch, 2: past}, {0: batch, 2: past})] * layers,
    }
    program = _check(_WithPlainCache(model), calls, dynamic_shapes)
    present_key = program.model.graph.outputs[1]
    assert str(present_key.shape[2]) == "past + seq"


# -- encoder-decoders -------------------------------------------------------------------------

def _seq2seq_inputs(batch: int, seq: int, target: int) -> dict[str, torch.Tensor]:
    inputs = text_inputs(batch, seq)
    inputs["decoder_input_ids"] = text_inputs(batch, target, mask=False)["input_ids"]
    return inputs


_SEQ2SEQ: dict[str, Callable[[], Any]] = {
    "t5": lambda: transformers.T5ForConditionalGeneration(tiny(
        transformers.T5Config, vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, use_cache=False,
    )),
    "bart": lambda: transformers.BartForConditionalGeneration(tiny(
        transformers.BartConfig, vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64, use_cache=False,
    )),
}


@pytest.mark.parametrize("family", list(_SEQ2SEQ))
def test_encoder_decoder(family):
    torch.manual_seed(0)
    model = _SEQ2SEQ[family]().eval()
    calls = [_seq2seq_inputs(b, s, t) for (b, s), t in zip(TEXT_SIZES, [5, 2, 9, 3])]
    batch, seq, target = Dim("batch"), Dim("seq", min=2, max=32), Dim("target", min=2, max=32)
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}, "decoder_input_ids": {0: batch, 1: target},
    }
    _check(model, calls, dynamic_shapes)


def test_whisper():
    """Whisper's encoder insists on its configured number of audio frames; batch and the decoder's
    sequence are dynamic."""
    torch.manual_seed(0)
    config = tiny(
        transformers.WhisperConfig, vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32, use_cache=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )
    model = transformers.WhisperForConditionalGeneration(config).eval()
    calls = [
        {"input_features": torch.randn(b, 16, 32), "decoder_input_ids": torch.randint(1, VOCAB, (b, t))}
        for b, t in [(2, 5), (3, 2), (1, 9), (4, 3)]
    ]
    batch, target = Dim("batch"), Dim("target", min=2, max=32)
    _check(model, calls, {"input_features": {0: batch}, "decoder_input_ids": {0: batch, 1: target}})


# -- vision -----------------------------------------------------------------------------------

_VISION: dict[str, tuple[Callable[[], Any], int, list[int]]] = {
    # family: (model factory, channels, image sides: the export size, then three others)
    "resnet": (lambda: transformers.ResNetModel(tiny(
        transformers.ResNetConfig, num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
        layer_type="bottleneck",
    )), 3, [32, 40, 24, 57]),
    "convnext": (lambda: transformers.ConvNextModel(tiny(
        transformers.ConvNextConfig, num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
    )), 3, [32, 40, 24, 64]),
}


@pytest.mark.parametrize("family", list(_VISION))
def test_vision_backbone(family):
    factory, channels, sides = _VISION[family]
    torch.manual_seed(0)
    model = factory().eval()
    calls = [{"pixel_values": torch.randn(b, channels, side, side)} for b, side in zip(IMAGE_SIZES, sides)]
    dims = {0: Dim("batch"), 2: Dim("height", min=16, max=128), 3: Dim("width", min=16, max=128)}
    _check(model, calls, {"pixel_values": dims})


class _Detections(torch.nn.Module):
    """DETR's class logits and boxes (its output object holds more)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return out.logits, out.pred_boxes


def test_detr_with_a_resnet_backbone():
    # Pure PyTorch: transformers' own ResNet as the backbone, not timm's.
    backbone = tiny(transformers.ResNetConfig, embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], out_features=["stage4"])
    config = tiny(
        transformers.DetrConfig, use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False,
        backbone=None, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, num_labels=3,
    )
    model = _Detections(transformers.DetrForObjectDetection(config)).eval()
    height, width = Dim("height_blocks", min=2, max=8), Dim("width_blocks", min=2, max=8)
    sizes = [(2, 64, 64), (3, 96, 64), (1, 64, 128), (4, 128, 96)]
    calls = [{"pixel_values": torch.randn(b, 3, h, w)} for b, h, w in sizes]
    _check(model, calls, {"pixel_values": {0: Dim("batch"), 2: 32 * height, 3: 32 * width}})


def test_mobilenet_v2():
    """Images above 32 pixels: at 32 or fewer the last feature map is 1x1, and torch.export
    specializes size-1 dims (a contiguity check in torch's own tracing)."""
    torch.manual_seed(0)
    config = tiny(transformers.MobileNetV2Config, num_channels=3, image_size=64, depth_multiplier=0.25, tf_padding=False)
    model = transformers.MobileNetV2Model(config).eval()
    calls = [{"pixel_values": torch.randn(b, 3, side, side + 8)} for b, side in zip(IMAGE_SIZES, [64, 40, 33, 97])]
    dims = {0: Dim("batch"), 2: Dim("height", min=33, max=256), 3: Dim("width", min=33, max=256)}
    _check(model, calls, {"pixel_values": dims})


def test_swin():
    """Swin pads feature maps to whole windows in a Python branch, so one graph serves the image
    sides that need no padding: multiples of 16 here (patch 4, window 2, two stages). Square
    images: torch.export's guard solving takes seconds per independent derived dim."""
    torch.manual_seed(0)
    config = tiny(
        transformers.SwinConfig, image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1],
        num_heads=[2, 4], window_size=2,
    )
    model = transformers.SwinModel(config).eval()
    calls = [{"pixel_values": torch.randn(b, 3, side, side)} for b, side in zip(IMAGE_SIZES, [32, 48, 64, 96])]
    side = 16 * Dim("side_blocks", min=2, max=8)
    dims = {0: Dim("batch"), 2: side, 3: side}
    _check(model, calls, {"pixel_values": dims})


def test_vit_interpolates_position_embeddings():
    """ViT skips the interpolation at its configured image size (a Python branch); the configured
    size (8) lies outside the exported range so that every size in it interpolates."""
    torch.manual_seed(0)
    config = tiny(
        transformers.ViTConfig, image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    )
    model = transformers.ViTModel(config, add_pooling_layer=True).eval()
    calls = [
        {"pixel_values": torch.randn(b, 3, side, side), "interpolate_pos_encoding": True}
        for b, side in zip(IMAGE_SIZES, [16, 24, 32, 20])
    ]
    dims = {0: Dim("batch"), 2: 4 * Dim("height_patches", min=3, max=16), 3: 4 * Dim("width_patches", min=3, max=16)}
    _check(model, calls, {"pixel_values": dims, "interpolate_pos_encoding": None})


# -- audio and multimodal -----------------------------------------------------------------------

def test_wav2vec2():
    torch.manual_seed(0)
    config = tiny(
        transformers.Wav2Vec2Config, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, do_stable_layer_norm=True,
        feat_extract_norm="layer",
    )
    model = transformers.Wav2Vec2ForCTC(config).eval()
    calls = [{"input_values": torch.randn(b, n)} for b, n in zip(IMAGE_SIZES, [400, 560, 333, 5000])]
    # The feature extractor's frame count leaves a guard that torch's solver bounds by a multiple
    # of 20; the export keeps every size from the minimum it needs.
    with pytest.warns(UserWarning, match="dynamic_shapes refined: samples: min=60"):
        _check(model, calls, {"input_values": {0: Dim("batch"), 1: Dim("samples")}})


def test_clip():
    """Text and images in separate batches; the text sequence is dynamic."""
    torch.manual_seed(0)
    config = tiny(
        transformers.CLIPConfig,
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=32),
        vision_config=dict(image_size=16, patch_size=4, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4),
        projection_dim=16,
    )
    model = transformers.CLIPModel(config).eval()
    calls = [
        {**text_inputs(texts, seq), "pixel_values": torch.randn(images, 3, 16, 16)}
        for (texts, seq), images in zip(TEXT_SIZES, [3, 1, 2, 5])
    ]
    texts, seq, images = Dim("texts"), Dim("seq", min=2, max=32), Dim("images")
    dynamic_shapes = {"input_ids": {0: texts, 1: seq}, "attention_mask": {0: texts, 1: seq}, "pixel_values": {0: images}}
    _check(model, calls, dynamic_shapes)
