"""Random-number rules: shapes, dtypes, ranges and statistics (never values: ONNX draws from its
own generator). Every statistic is checked within ``Z`` of its standard error at the sample's
size, so a correct rule fails a check by chance about once in 500 million runs, while a wrong
scale or offset (a variance used as a deviation, a rate off by a few percent) is still far
outside."""

from __future__ import annotations

import math

import onnx
import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import dynexport
from tests.equivalence import op_histogram

aten = torch.ops.aten
B = torch.export.Dim("batch")
ROWS = 4000
Z = 6.0


def _samples(fn, *inputs, batches=(3, 8), **options):
    """Export ``fn`` with a dynamic batch (the first dim of ``inputs``), run it at each batch in
    ``batches`` (rows repeated), and check every output's shape and dtype against PyTorch's.
    Returns the program and the outputs of the last run (at the last batch)."""
    program = dynexport.export(fn, inputs, dynamic_shapes=tuple({0: B} for _ in inputs), **options)
    onnx.checker.check_model(program.model_proto, full_check=True)
    for batch in batches:
        resized = tuple(x[torch.arange(batch) % x.shape[0]] for x in inputs)
        expected, actual = fn(*resized), program(*resized)
        for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected), strict=True):
            assert (a.shape, a.dtype) == (e.shape, e.dtype)
    return program, actual


def _near(statistic, expected: float, standard_error: float):
    assert abs(float(statistic) - expected) < Z * standard_error, (float(statistic), expected, standard_error)


def _rate(hits: torch.Tensor, p: float):
    """``hits`` (booleans) occur at rate ``p``."""
    _near(hits.double().mean(), p, math.sqrt(p * (1 - p) / hits.numel()))


def _unit_uniform(x: torch.Tensor, low=0.0, high=1.0):
    x = x.double()
    assert low <= x.min() and x.max() < high
    width, n = high - low, x.numel()
    _near(x.mean(), (low + high) / 2, width / math.sqrt(12 * n))
    # Var(sample variance) = (mu4 - sigma^4) / n, with mu4 = width^4 / 80 for a uniform.
    _near(x.var(), width**2 / 12, width**2 * math.sqrt((1 / 80 - 1 / 144) / n))


def _standard_normal(x: torch.Tensor, mean=0.0, std=1.0):
    x = x.double()
    n = x.numel()
    _near(x.mean(), mean, std / math.sqrt(n))
    _near(x.std(), std, std / math.sqrt(2 * n))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
def test_rand_and_rand_like(dtype):
    x = torch.zeros(3, ROWS, dtype=dtype)
    program, (a, b) = _samples(lambda x: (torch.rand(x.shape[0], ROWS, dtype=dtype), torch.rand_like(x)), x)
    _unit_uniform(a)
    _unit_uniform(b)
    assert op_histogram(program)["RandomUniformLike"] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_randn_and_randn_like(dtype):
    x = torch.zeros(3, ROWS, dtype=dtype)
    _, (a, b) = _samples(lambda x: (torch.randn(x.shape[0], ROWS, dtype=dtype), torch.randn_like(x)), x)
    _standard_normal(a)
    _standard_normal(b)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float32])
def test_randint(dtype):
    x = torch.zeros(3, ROWS, dtype=dtype)

    def model(x):
        return (
            torch.randint(3, 10, (x.shape[0], ROWS), dtype=dtype),
            torch.randint(6, (x.shape[0], ROWS), dtype=dtype),
            torch.randint_like(x, 2, 5),
            torch.randint_like(x, 4),
        )

    _, outputs = _samples(model, x)
    for sample, (low, high) in zip(outputs, [(3, 10), (0, 6), (2, 5), (0, 4)]):
        counts = torch.bincount(sample.flatten().long() - low, minlength=high - low)
        assert len(counts) == high - low
        p = 1 / (high - low)
        for count in counts:
            _near(count / sample.numel(), p, math.sqrt(p * (1 - p) / sample.numel()))


def test_randint_with_bounds_beyond_float32():
    _, sample = _samples(lambda x: torch.randint(2**40, 2**40 + 5, (x.shape[0], ROWS)), torch.zeros(3, 1))
    assert set(sample.unique().tolist()) == {2**40 + i for i in range(5)}


