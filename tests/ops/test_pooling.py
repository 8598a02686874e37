"""Max, average and adaptive pooling rules against onnxruntime."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.equivalence import (
    assert_exports_equivalent,
    assert_spatial_dynamic_equivalent,
    op_histogram,
)

aten = torch.ops.aten
B = torch.export.Dim("batch")
MAX_POOL = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
AVG_POOL = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
ADAPTIVE_AVG_POOL = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}
ADAPTIVE_MAX_POOL = {1: nn.AdaptiveMaxPool1d, 2: nn.AdaptiveMaxPool2d, 3: nn.AdaptiveMaxPool3d}
# Odd sizes put the last ceil-mode window of kernel 2, stride 2, padding 1 in the padding; even
# ones make a kernel-3, stride-2 window overhang the end.
SPATIAL = {1: (9,), 2: (9, 8), 3: (9, 8, 7)}


def _per_dim(values, n):
    return tuple(values[:n]) if isinstance(values, tuple) else values


def _cases(cases: dict, skip=lambda n, case: False):
    """(n, case) params for 1d, 2d and 3d pooling."""
    return [
        pytest.param(n, case, id=f"{n}d-{name}")
        for n in (1, 2, 3)
        for name, case in cases.items()
        if not skip(n, case)
    ]


MAX_POOL_CASES = {
    "kernel2": dict(kernel_size=2),
    "stride1_pad1": dict(kernel_size=3, stride=1, padding=1),
    "dilation2": dict(kernel_size=3, stride=2, padding=1, dilation=2),
    "ceil": dict(kernel_size=3, stride=2, ceil_mode=True),
    "ceil_window_in_padding": dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
    "ceil_stride_over_kernel": dict(kernel_size=2, stride=3, ceil_mode=True),
    "per_dim": dict(kernel_size=(3, 2, 2), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1)),
}


@pytest.mark.parametrize("return_indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize(("n", "case"), _cases(MAX_POOL_CASES))
def test_max_pool(n, case, return_indices):
    model = MAX_POOL[n](**{k: _per_dim(v, n) for k, v in case.items()}, return_indices=return_indices)
    x = torch.randn(2, 3, *SPATIAL[n])
    # torch.export cannot keep a ceil-mode dim dynamic (its size formula branches on it).
    program = assert_spatial_dynamic_equivalent(model.eval(), x, spatial=not case.get("ceil_mode"))
    assert ("Mod" in op_histogram(program)) == return_indices


def test_max_pool_indices_pick_the_first_of_ties():
    x = torch.randint(0, 2, (2, 3, 8, 8)).float()
    assert_spatial_dynamic_equivalent(nn.MaxPool2d(3, stride=1, padding=1, return_indices=True), x)


AVG_POOL_CASES = {
    "kernel2": dict(kernel_size=2),
    "pad_counted": dict(kernel_size=3, stride=2, padding=1),
    "pad_not_counted": dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    "ceil_overhang": dict(kernel_size=3, stride=2, ceil_mode=True),
    "ceil_pad_counted": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    "ceil_window_in_padding": dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
    "ceil_pad_not_counted": dict(kernel_size=2, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    "divisor_override": dict(kernel_size=3, stride=2, padding=1, divisor_override=5),
    "ceil_divisor_override": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=4),
    "per_dim": dict(kernel_size=(3, 2, 2), stride=(2, 1, 2), padding=(1, 0, 1)),
}


@pytest.mark.parametrize(
    ("n", "case"), _cases(AVG_POOL_CASES, skip=lambda n, case: n == 1 and "divisor_override" in case)
)
def test_avg_pool(n, case):
    model = AVG_POOL[n](**{k: _per_dim(v, n) for k, v in case.items()})
    assert_spatial_dynamic_equivalent(model.eval(), torch.randn(2, 3, *SPATIAL[n]), spatial=not case.get("ceil_mode"))


ADAPTIVE_SIZES = {"global": 1, "divisible": (4, 5, 2), "uneven": (5, 3, 3), "global_and_uneven": (1, 3, 4)}
ADAPTIVE_SPATIAL = {1: (12,), 2: (12, 10), 3: (8, 10, 8)}


@pytest.mark.parametrize("dynamic_spatial", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize(("n", "size"), _cases(ADAPTIVE_SIZES))
def test_adaptive_avg_pool(n, size, dynamic_spatial):
    model = ADAPTIVE_AVG_POOL[n](_per_dim(size, n)).eval()
    program = assert_spatial_dynamic_equivalent(model, torch.randn(2, 3, *ADAPTIVE_SPATIAL[n]), spatial=dynamic_spatial)
    ops, output_size = op_histogram(program), model.output_size
    if output_size in (1, (1,)):
        assert ops == {"GlobalAveragePool": 1}
    elif size == ADAPTIVE_SIZES["divisible"] and not dynamic_spatial:
        assert ops == {"AveragePool": 1}
    else:
        assert ops["MatMul"] == n


@pytest.mark.parametrize("return_indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize(("n", "size"), _cases({"global": 1, "divisible": (4, 5, 2)}))
def test_adaptive_max_pool_evenly_divided(n, size, return_indices):
    model = ADAPTIVE_MAX_POOL[n](_per_dim(size, n), return_indices=return_indices).eval()
    program = assert_spatial_dynamic_equivalent(model, torch.randn(2, 3, *ADAPTIVE_SPATIAL[n]), spatial=False)
    assert op_histogram(program)["MaxPool"] == 1


@pytest.mark.parametrize("dynamic_spatial", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_adaptive_max_pool_uneven_values(n, dynamic_spatial):
    # With dynamic sides each bin's positions are computed from the size (they crashed torch's
    # decomposition, which asks max_pool2d for a kernel of a symbolic size).
    model = ADAPTIVE_MAX_POOL[n](_per_dim((5, 3, 3), n)).eval()
    program = assert_spatial_dynamic_equivalent(model, torch.randn(2, 3, *ADAPTIVE_SPATIAL[n]), spatial=dynamic_spatial)
    assert op_histogram(program)["ReduceMax"] == (2 * n if dynamic_spatial else n)  # and each dim's widest bin


POOLS = {
    "max_pool_indices": nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True, return_indices=True),
    "avg_pool": nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
    "adaptive_avg_pool": nn.AdaptiveAvgPool2d((5, 3)),
    "adaptive_max_pool": nn.AdaptiveMaxPool2d((3, 4), return_indices=True),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
@pytest.mark.parametrize("model", POOLS.values(), ids=POOLS.keys())
def test_pool_dtypes(model, dtype):
    assert_spatial_dynamic_equivalent(model.eval(), torch.randn(2, 3, 9, 8, dtype=dtype), spatial=False)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("return_indices", [False, True], ids=["values", "indices"])
def test_max_pool_small_integers(return_indices, dtype):
    x = torch.randint(0, 100, (2, 3, 9, 8), dtype=dtype)
    assert_spatial_dynamic_equivalent(nn.MaxPool2d(2, ceil_mode=True, return_indices=return_indices), x, spatial=False)


@pytest.mark.parametrize("opset", [20, 22])
@pytest.mark.parametrize(
    "model", [nn.MaxPool2d(2), nn.AvgPool2d(3, 2, 1), nn.AdaptiveAvgPool2d(1)], ids=["max", "avg", "global_avg"]
)
def test_pool_bfloat16(model, opset):
    x = torch.randn(2, 3, 8, 8, dtype=torch.bfloat16)
    program = assert_spatial_dynamic_equivalent(model, x, spatial=False, opset_version=opset)
    # Before opset 22 the pooling ops have no bfloat16: they compute in float32.
    assert ("Cast" in op_histogram(program)) == (opset < 22)


@pytest.mark.parametrize(
    "model",
    [
        nn.MaxPool1d(2, return_indices=True),
        nn.MaxPool2d(3, stride=2, padding=1, return_indices=True),
        nn.MaxPool3d(2),
        nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
        nn.AdaptiveAvgPool2d(1),
        nn.AdaptiveAvgPool2d(3),
        nn.AdaptiveMaxPool2d(4, return_indices=True),
    ],
    ids=[
        "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool2d", "global_avg", "adaptive_avg", "adaptive_max"
    ],
)
def test_unbatched_input(model):
    spatial_rank = 3 if isinstance(model, nn.MaxPool3d) else 1 if isinstance(model, nn.MaxPool1d) else 2
    x = torch.randn(3, *[8] * spatial_rank)
    assert_exports_equivalent(model.eval(), (x,))


class Pools(nn.Module):
    def forward(self, x):
        values, indices = nn.functional.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
        averaged = nn.functional.avg_pool2d(values, 2, ceil_mode=True, divisor_override=3)
        adaptive = nn.functional.adaptive_avg_pool2d(x, (4, 3))
        return indices, averaged, adaptive, nn.functional.max_pool1d(x[0], 2)


@pytest.mark.parametrize("opset", range(18, 24))
def test_pools_at_every_opset(opset):
    assert_spatial_dynamic_equivalent(Pools(), torch.randn(2, 3, 9, 8), spatial=False, opset_version=opset)


def test_pools_after_core_decompositions():
    x = torch.randn(2, 3, 9, 8)
    decomposed = torch.export.export(Pools(), (x,), dynamic_shapes=({0: B},)).run_decompositions()
    targets = {n.target for n in decomposed.graph.nodes}
    assert targets >= {
        aten.max_pool2d_with_indices.default, aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default
    }
    assert_spatial_dynamic_equivalent(decomposed.module(), x, spatial=False)


@pytest.mark.parametrize("dynamic_spatial", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_adaptive_max_pool_uneven_indices(n, dtype, dynamic_spatial):
    # Few distinct values make ties: PyTorch keeps the first maximum of a bin in row-major order.
    model = ADAPTIVE_MAX_POOL[n](_per_dim((5, 3, 3), n), return_indices=True).eval()
    x = torch.randint(-4, 4, (2, 3, *ADAPTIVE_SPATIAL[n])).to(dtype)
    program = assert_spatial_dynamic_equivalent(model, x, spatial=dynamic_spatial)
    assert op_histogram(program)["ArgMax"] == n
    assert_exports_equivalent(model, (x[0],))


def test_avg_pool_ceil_overhang_counts_only_the_input():
    # The last window of width 4, kernel 3, stride 3 holds one element, its average. (onnx's
    # reference evaluator, which runs float64 AveragePool, shifts ceil-mode windows by putting
    # part of the overhang before the input, so this runs in float32 on onnxruntime.)
    model = nn.AvgPool2d((1, 3), stride=(1, 3), ceil_mode=True, count_include_pad=False).eval()
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    assert_exports_equivalent(model, (x,), runtime="onnxruntime")
    assert_exports_equivalent(model, (torch.randn(2, 1, 5, 7),), runtime="onnxruntime")
