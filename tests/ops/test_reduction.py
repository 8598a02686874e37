"""Reduction rules (sum, mean, extrema, variance, logical, norms) against onnxruntime."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import dynexport
from tests.equivalence import (
    assert_batch_dynamic_equivalent,
    assert_exports_equivalent,
    op_histogram,
)

FLOAT_DTYPES = [torch.float32, torch.float16, torch.float64]
INT_DTYPES = [torch.int32, torch.int64]


def _sample(dtype, *shape):
    """Values in [-4, 4] (small enough that integer products stay exact), with ties."""
    return torch.randint(-4, 5, shape).to(dtype) if dtype != torch.bool else torch.rand(shape) > 0.5


def _nodes(program, op_type):
    return [node for node in program.model.graph if node.op_type == op_type]


# -- sums and means -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.int8, torch.bool])
def test_sum(dtype):
    assert_batch_dynamic_equivalent(
        lambda x: (x.sum(), x.sum(1), x.sum((0, 2), keepdim=True), x.sum(-1), x.sum([]), x.sum((-1, -2))),
        _sample(dtype, 3, 4, 5),
    )


def test_sum_of_bool_and_int32_is_int64():
    program = assert_batch_dynamic_equivalent(lambda b, i: (b.sum(1), i.sum()), _sample(torch.bool, 3, 4), _sample(torch.int32, 3, 4))
    assert [v.dtype.name for v in program.model.graph.outputs] == ["INT64", "INT64"]


def test_sum_with_dtype():
    assert_batch_dynamic_equivalent(
        lambda x, i: (x.sum(1, dtype=torch.float64), i.sum(dtype=torch.float32), i.sum(0, dtype=torch.int32)),
        torch.randn(3, 4), _sample(torch.int32, 3, 4),
    )


def test_reducing_every_dim_omits_the_axes_input():
    # With an axes input, an empty axes list would depend on noop_with_empty_axes.
    program = assert_batch_dynamic_equivalent(lambda x: (x.sum(), x.sum([]), x.amax(), x.mean((0, 1, 2))), torch.randn(2, 3, 4))
    for op_type in ("ReduceSum", "ReduceMax", "ReduceMean"):
        assert [len(node.inputs) for node in _nodes(program, op_type)] == [1] * len(_nodes(program, op_type))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_mean(dtype):
    assert_batch_dynamic_equivalent(
        lambda x: (x.mean(), x.mean(-1), x.mean((0, 1), keepdim=True), x.mean([1, 2])),
        torch.randn(3, 4, 5, dtype=dtype),
    )


def test_mean_of_integers_with_dtype():
    assert_batch_dynamic_equivalent(lambda i: (i.mean(1, dtype=torch.float32), i.mean(dtype=torch.float64)), _sample(torch.int64, 3, 4))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.bool])
def test_prod(dtype):
    # Few small factors: onnxruntime saturates an overflowing integer product, PyTorch wraps it.
    x = _sample(dtype, 2, 3, 2).clamp(-2, 2)
    assert_batch_dynamic_equivalent(lambda x: (x.prod(), x.prod(1), x.prod(-1, keepdim=True), x.prod(0, dtype=torch.float64)), x)


@pytest.mark.parametrize("runtime", ["onnxruntime", "reference"])
def test_half_precision_accumulates_in_float32_like_pytorch(runtime):
    # 300**2 overflows float16; PyTorch's float32 accumulator keeps these finite. (onnxruntime's
    # CPU kernels accumulate in float32 anyway; the reference evaluator does not.)
    x = torch.full((2, 8), 300.0, dtype=torch.float16)
    x[:, ::2] = -300.0
    assert_batch_dynamic_equivalent(
        lambda x: (
            x.norm(dim=1), x.std(1, correction=0), x.std(), torch.linalg.vector_norm(x, 3, 1), torch.cat([x, -x], 1).sum(1),
        ),
        x, runtime=runtime,
    )


def test_bfloat16_accumulating_reductions_run_in_onnxruntime():
    # onnxruntime's Python API cannot feed bfloat16, so the model casts in and out.
    def fn(x):
        x = x.bfloat16()
        return tuple(r.float() for r in (x.sum(1), x.mean(), x.var(1), x.norm(dim=0), torch.logsumexp(x, 1)))

    assert_batch_dynamic_equivalent(fn, torch.randn(3, 4), runtime="onnxruntime", rtol=2e-2, atol=1e-2)


# -- extrema and their indices ------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.int16, torch.uint8, torch.bool])
def test_amax_amin_max_min(dtype):
    x = _sample(dtype, 3, 4, 5).abs() if dtype == torch.uint8 else _sample(dtype, 3, 4, 5)
    assert_batch_dynamic_equivalent(
        lambda x: (x.amax(1), x.amin((0, 2)), x.amax((-1,), keepdim=True), x.amin(), x.max(), x.min()),
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_max_min_dim_return_first_index_of_ties(dtype):
    x = torch.tensor([[1, 3, 3, 0], [2, 2, 0, 0], [0, 0, 0, 0]]).to(dtype)
    assert_batch_dynamic_equivalent(
        lambda x: (x.max(1), x.min(1), x.max(0, keepdim=True), x.min(-1, keepdim=True)),
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_argmax_argmin(dtype):
    x = torch.tensor([[[1, 5, 5], [5, 0, 0]], [[2, 2, 0], [0, 1, 5]]]).to(dtype)
    program = assert_batch_dynamic_equivalent(
        lambda x: (
            x.argmax(), x.argmin(), x.argmax(1), x.argmin(-1), x.argmax(2, keepdim=True),
            x.argmin(0, keepdim=True), x.argmax(keepdim=True), x.argmin(keepdim=True),
        ),
        x,
    )
    for node in _nodes(program, "ArgMax") + _nodes(program, "ArgMin"):
        assert node.attributes.get_int("select_last_index", 0) == 0


# -- variance -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_var_std(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype)
    assert_batch_dynamic_equivalent(
        lambda x: (
            x.var(), x.std(), x.var(1), x.std(-1, unbiased=False), x.var(0),
            x.var((0, 2), correction=2, keepdim=True), x.std(1, correction=0.5),
            x.var(unbiased=False), x.std(unbiased=False), torch.var(x, [-1, -2], unbiased=True, keepdim=True),
        ),
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_var_mean_std_mean(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype)
    assert_batch_dynamic_equivalent(
        lambda x: (
            torch.var_mean(x, 1), torch.std_mean(x), torch.var_mean(x, (0, -1), keepdim=True),
            torch.std_mean(x, 2, correction=0), torch.var_mean(x, unbiased=False),
            torch.std_mean(x, False), torch.var_mean(x, 0, unbiased=False, keepdim=False),
        ),
        x,
    )


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_var_with_too_few_elements_is_nan_or_inf_like_pytorch():
    x = torch.randn(3, 1)
    # Dim 0 is dynamic: 3 rows leave max(3 - 5, 0) = 0 degrees of freedom, 9 rows leave 4.
    assert_batch_dynamic_equivalent(lambda x: (x.var(1), x.std(1, correction=2), x.var(1, correction=0), x.var(0, correction=5)), x)


# -- logical ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.uint8])
def test_any_all(dtype):
    x = torch.tensor([[[1, 0], [0, 0]], [[1, 1], [2, 3]], [[0, 0], [0, 0]]]).to(dtype)
    assert_batch_dynamic_equivalent(
        lambda x: (
            x.any(), x.all(), x.any(1), x.all(-1), x.any(2, keepdim=True), x.all(0, keepdim=True),
            x.any((0, 1)), x.all((1, 2)), torch.any(x, (0, 2), keepdim=True),
        ),
        x,
    )


def test_any_all_over_no_elements():
    empty = torch.zeros(2, 0, 3, dtype=torch.bool)
    assert_exports_equivalent(lambda x: (x.any(), x.all(), x.any(1), x.all(1), x.any(2)), (empty,))


def test_count_nonzero():
    x = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [2.0, 3.0]], [[0.0, -1.0], [0.0, 0.0]]])
    assert_batch_dynamic_equivalent(
        lambda x: (
            torch.count_nonzero(x), torch.count_nonzero(x, 1), torch.count_nonzero(x, (0, -1)), torch.count_nonzero(x > 0, 2),
        ),
        x,
    )


# -- logsumexp and norms ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_logsumexp(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype) * 4
    assert_batch_dynamic_equivalent(
        lambda x: (torch.logsumexp(x, 1), torch.logsumexp(x, -1, keepdim=True), torch.logsumexp(x, (0, 2))),
        x,
    )


def test_logsumexp_is_stable_with_large_and_infinite_inputs():
    inf = math.inf
    x = torch.tensor([[1000.0, 1000.0, 999.0], [-inf, -inf, -inf], [inf, 1.0, 2.0], [-inf, 0.0, -1000.0]])
    assert_batch_dynamic_equivalent(lambda x: (torch.logsumexp(x, 1), torch.logsumexp(x, 0, keepdim=True)), x)


def test_logsumexp_of_integers_is_float():
    assert_batch_dynamic_equivalent(lambda i: torch.logsumexp(i, 1), _sample(torch.int64, 3, 4))


@pytest.mark.parametrize("ord", [2, 1, math.inf, -math.inf, 0, 3, 0.5, -1])
def test_linalg_vector_norm(ord):
    x = torch.randn(3, 4, 5)
    x[0, 0, :2] = 0
    assert_batch_dynamic_equivalent(
        lambda x: (
            torch.linalg.vector_norm(x, ord), torch.linalg.vector_norm(x, ord, dim=1),
            torch.linalg.vector_norm(x, ord, dim=(-1, 0), keepdim=True), torch.linalg.vector_norm(x, ord, dim=-1),
        ),
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_norm_variants_in_models(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype)
    assert_batch_dynamic_equivalent(
        lambda x: (
            x.norm(), x.norm(dim=1), torch.norm(x, p=3, dim=1, keepdim=True), F.normalize(x, dim=-1),
            torch.linalg.norm(x, dim=-1),
        ),
        x,
    )


def test_vector_norm_with_dtype():
    assert_batch_dynamic_equivalent(lambda x: torch.linalg.vector_norm(x, 2, dim=1, dtype=torch.float64), torch.randn(3, 4))


# -- 0-d inputs and opsets ----------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_zero_dim_inputs():
    x = torch.tensor(-2.5)
    i = torch.tensor(3)
    assert_exports_equivalent(
        lambda x, i: (
            x.sum(), x.sum(0), x.sum(-1, keepdim=True), x.mean(0), x.amax(0), x.amin(), x.max(0), x.min(0, keepdim=True),
            x.argmax(), x.argmin(0), x.argmax(0, keepdim=True), x.var(0, correction=0), x.std(),
            x.prod(0), torch.logsumexp(x, 0), x.norm(), torch.linalg.vector_norm(x, 3, 0),
            x.any(), i.all(0), torch.count_nonzero(i), i.sum(), i.max(0), torch.var_mean(x, 0, correction=0),
        ),
        (x, i),
    )


@pytest.mark.parametrize("opset", range(18, 24))
def test_opsets(opset):
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 4.0, 4.0], [2.0, -1.0, 0.0, 7.0]])
    assert_batch_dynamic_equivalent(
        lambda x: (
            x.sum(1), x.mean(0), x.amax(1), (x > 0).amin(1), x.max(1), x.argmin(), x.var(1),
            torch.std_mean(x, 0), x.prod(1), (x > 0).all(1), torch.logsumexp(x, 1),
            torch.count_nonzero(x, 1), x.norm(dim=1), torch.linalg.vector_norm(x, math.inf, 0),
        ),
        x,
        opset_version=opset,
    )


def test_module_with_reductions_uses_direct_rules():
    class Pool(torch.nn.Module):
        def forward(self, x):
            scores = x.mean(-1) + x.var(-1, keepdim=False) + x.amax(-1)
            return scores.argmax(-1), F.normalize(x, dim=-1).sum((1, 2))

    program = assert_batch_dynamic_equivalent(Pool().eval(), torch.randn(3, 4, 5))
    counts = op_histogram(program)
    # mean over a static dim and var's centring are ReduceMeans; argmax adds an ArgMax for the
    # first NaN.
    assert counts["ReduceMean"] == 2 and counts["ReduceSumSquare"] == 1 and counts["ArgMax"] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(dtype, dim):
    x = (torch.randn(3, 4) * 4).to(dtype)
    assert_exports_equivalent(
        lambda t: (torch.cumsum(t, dim), torch.cumsum(t, dim, dtype=torch.float64)),
        (x,), dynamic_shapes=({0: torch.export.Dim("batch")},), resized=[((torch.randn(5, 4) * 4).to(dtype),)],
    )


def test_cumsum_of_0d():
    assert_exports_equivalent(lambda t: torch.cumsum(t, 0), (torch.tensor(3.0),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod_is_exact_with_zeros_and_negatives(dtype, dim):
    x = torch.tensor([[1.5, -2.0, 0.0, 3.0, -1.0], [2.0, 2.0, -0.5, 4.0, 1.0], [0.5, 1.0, 3.0, -2.0, 0.0]])
    x = (x * 2).to(dtype) if not dtype.is_floating_point else x.to(dtype)
    assert_batch_dynamic_equivalent(lambda x: torch.cumprod(x, dim) if dim else torch.cumprod(x, dim, dtype=torch.float64), x, batched=[dim != 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_logcumsumexp(dtype):
    x = torch.tensor([[1.0, 80.0, -float("inf"), 3.0], [-float("inf"), -float("inf"), 2.0, float("inf")]], dtype=dtype)
    assert_batch_dynamic_equivalent(lambda x: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x[:, :3] * 0.5, -1)), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.bool])
def test_cummax_cummin_take_the_last_tied_index(dtype):
    x = torch.tensor([[1, 3, 3, 2, 5, 5, 0], [4, 4, 1, 4, -2, 7, 7]]).to(dtype)
    assert_batch_dynamic_equivalent(lambda x: (*torch.cummax(x, 1), *torch.cummin(x, -1)), x)


def test_cumulative_ops_decline_long_dims():
    with pytest.raises(dynexport.errors.UnsupportedOperatorError, match="prod"):
        dynexport.export(lambda x: torch.cumprod(x, 0), (torch.randn(2000),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_extrema_propagate_nan_and_index_the_first_nan_like_pytorch(dtype):
    x = torch.tensor([[1.0, math.nan, 2.0, math.nan], [3.0, math.inf, -1.0, 0.0], [math.nan, 5.0, 6.0, -math.inf]], dtype=dtype)
    assert_batch_dynamic_equivalent(
        lambda x: (
            x.amax(), x.amin(1), x.max(), x.min(), *x.max(1), *x.min(0, keepdim=True),
            x.argmax(), x.argmin(1), x.argmax(0, keepdim=True), x.amax(1, keepdim=True),
        ),
        x,
    )


def test_mean_over_no_elements_is_nan_like_pytorch():
    assert_exports_equivalent(lambda x: (x.mean(0), x.mean(), x.mean(1, keepdim=True)), (torch.zeros(0, 2),))
    assert_batch_dynamic_equivalent(lambda x: (x.mean(0), x.mean()), torch.randn(3, 2), smaller=True)


@pytest.mark.parametrize("dim", [0, -1])
def test_scans_over_a_dynamic_length(dim):
    x = torch.tensor([[1.5, -2.0, 0.0], [2.0, 3.0, -0.5], [0.5, 1.0, 3.0], [-1.0, 4.0, 2.0]])
    assert_exports_equivalent(
        lambda t: (torch.cumprod(t, dim), torch.logcumsumexp(t, dim), *torch.cummax(t, dim), *torch.cummin(t, dim)),
        (x,), dynamic_shapes=({0: torch.export.Dim("n"), 1: torch.export.Dim("m")},),
        resized=[(torch.randn(7, 5),), (torch.randn(0, 5),), (torch.randn(6, 0),)],
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cummax_cummin_propagate_nan_with_the_last_nan_index(dtype):
    x = torch.tensor([[1.0, math.nan, 2.0, math.nan, 5.0], [3.0, 1.0, -1.0, 0.0, math.nan], [-math.inf, 5.0, math.inf, 7.0, 6.0]], dtype=dtype)
    assert_batch_dynamic_equivalent(lambda x: (*torch.cummax(x, 1), *torch.cummin(x, 1), *torch.cummax(x, 0)), x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_sums_and_products_kept_in_narrow_integer_dtypes(dtype):
    # ReduceSum, ReduceProd and CumSum have no 8/16-bit kernels: they accumulate in int64 and the
    # result wraps back, as PyTorch's own narrow arithmetic does.
    x = _sample(dtype, 3, 5).abs().to(dtype) * 40
    assert_batch_dynamic_equivalent(
        lambda x: (
            x.sum(1, dtype=dtype), x.cumsum(0, dtype=dtype), x.prod(1, dtype=dtype), x.cumprod(1, dtype=dtype),
            x.sum(), torch.tensordot(x, x.T, dims=1),
        ),
        x,
    )


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 3.0, math.inf])
def test_cdist(p):
    torch.manual_seed(0)
    x1, x2 = torch.randn(2, 5, 4), torch.randn(2, 6, 4)
    program = assert_batch_dynamic_equivalent(lambda a, b: (torch.cdist(a, b, p=p), torch.cdist(a[0], b[0], p=p)), x1, x2, atol=1e-5)
    assert "Loop" not in op_histogram(program)


def test_infinity_norms_propagate_nan():
    x = torch.tensor([[1.0, float("nan"), -3.0], [2.0, -5.0, 0.5]])
    assert_batch_dynamic_equivalent(
        lambda x: (torch.linalg.vector_norm(x, ord=math.inf, dim=1), torch.linalg.vector_norm(x, ord=-math.inf), x.norm(p=math.inf)),
        x,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, math.inf, 3.0])
def test_pdist(p, dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 4, dtype=dtype)
    x[3] = x[1]  # a zero distance
    # min=3: two rows have one pair, a count torch.export would specialize; the program refuses
    # fewer rows than the range it was exported for.
    rows = torch.export.Dim("rows", min=3)
    resized = [(torch.randn(8, 4, dtype=dtype),), (torch.randn(3, 4, dtype=dtype),)]
    assert_exports_equivalent(lambda x: F.pdist(x, p), (x,), dynamic_shapes=({0: rows},), resized=resized, atol=1e-5)


def test_pdist_with_static_rows_gathers_constant_pairs():
    program = assert_exports_equivalent(lambda x: (F.pdist(x), F.pdist(x, 1.0)), (torch.randn(6, 3),))
    assert "NonZero" not in op_histogram(program)


# -- histograms ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("bins", "low", "high"), [(4, 0, 3), (7, -1.5, 2.0), (10, 0.1, 0.7)])
def test_histc(bins, low, high, dtype):
    # Values on every bin edge of PyTorch's (linspace in the dtype), at min and max, outside
    # the range, NaN, and random ones.
    torch.manual_seed(0)
    edges = torch.linspace(low, high, bins + 1, dtype=dtype)
    special = torch.tensor([low - 1, high + 1, float("nan"), high, low], dtype=dtype)
    x = torch.cat([edges, special, torch.rand(20, dtype=dtype) * (high - low + 1) + low - 0.5])
    resized = torch.cat([x, torch.rand(31, dtype=dtype) * (high - low) + low])
    assert_exports_equivalent(
        lambda x: torch.histc(x, bins=bins, min=low, max=high), (x,),
        dynamic_shapes=({0: torch.export.Dim("n")},), resized=[(resized,), (x[:3],)],
    )


def test_histc_of_expert_ids():
    # transformers' mixture-of-experts layers count the tokens routed to each expert.
    ids = torch.tensor([[0, 3], [1, 3], [3, 2]])
    def count(ids):
        return torch.histc(ids.reshape(-1).float(), bins=5, min=0, max=4)

    assert_exports_equivalent(count, (ids,), dynamic_shapes=({0: torch.export.Dim("tokens")},), resized=[(ids.repeat(3, 1),)])


@pytest.mark.parametrize(
    ("x", "low", "high", "reason"),
    [
        (torch.rand(6), 0, 0, "takes its range from the data"),
        (torch.rand(6), 0, math.inf, "not a finite interval"),
        (torch.rand(6, dtype=torch.float16), 0, 1, "float16"),
    ],
)
def test_histc_refusals(x, low, high, reason):
    with pytest.raises(dynexport.errors.TranslationError, match=reason):
        dynexport.export(lambda x: torch.histc(x, bins=4, min=low, max=high), (x,))
