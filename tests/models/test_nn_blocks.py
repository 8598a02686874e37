"""torch.nn building blocks as whole models, exported with dynamic batch and sequence (or image)
dims and checked in onnxruntime at the export size and three others."""

from __future__ import annotations

import torch
from torch import nn

from tests.equivalence import assert_exports_equivalent, op_histogram

Dim = torch.export.Dim


class Tagger(nn.Module):
    """Embedding, a two-layer bidirectional LSTM and a GRU over its output, a per-step classifier."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.lstm = nn.LSTM(8, 12, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(24, 6, batch_first=True)
        self.head = nn.Linear(6, 5)

    def forward(self, tokens):
        features, _ = self.lstm(self.embed(tokens))
        features, last = self.gru(features)
        return self.head(features), last


def test_recurrent_tagger():
    torch.manual_seed(0)
    model = Tagger().eval()
    sizes = [(2, 7), (3, 12), (1, 3), (4, 1)]
    calls = [(torch.randint(0, 50, size),) for size in sizes]
    program = assert_exports_equivalent(
        model, calls[0], dynamic_shapes=({0: Dim("batch"), 1: Dim("steps")},), resized=calls[1:], atol=1e-5
    )
    histogram = op_histogram(program)
    assert (histogram["LSTM"], histogram["GRU"]) == (2, 1)


class Cells(nn.Module):
    """One step of each recurrent cell, the LSTM cell's state fed to the others."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTMCell(5, 6)
        self.gru = nn.GRUCell(6, 6)
        self.rnn = nn.RNNCell(6, 4, nonlinearity="relu")

    def forward(self, x, h, c):
        h, c = self.lstm(x, (h, c))
        return self.rnn(self.gru(h, c)), c


def test_recurrent_cells():
    torch.manual_seed(0)
    model = Cells().eval()
    calls = [(torch.randn(b, 5), torch.randn(b, 6), torch.randn(b, 6)) for b in (2, 5, 1, 3)]
    batch = Dim("batch")
    program = assert_exports_equivalent(
        model, calls[0], dynamic_shapes=({0: batch}, {0: batch}, {0: batch}), resized=calls[1:], atol=1e-5
    )
    assert not {"LSTM", "GRU", "RNN"} & set(op_histogram(program))  # a step is its gate arithmetic


def test_multihead_attention_with_padding_mask():
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(16, 4, batch_first=True).eval()

    def attend(query, memory, key_padding_mask):
        return attention(query, memory, memory, key_padding_mask=key_padding_mask)

    def inputs(batch, targets, sources):
        mask = torch.zeros(batch, sources, dtype=torch.bool)
        mask[-1, sources // 2:] = True
        return torch.randn(batch, targets, 16), torch.randn(batch, sources, 16), mask

    calls = [inputs(*sizes) for sizes in [(2, 5, 6), (3, 2, 9), (1, 7, 3), (4, 4, 4)]]
    batch, targets, sources = Dim("batch"), Dim("targets"), Dim("sources")
    assert_exports_equivalent(
        attend, calls[0], dynamic_shapes=({0: batch, 1: targets}, {0: batch, 1: sources}, {0: batch, 1: sources}),
        resized=calls[1:], atol=1e-5,
    )


def test_transformer_with_causal_target_mask():
    torch.manual_seed(0)
    model = nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32, batch_first=True
    ).eval()

    def translate(source, target):
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        return model(source, target, tgt_mask=mask, tgt_is_causal=True)

    calls = [(torch.randn(b, s, 16), torch.randn(b, t, 16)) for b, s, t in [(2, 6, 5), (3, 9, 2), (1, 3, 8), (4, 4, 4)]]
    batch = Dim("batch")
    assert_exports_equivalent(
        translate, calls[0], dynamic_shapes=({0: batch, 1: Dim("sources")}, {0: batch, 1: Dim("targets")}),
        resized=calls[1:], atol=1e-4,
    )


class UNet(nn.Module):
    """Two downsampling stages, a bottleneck, and two upsampling stages with skip connections: one
    up-path uses ConvTranspose2d, the other bilinear interpolation to the skip's size."""

    def __init__(self, channels: int = 3, width: int = 8):
        super().__init__()

        def block(c_in, c_out):
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU())

        self.down1, self.down2 = block(channels, width), block(width, 2 * width)
        self.bottleneck = block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.decode2 = block(4 * width, 2 * width)
        self.reduce1 = nn.Conv2d(2 * width, width, 1)
        self.decode1 = block(2 * width, width)
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, images):
        skip1 = self.down1(images)
        skip2 = self.down2(nn.functional.max_pool2d(skip1, 2))
        x = self.bottleneck(nn.functional.max_pool2d(skip2, 2))
        x = self.decode2(torch.cat([self.up2(x), skip2], dim=1))
        x = nn.functional.interpolate(self.reduce1(x), size=skip1.shape[-2:], mode="bilinear", align_corners=False)
        return self.head(self.decode1(torch.cat([x, skip1], dim=1)))


def test_unet():
    """Image sides are multiples of 4 (two 2x2 poolings, undone by a stride-2 ConvTranspose)."""
    torch.manual_seed(0)
    model = UNet().eval()
    sides = [(16, 16), (24, 32), (12, 20), (32, 8)]
    calls = [(torch.randn(b, 3, h, w),) for b, (h, w) in zip([2, 3, 1, 4], sides)]
    dims = {0: Dim("batch"), 2: 4 * Dim("height_blocks", min=2, max=32), 3: 4 * Dim("width_blocks", min=2, max=32)}
    program = assert_exports_equivalent(model, calls[0], dynamic_shapes=(dims,), resized=calls[1:], atol=1e-4)
    histogram = op_histogram(program)
    assert histogram["ConvTranspose"] == 1 and histogram["Resize"] == 1
