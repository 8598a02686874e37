"""Sorting and selection rules (sort, topk, kthvalue, median, nonzero) against onnxruntime."""

from __future__ import annotations

import pytest
import torch

from tests.equivalence import (
    assert_batch_dynamic_equivalent,
    assert_exports_equivalent,
    op_histogram,
)

B = torch.export.Dim("batch", min=2)
N = torch.export.Dim("n", min=4)
DTYPES = [torch.float32, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16, torch.uint8]
NAN, INF = float("nan"), float("inf")


def _distinct(dtype, *shape):
    """Values without ties, so that every index PyTorch may pick is the same."""
    count = torch.tensor(shape).prod().item()
    values = torch.randperm(count) % 250 if dtype == torch.uint8 else torch.randperm(count) - count // 2
    return values.reshape(shape).to(dtype)


def _ties(dtype, *shape):
    return torch.randint(0, 3, shape).to(dtype)


def _batch_dynamic(fn, *inputs, **options):
    return assert_batch_dynamic_equivalent(fn, *inputs, smaller=True, dim=B, **options)


def _drawn_batch_dynamic(fn, draw, dtype, *shape):
    """Like ``_batch_dynamic``, with inputs freshly drawn at batch 9 and 2 (a repeated batch would
    bring ties)."""
    rest = shape[1:]
    resized = [(draw(dtype, 9, *rest),), (draw(dtype, 2, *rest),)]
    return assert_exports_equivalent(fn, (draw(dtype, *shape),), dynamic_shapes=({0: B},), resized=resized)


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool, torch.bfloat16])
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
@pytest.mark.parametrize("dim", [1, -1, 0])
def test_sort_stable_keeps_ties_in_index_order(dim, descending, dtype):
    _drawn_batch_dynamic(lambda x: torch.sort(x, dim=dim, descending=descending, stable=True), _ties, dtype, 4, 7, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
def test_sort_and_argsort(descending, dtype):
    program = _drawn_batch_dynamic(
        lambda x: (torch.sort(x, descending=descending), torch.argsort(x, dim=0, descending=descending), torch.msort(x)),
        _distinct, dtype, 3, 9,
    )
    assert "TopK" in op_histogram(program)


@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
def test_sort_orders_nan_above_infinity(descending):
    x = torch.tensor([[3.0, NAN, -INF, 1.0, NAN, INF, -0.0, 0.0], [INF, 2.0, NAN, INF, -1.0, 5.0, 5.0, NAN]])
    _batch_dynamic(lambda x: torch.sort(x, descending=descending, stable=True), x)


def test_sort_along_a_dynamic_dim():
    x = _ties(torch.float32, 3, 8)
    assert_exports_equivalent(
        lambda x: torch.sort(x, dim=1, stable=True), (x,), dynamic_shapes=({1: N},), resized=[(_ties(torch.float32, 3, 13),)]
    )


def test_sort_of_a_0d_tensor():
    assert_exports_equivalent(lambda x: (torch.sort(x), torch.topk(x, 1), torch.kthvalue(x, 1)), (torch.tensor(2.5),))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize(("k", "dim"), [(1, -1), (3, -1), (7, 1), (2, 0)])
def test_topk(k, dim, largest, dtype):
    _drawn_batch_dynamic(lambda x: torch.topk(x, k, dim=dim, largest=largest), _distinct, dtype, 4, 7)


def test_topk_unsorted_and_with_nan():
    # PyTorch's topk neither orders unsorted results nor breaks ties in index order.
    x = torch.tensor([[1.0, NAN, 4.0, INF, -INF, 2.0], [NAN, NAN, 0.0, 1.0, 2.0, 3.0]])
    _batch_dynamic(
        lambda x: (torch.topk(x, 3, sorted=False).values.sort().values, torch.topk(x, 3).values, torch.topk(x, 2, largest=False)), x
    )


def test_topk_with_k_from_the_input_size():
    x = _distinct(torch.float32, 3, 10)
    assert_exports_equivalent(
        lambda x: torch.topk(x, x.shape[1] - 2), (x,), dynamic_shapes=({1: N},), resized=[(_distinct(torch.float32, 3, 14),)]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int64])
