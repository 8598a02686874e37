"""A representative set of rules exported at opsets 13 to 16 and run in onnxruntime, so that the
forms the table picks below opset 17 (reduction axes as attributes, Pad and Resize over every
dim, Split by output count, Shape sliced, Reshape without allowzero, LayerNormalization, Trilu,
HardSwish, Mish and the Bitwise ops written out) stay verified without running every op test
at each of them. tests/ops and tests/property run everything at the default opset and at 17."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynexport
from dynexport.errors import OpsetTooLowError
from tests.equivalence import BATCH, assert_batch_dynamic_equivalent, op_histogram

LOW_OPSETS = [13, 14, 15, 16]


@pytest.fixture(autouse=True)
def tested_opset():
    # Each test here names its opset: the op tests' parametrization over opsets does not apply.
    yield None


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = F.max_pool2d(F.hardswish(self.norm(self.conv(x))), 2)
        x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class SmallTransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.feed_forward = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x):
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        x = x + self.attention(x, x, x, attn_mask=mask, need_weights=False)[0]
        return self.norm(x + self.feed_forward(x))


def _reductions(x):
    return (
        x.sum(1), x.mean((1, 2), keepdim=True), x.amax(-1), x.argmin(1), x.var(2), x.norm(dim=1),
        torch.logsumexp(x, 2), x.prod(1), torch.cumprod(x, 2), torch.std_mean(x, 1)[0],
    )


def _shapes_and_indices(x):
    a, b = torch.chunk(x, 2, dim=2)
    return (
        F.glu(x, 2), a * b, torch.tril(x, -1), x.triu(1), x.reshape(x.shape[0], -1), x.flatten(1)[:, 2:7],
        x.sort(-1).values, torch.mode(x, 1), x.median(2).values, x.topk(2, dim=1).indices,
    )


def _padding_and_resizing(x):
    return (
        F.pad(x, (1, 2), mode="reflect"), F.pad(x, (2, 1, 1, 0), value=3.0), F.pad(x, (1, 1), mode="replicate"),
        F.pad(x, (2, 1), mode="circular"), F.interpolate(x, size=7, mode="nearest"),
        F.interpolate(x, scale_factor=1.5, mode="linear"),
    )


def _integer_ops(i, j):
    return i & j, i | j, i ^ j, ~i, i >> 2, i << 1, torch.relu(i), torch.clamp(i, -3, 4), i.abs().amax(1)


def _grid_sample(x, grid):
    # GridSample exists from opset 16: below it the node decomposes.
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _activations(x):
    return F.mish(x), F.hardswish(x), F.gelu(x, approximate="tanh"), F.silu(x), F.elu(x), torch.softmax(x, -1)


CASES = {
    "cnn": (SmallCNN().eval(), lambda: (torch.randn(2, 3, 8, 8),)),
    "transformer_block": (SmallTransformerBlock().eval(), lambda: (torch.randn(2, 5, 16),)),
    "reductions": (_reductions, lambda: (torch.rand(2, 4, 6) + 0.5,)),
    "shapes_and_indices": (_shapes_and_indices, lambda: (torch.randn(2, 4, 6),)),
    "padding_and_resizing": (_padding_and_resizing, lambda: (torch.randn(2, 3, 5),)),
    "integer_ops": (_integer_ops, lambda: (torch.randint(-50, 50, (2, 6)), torch.randint(-50, 50, (2, 6)))),
    "activations": (_activations, lambda: (torch.randn(2, 7) * 3,)),
    # Add, Sub and Mul take 8- and 16-bit integers from opset 14 (their products wrap around).
    "narrow_integers": (
        lambda a, b: (a + b, a - b, a * b, torch.add(a, b, alpha=3), ~a),
        lambda: tuple(torch.randint(-128, 128, (2, 9), dtype=torch.int8) for _ in range(2)),
    ),
    "grid_sample": (_grid_sample, lambda: (torch.randn(2, 3, 5, 6), torch.rand(2, 4, 4, 2) * 2.4 - 1.2)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("opset", LOW_OPSETS)
def test_representative_rules_at_low_opsets(opset, name):
    torch.manual_seed(0)
    model, inputs = CASES[name]
    program = assert_batch_dynamic_equivalent(model, *inputs(), opset_version=opset, runtime="onnxruntime")
    assert program.model.opset_imports[""] == opset


@pytest.mark.parametrize("opset", LOW_OPSETS)
def test_forms_picked_below_their_opsets(opset):
    def model(x):
        return F.layer_norm(x, (6,)), x.amax(1), F.mish(x), torch.tril(x), torch.chunk(x, 2, 1)[1]

    ops = op_histogram(dynexport.export(model, (torch.randn(2, 6),), opset_version=opset))
    assert "LayerNormalization" not in ops and "Mish" not in ops
    assert ("Trilu" in ops) == (opset >= 14)
    assert "ReduceMax" in ops


def test_an_op_of_a_later_opset_is_refused_with_the_opset_that_has_it():
    def model(x):
        counts = torch.zeros(4).scatter_reduce(0, x, torch.ones(6), reduce="sum")
        return counts

    with pytest.raises(OpsetTooLowError, match=r"opset_version=16") as raised:
        dynexport.export(model, (torch.tensor([0, 1, 1, 3, 0, 1]),), opset_version=15)
    assert raised.value.min_opset == 16
    assert "reduction" in str(raised.value)


def test_batch_dynamic_at_opset_13_with_empty_batches():
    # Reshape takes allowzero from opset 14: below it a batch of 0 still reshapes to zeros.
    def model(x):
        return x.reshape(x.shape[0], 2, 3) * 2, x.flatten(0, 1)

    program = dynexport.export(model, (torch.randn(3, 6),), opset_version=13, dynamic_shapes=({0: BATCH},))
    for batch in (0, 1, 4):
        x = torch.randn(batch, 6)
        for actual, expected in zip(program(x), model(x)):
            assert actual.shape == expected.shape
            torch.testing.assert_close(actual, expected)
