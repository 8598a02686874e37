"""Small example models written for dynexport, and the factories that pair them with inputs.

Each factory returns ``(model, args, dynamic_shapes, resized_args)``: the model in eval mode,
example arguments, the dims to keep dynamic, and arguments of another size to check the
exported model at. ``python -m dynexport.examples`` exports and verifies each of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["EXAMPLES", "AlexNetLike", "TinyGPT", "TinyResNet"]


class AlexNetLike(nn.Module):
    """An AlexNet-shaped classifier: strided convolutions, max pooling, adaptive pooling, an MLP."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(inplace=True),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(32 * 4, 64), nn.ReLU(inplace=True), nn.Linear(64, num_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(images)), 1))


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm and a skip connection."""

    def __init__(self, channels_in: int, channels_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or channels_in != channels_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class TinyResNet(nn.Module):
    """A ResNet-like image classifier (stem, three stages of basic blocks, global pooling)."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, width * 2, stride=2)
        self.layer3 = BasicBlock(width * 2, width * 4, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width * 4, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(images))))
        return self.fc(torch.flatten(self.pool(x), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, dim))


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-like decoder-only language model: token and position embeddings, pre-norm causal
    attention blocks, a tied language-model head."""

    def __init__(self, vocab: int = 128, dim: int = 32, heads: int = 4, layers: int = 2, max_len: int = 64):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tokens.weight
        nn.init.normal_(self.tokens.weight, std=1 / math.sqrt(dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _randomize_batch_norm(model: nn.Module) -> nn.Module:
    """Give batch norms non-trivial statistics, so that exporting them is really tested."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
    return model


def mlp() -> tuple[nn.Module, tuple, Any, tuple]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 4)
    ).eval()
    return model, (torch.randn(8, 16),), ({0: torch.export.Dim("batch")},), (torch.randn(3, 16),)


def alexnet_like() -> tuple[nn.Module, tuple, Any, tuple]:
    torch.manual_seed(0)
    return (
        AlexNetLike().eval(),
        (torch.randn(2, 3, 64, 64),),
        ({0: torch.export.Dim("batch")},),
        (torch.randn(5, 3, 64, 64),),
    )


def transformer_encoder() -> tuple[nn.Module, tuple, Any, tuple]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    return model, (torch.randn(2, 10, 32),), ({0: batch, 1: seq},), (torch.randn(3, 7, 32),)


def tiny_resnet() -> tuple[nn.Module, tuple, Any, tuple]:
    torch.manual_seed(0)
    model = _randomize_batch_norm(TinyResNet()).eval()
    batch, height, width = torch.export.Dim("batch"), torch.export.Dim("height", min=8), torch.export.Dim("width", min=8)
    return (
        model,
        (torch.randn(2, 3, 32, 32),),
        ({0: batch, 2: height, 3: width},),
        (torch.randn(3, 3, 40, 24),),
    )


def tiny_gpt() -> tuple[nn.Module, tuple, Any, tuple]:
    torch.manual_seed(0)
    model = TinyGPT().eval()
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)
    return (
        model,
        (torch.randint(0, 128, (2, 16)),),
        ({0: batch, 1: seq},),
        (torch.randint(0, 128, (3, 40)),),
    )


EXAMPLES: dict[str, Callable[[], tuple[nn.Module, tuple, Any, tuple]]] = {
    "mlp": mlp,
    "alexnet_like": alexnet_like,
    "tiny_resnet": tiny_resnet,
    "transformer_encoder": transformer_encoder,
    "tiny_gpt": tiny_gpt,
}