@pytest.mark.parametrize("keepdim", [False, True], ids=["dropdim", "keepdim"])
@pytest.mark.parametrize(("k", "dim"), [(1, -1), (4, 1), (2, 0)])
def test_kthvalue(k, dim, keepdim, dtype):
    _drawn_batch_dynamic(lambda x: torch.kthvalue(x, k, dim=dim, keepdim=keepdim), _distinct, dtype, 3, 5, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int32])
@pytest.mark.parametrize("keepdim", [False, True], ids=["dropdim", "keepdim"])
@pytest.mark.parametrize(("dim", "size"), [(-1, 6), (-1, 7), (0, 4)], ids=["even", "odd", "batch"])
def test_median(dim, size, keepdim, dtype):
    _drawn_batch_dynamic(lambda x: (torch.median(x, dim=dim, keepdim=keepdim), torch.median(x)), _distinct, dtype, 4, size)


def test_median_along_a_dynamic_dim():
    x = _distinct(torch.float32, 3, 8)
    assert_exports_equivalent(
        lambda x: torch.median(x, dim=1), (x,), dynamic_shapes=({1: N},), resized=[(_distinct(torch.float32, 3, 11),)]
    )


def test_median_is_nan_at_the_first_nan():
    x = torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0], [INF, -INF, 0.0, 2.0, NAN]])
    _batch_dynamic(lambda x: (torch.median(x, dim=1), torch.median(x), torch.kthvalue(x, 4)), x)


def test_values_with_ties_agree():
    # Which of several equal elements PyTorch's topk/kthvalue/median report is unspecified.
    x = _ties(torch.float32, 4, 9)
    _batch_dynamic(
        lambda x: (torch.topk(x, 4).values, torch.kthvalue(x, 5).values, torch.median(x, dim=1).values), x
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.uint8, torch.float16])
@pytest.mark.parametrize("shape", [(4, 6), (4,), (3, 2, 5)], ids=["2d", "1d", "3d"])
def test_nonzero(shape, dtype):
    x = (torch.randn(shape) > 0.3).to(dtype) * torch.randint(1, 5, shape).to(dtype)
    program = _batch_dynamic(lambda x: x.nonzero(), x)
    assert op_histogram(program)["NonZero"] == 1


def test_nonzero_of_0d_tensors():
    assert_exports_equivalent(lambda x: (x.nonzero(), (x - x).nonzero()), (torch.tensor(3.0),))


def test_nonzero_count_is_a_named_dynamic_dim():
    program = _batch_dynamic(lambda x: torch.nonzero(x > 0), torch.randn(5, 3))
    (output,) = program.model.graph.outputs
    count, columns = output.shape
    assert isinstance(count.value, str) and columns == 2


def test_nonzero_coordinates_index_the_input():
    def model(x):
        coordinates = (x > 0).nonzero()
        rows, columns = coordinates.unbind(1)
        return x[rows, columns] * 2, coordinates.sum(0), torch.argwhere(x < -0.5).shape[0] + x.sum()

    _batch_dynamic(model, torch.randn(5, 6))



@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_bucketize(dtype, right):
    boundaries = torch.tensor([-2, 0, 0, 3, 7]).to(dtype)
    values = torch.tensor([[-5, -2, 0, 1], [3, 6, 7, 9]]).to(dtype)
    grown = torch.arange(-6, 10).reshape(4, 4).to(dtype)
    program = assert_exports_equivalent(
        lambda x, b: (torch.bucketize(x, b, right=right), torch.bucketize(x, b, right=right, out_int32=True)),
        (values, boundaries), dynamic_shapes=({0: B, 1: N}, {0: torch.export.Dim("m", min=2)}),
        resized=[(grown, boundaries[:3]), (grown[:2], torch.arange(-4, 12).to(dtype))],
    )
    assert "Loop" not in op_histogram(program)