def test_randperm():
    program, permutation = _samples(lambda x: torch.randperm(x.shape[0]), torch.zeros(4, 1), batches=(30, 200))
    assert sorted(permutation.tolist()) == list(range(200))
    assert permutation.tolist() != list(range(200))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_bernoulli(dtype):
    probabilities = torch.tensor([0.0, 0.2, 0.5, 1.0], dtype=dtype).repeat(ROWS, 1)

    def model(p):
        return torch.bernoulli(p), torch.bernoulli(p, 0.3), torch.zeros_like(p).bernoulli_(p)

    _, samples = _samples(model, probabilities, batches=(ROWS,))
    for sample in samples:
        assert set(sample.unique().tolist()) <= {0.0, 1.0}
    a, b, c = samples
    for sample in (a, c):
        assert sample[:, 0].eq(0).all() and sample[:, 3].eq(1).all()
        _rate(sample[:, 1].eq(1), 0.2)
        _rate(sample[:, 2].eq(1), 0.5)
    _rate(b.eq(1), 0.3)


def test_inplace_bernoulli_and_uniform_and_normal():
    def model(x):
        return x.clone().bernoulli_(0.25), x.clone().uniform_(-2, 3), x.clone().normal_(1.5, 2.0), x.clone().exponential_(2.0)

    _, (b, u, n, e) = _samples(model, torch.zeros(3, ROWS))
    _rate(b.eq(1), 0.25)
    _unit_uniform(u, -2.0, 3.0)
    _standard_normal(n, 1.5, 2.0)
    # Exponential of rate 2: mean and deviation 0.5; Var(sample deviation) = 2 sigma^2 / n.
    assert e.min() >= 0
    _near(e.double().mean(), 0.5, 0.5 / math.sqrt(e.numel()))
    _near(e.double().std(), 0.5, 0.5 * math.sqrt(2 / e.numel()))


def test_normal_overloads():
    means = torch.tensor([-5.0, 0.0, 10.0]).repeat(ROWS, 1)
    stds = torch.tensor([1.0, 0.1, 3.0]).repeat(ROWS, 1)

    def model(mean, std):
        return torch.normal(mean, 2.0), torch.normal(1.0, std), torch.normal(mean, std), torch.normal(2.0, 0.5, size=(mean.shape[0], 3))

    _, (a, b, c, d) = _samples(model, means, stds, batches=(ROWS,))
    for column, (mean, std) in enumerate([(-5.0, 1.0), (0.0, 0.1), (10.0, 3.0)]):
        _standard_normal(a[:, column], mean, 2.0)
        _standard_normal(b[:, column], 1.0, stds[0, column].item())
        _standard_normal(c[:, column], mean, std)
    _standard_normal(d, 2.0, 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_in_training(p, dtype):
    x = torch.full((3, ROWS), 2.0, dtype=dtype)
    x[0, 0] = float("nan")

    def model(x):
        return F.dropout(x, p, training=True), aten.native_dropout(x, p, True), F.dropout2d(x[..., None, None], p, training=True)

    _, (y, (native, mask), channels) = _samples(model, x, batches=(3,))
    if p == 1:
        assert y[:, 1:].eq(0).all() and y[0, 0].isnan() and native.eq(0).all() and not mask.any()
    elif p == 0:
        torch.testing.assert_close(y, x, equal_nan=True)
        torch.testing.assert_close(native, x, equal_nan=True)
        assert mask.all()
    else:
        for sample in (y, native, channels):
            values = sample.double().flatten()[1:]
            kept = values[values != 0]
            torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - p)), rtol=1e-3, atol=0)
            _rate(values == 0, p)
        assert native[:, 1:].eq(0).equal(~mask[:, 1:])


def test_channel_dropout_drops_whole_channels():
    def model(x):
        return F.dropout2d(x, 0.5, training=True), F.dropout3d(x[:, :, None], 0.5, training=True)

    _, outputs = _samples(model, torch.ones(2, 500, 4, 3))
    for sample in outputs:
        per_channel = sample.flatten(2)
        assert (per_channel == per_channel[..., :1]).all()
        _rate(per_channel[..., 0].eq(0), 0.5)


def test_dropout_module_in_training():
    model = torch.nn.Sequential(torch.nn.Linear(8, 2000), torch.nn.Dropout(0.4)).train()
    program, sample = _samples(model, torch.randn(3, 8), training=torch.onnx.TrainingMode.TRAINING)
    _rate(sample.eq(0), 0.4)
    # One ONNX Dropout in training mode, which runtimes know, not a hand-built mask.
    histogram = op_histogram(program)
    assert histogram["Dropout"] == 1 and "RandomUniformLike" not in histogram
    dropout = next(node for node in program.model.graph if node.op_type == "Dropout")
    assert dropout.inputs[2].const_value.numpy().item() is True