def test_bucketize_nan_goes_past_every_boundary_and_mixed_dtypes_promote():
    boundaries = torch.tensor([-1, 0, 4], dtype=torch.int64)
    assert_exports_equivalent(
        lambda x, b: (torch.bucketize(x, b), torch.bucketize(2.5, b), torch.bucketize(x, b.double(), right=True)),
        (torch.tensor([NAN, -INF, INF, 0.0, 3.5]), boundaries),
    )


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_batched_with_sorter(side):
    unsorted = torch.randn(3, 8)
    sorter = torch.argsort(unsorted)
    values = torch.randn(3, 5)
    grown = torch.randn(4, 8)
    assert_exports_equivalent(
        lambda s, v, so: (
            torch.searchsorted(s.sort().values, v, side=side),
            torch.searchsorted(s, v, side=side, sorter=so),
            torch.searchsorted(s[0].sort().values, v),
            torch.searchsorted(s[1].sort().values, 0.25, out_int32=True),
        ),
        (unsorted, values, sorter), dynamic_shapes=({0: B}, {0: B, 1: N}, {0: B}),
        resized=[(grown, torch.randn(4, 9), torch.argsort(grown))],
    )


# -- nanmedian and mode -------------------------------------------------------------------


def _distinct_with_nans(dtype, *shape):
    """Distinct values; floating rows other than rows 1, 5, 9, ... hold NaNs, never all NaN."""
    x = _distinct(dtype, *shape)
    if dtype.is_floating_point:
        rows, columns = torch.meshgrid(torch.arange(shape[0]), torch.arange(shape[1]), indexing="ij")
        x[((rows + columns) % 3 == 0) & (rows % 4 != 1)] = NAN
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int32])
@pytest.mark.parametrize("keepdim", [False, True], ids=["dropdim", "keepdim"])
@pytest.mark.parametrize(("dim", "size"), [(-1, 6), (1, 7), (0, 4)], ids=["even", "odd", "batch"])
def test_nanmedian_ignores_nan(dim, size, keepdim, dtype):
    _drawn_batch_dynamic(
        lambda x: (torch.nanmedian(x, dim=dim, keepdim=keepdim), torch.nanmedian(x)), _distinct_with_nans, dtype, 4, size
    )


def test_nanmedian_along_a_dynamic_dim():
    assert_exports_equivalent(
        lambda x: torch.nanmedian(x, dim=1), (_distinct_with_nans(torch.float32, 3, 8),), dynamic_shapes=({1: N},),
        resized=[(_distinct_with_nans(torch.float32, 3, 11),)],
    )


def test_nanmedian_of_all_nan_rows_is_nan():
    # PyTorch's index for an all-NaN row is wherever its selection leaves a NaN: any NaN is right.
    x = torch.tensor([[NAN, NAN, NAN, NAN], [1.0, NAN, 0.5, NAN], [2.0, 1.0, 3.0, INF], [NAN, -INF, NAN, NAN]])

    def nanmedians(x):
        values, indices = torch.nanmedian(x, dim=1)
        return values, x.gather(1, indices[:, None]), torch.nanmedian(x), torch.nanmedian(x[0])

    _batch_dynamic(nanmedians, x)


def _modes(dim, keepdim):
    # Which of the elements equal to the mode PyTorch indexes is not specified: the index is
    # checked to hold the mode.
    def modes(x):
        values, indices = torch.mode(x, dim, keepdim)
        return values, x.gather(dim, indices if keepdim else indices.unsqueeze(dim))

    return modes


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool, torch.int8, torch.bfloat16])
@pytest.mark.parametrize("keepdim", [False, True], ids=["dropdim", "keepdim"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_mode_takes_the_smallest_most_frequent_value(dim, keepdim, dtype):
    _drawn_batch_dynamic(_modes(dim, keepdim), _ties, dtype, 5, 9)


def test_mode_of_distinct_values_is_the_smallest():
    _drawn_batch_dynamic(_modes(1, False), _distinct, torch.float32, 4, 6)


def test_mode_along_a_dynamic_dim():
    x = torch.randint(0, 4, (3, 3, 20))
    program = assert_exports_equivalent(
        _modes(2, False), (x,), dynamic_shapes=({0: B, 2: N},), resized=[(torch.randint(-2, 3, (2, 3, 33)),)]
    )
    assert "Loop" not in op_histogram(program)


def test_mode_of_a_0d_tensor():
    assert_exports_equivalent(lambda x: torch.mode(x), (torch.tensor(3.0),))
