"""Matrix product rules (matmul, mm, bmm, addmm, linear, baddbmm, einsum, ...) against onnxruntime."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.equivalence import (
    assert_batch_dynamic_equivalent,
    assert_exports_equivalent,
    op_histogram,
)

FLOAT_DTYPES = [torch.float32, torch.float16, torch.float64]
INT_DTYPES = [torch.int32, torch.int64]


def _batch_dynamic(fn, *inputs, **options):
    # min=2: a dynamic dim that could be 1 would broadcast, and torch.export refuses to guess.
    return assert_batch_dynamic_equivalent(fn, *inputs, dim=torch.export.Dim("batch", min=2), **options)


def _sample(dtype, *shape):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    return torch.randint(0 if dtype == torch.uint8 else -5, 6, shape, dtype=dtype)


# -- matmul and its plain variants --------------------------------------------------------


@pytest.mark.parametrize(
    "shapes, batched",
    [
        (((2, 3, 4), (2, 4, 5)), [True, True]),
        (((2, 3, 4), (4, 5)), [True, False]),
        (((2, 3, 4), (4,)), [True, False]),
        (((2, 4), (4,)), [True, False]),
        (((2,), (2, 5)), [True, True]),
        (((4,), (3, 4, 5)), [False, True]),
        (((2, 1, 3, 4), (6, 4, 5)), [True, False]),
        (((2, 1, 3, 4), (6, 4, 5)), [False, True]),
        (((2, 3, 4), (1, 4, 5)), [True, False]),
        (((2, 4), (3, 4, 5)), [True, False]),
    ],
    ids=lambda case: "@".join("x".join(map(str, shape)) for shape in case) if isinstance(case[0], tuple) else str(case),
)
def test_matmul_shapes(shapes, batched):
    a, b = (torch.randn(s) for s in shapes)
    _batch_dynamic(torch.matmul, a, b, batched=batched)


def test_matmul_of_two_vectors():
    assert_exports_equivalent(torch.matmul, (torch.randn(4), torch.randn(4)))


def test_transposed_matrix_times_vector():
    # onnxruntime 1.31 fuses Transpose into a MatMul with a 1-D second operand wrongly.
    m, batch, v = torch.randn(4, 3), torch.randn(3, 4, 5), torch.randn(4)
    _batch_dynamic(
        lambda m, batch, v: (m.T @ v, torch.mv(m.T, v), batch.transpose(1, 2) @ v, torch.addmv(v[:1], m.T, v), F.linear(m.T, v)),
        m, batch, v, batched=[False, True, False],
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.int8, torch.uint8, torch.int16])
def test_matmul_dtypes(dtype):
    a, b = _sample(dtype, 3, 2, 4), _sample(dtype, 3, 4, 5)
    _batch_dynamic(lambda a, b: (a @ b, a @ b[0], a[:, 0] @ b[0, :, 0]), a, b)


def test_narrow_integer_products_wrap_like_pytorch():
    a = torch.full((2, 3), 100, dtype=torch.int8)
    b = torch.full((3, 2), 90, dtype=torch.int8)
    _batch_dynamic(lambda a, b: (a @ b, torch.einsum("ij,jk->ik", a, b)), a, b, batched=[True, False])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
def test_mm_bmm_mv_dot(dtype):
    m, batch, v = _sample(dtype, 3, 4), _sample(dtype, 3, 4, 5), _sample(dtype, 4)
    _batch_dynamic(
        lambda m, batch, v: (
            torch.mm(m, batch[0]), torch.bmm(batch.transpose(1, 2), batch), torch.mv(m, v), torch.dot(v, v), torch.vdot(v, v),
        ),
        m, batch, v, batched=[True, True, False],
    )


# -- addmm and linear ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("bias_shape", [(5,), (3, 5), (3, 1), (1, 5)], ids=str)
@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, 2), (2, 0.25), (0, 1), (0, 3)])
def test_addmm(dtype, bias_shape, beta, alpha):
    bias, m1, m2 = _sample(dtype, *bias_shape), _sample(dtype, 3, 4), _sample(dtype, 4, 5)
    batched = [len(bias_shape) == 2 and bias_shape[0] == 3, True, False]
    program = _batch_dynamic(lambda c, a, b: torch.addmm(c, a, b, beta=beta, alpha=alpha), bias, m1, m2, batched=batched)
    assert op_histogram(program)["Gemm"] == 1


@pytest.mark.parametrize("runtime", ["onnxruntime", "reference"])
def test_zero_beta_ignores_nan_in_self(runtime):
    # onnxruntime's Gemm skips C when beta is 0, but by the ONNX spec 0 * NaN is NaN.
    nan = float("nan")
    bias, m1, m2 = torch.full((3, 5), nan), torch.randn(3, 4), torch.randn(4, 5)
    batch1, batch2 = torch.randn(3, 2, 4), torch.randn(3, 4, 5)
    _batch_dynamic(
        lambda c, a, b, x, y: (
            torch.addmm(c, a, b, beta=0), torch.addmm(c, a, b, beta=0, alpha=0.5),
            torch.addmm(c.double(), a.double(), b.double(), beta=0, alpha=0.1),
            torch.baddbmm(c[:, :2].unsqueeze(-1), x, y, beta=0), torch.addbmm(c[:2], x, y, beta=0),
            torch.addmv(c[0], b.T, a[0], beta=0, alpha=2),
        ),
        bias, m1, m2, batch1, batch2, batched=[True, True, False, True, True], runtime=runtime,
    )


def test_addmm_float64_with_inexact_scalars_avoids_gemm():
    # Gemm's float32 alpha would round 0.1; MatMul keeps float64 exact.
    bias, m1, m2 = (torch.randn(s, dtype=torch.float64) for s in [(5,), (3, 4), (4, 5)])
    program = _batch_dynamic(
        lambda c, a, b: torch.addmm(c, a, b, beta=0.3, alpha=0.1), bias, m1, m2, batched=[False, True, False]
    )
    assert op_histogram(program)["Gemm"] == 0


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_addmm_integers(dtype):
    bias, m1, m2 = _sample(dtype, 5), _sample(dtype, 3, 4), _sample(dtype, 4, 5)
    _batch_dynamic(
        lambda c, a, b: (torch.addmm(c, a, b), torch.addmm(c, a, b, beta=2, alpha=3), torch.addmm(c, a, b, beta=0)),
        bias, m1, m2, batched=[False, True, False],
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_linear_module(dtype):
    layer = torch.nn.Linear(4, 6).to(dtype).eval()
    program = _batch_dynamic(layer, _sample(dtype, 3, 4))
    assert op_histogram(program)["Gemm"] == 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64])
def test_linear_functional(dtype):
    weight, bias = _sample(dtype, 6, 4), _sample(dtype, 6)
    vector_weight = _sample(dtype, 4)
    _batch_dynamic(
        lambda x: (
            F.linear(x, weight, bias), F.linear(x, weight), F.linear(x[0], weight, bias), F.linear(x[:, 0], weight),
            F.linear(x, vector_weight), F.linear(x, vector_weight, bias[0]), F.linear(x[:, 0], weight, bias),
        ),
        _sample(dtype, 3, 2, 4),
    )


# -- batched and accumulating variants ----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int8, torch.int16])
@pytest.mark.parametrize("beta, alpha", [(1, 1), (2, 3), (0, 2)])
def test_baddbmm_addbmm_addmv(dtype, beta, alpha):
    b1, b2 = _sample(dtype, 3, 2, 4), _sample(dtype, 3, 4, 5)
    bias, mat, vec = _sample(dtype, 1, 5), _sample(dtype, 2, 4), _sample(dtype, 4)
    _batch_dynamic(
        lambda b1, b2, bias, mat, vec: (
            torch.baddbmm(bias, b1, b2, beta=beta, alpha=alpha), torch.addbmm(bias, b1, b2, beta=beta, alpha=alpha),
            torch.addmv(bias[0, :2], mat, vec, beta=beta, alpha=alpha),
        ),
        b1, b2, bias, mat, vec, batched=[True, True, False, False, False],
    )


def test_baddbmm_float_scalars_and_batched_bias():
    b1, b2, bias = torch.randn(3, 2, 4), torch.randn(3, 4, 5), torch.randn(3, 2, 5)
    _batch_dynamic(lambda c, x, y: torch.baddbmm(c, x, y, beta=0.5, alpha=-1.5), bias, b1, b2)


def test_outer():
    v, w = torch.randn(3), torch.randn(4)
    i, flags = torch.arange(3), torch.tensor([True, False, True])
    _batch_dynamic(
        lambda v, w, i, flags: (torch.outer(v, w), torch.outer(i, w), torch.outer(flags, flags), torch.outer(i, i)),
        v, w, i, flags, batched=[True, False, True, True],
    )


# -- einsum -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("bij,bjk->bik", [(3, 2, 4), (3, 4, 5)]),
        ("bij, bkj -> bik", [(3, 2, 4), (3, 5, 4)]),
        ("bi,bi->b", [(3, 4), (3, 4)]),
        ("bij", [(3, 2, 4)]),
        ("bij,jk", [(3, 2, 4), (4, 5)]),
        ("b...d,de->b...e", [(3, 2, 6, 4), (4, 5)]),
        ("bii->bi", [(3, 4, 4)]),
        ("bii", [(3, 4, 4)]),
        ("bi,bj->bij", [(3, 4), (3, 2)]),
        ("BIJ,BJK->BIK", [(3, 2, 4), (3, 4, 5)]),
    ],
)
def test_einsum(equation, shapes):
    operands = [torch.randn(s) for s in shapes]
    unary, binary = (lambda a: torch.einsum(equation, a)), (lambda a, b: torch.einsum(equation, a, b))
    program = _batch_dynamic(binary if len(operands) == 2 else unary, *operands)
    assert op_histogram(program)["Einsum"] == 1


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16]
)
def test_einsum_dtypes(dtype):
    # "bi->b" on integers sums into int64, as PyTorch's einsum does.
    _batch_dynamic(
        lambda a, b: (torch.einsum("bij,bjk->bik", a, b), torch.einsum("bij->b", a)),
        _sample(dtype, 3, 2, 4), _sample(dtype, 3, 4, 5),
    )


def test_einsum_on_bools():
    # ONNX's Einsum takes no bool: products run in int32; "ij->i" counts into int64, as PyTorch's.
    a, b = torch.rand(3, 4) > 0.5, torch.rand(5) > 0.5
    _batch_dynamic(
        lambda a, b: (torch.einsum("bi,j->bij", a, b), torch.einsum("bi,bi->bi", a, a), torch.einsum("bi->b", a)),
        a, b, batched=[True, False], runtime="onnxruntime",
    )


def test_einsum_ellipses_of_different_ranks_broadcast_and_sum():
    a, b = torch.randn(1, 2, 3), torch.randn(3)
    program = assert_exports_equivalent(
        lambda a, b, c: (
            torch.einsum("...ik, ...j -> ij", a, b), torch.einsum("...ij,...jk", c, a[0].T), torch.einsum("i...->...", c[0]),
        ),
        (a, b, torch.randn(4, 2, 3)),
    )
    assert op_histogram(program)["Einsum"] == 3


# -- opsets -------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", range(18, 24))
def test_opsets(opset):
    layer = torch.nn.Linear(4, 5)
    weight = torch.randn(5, 4)

    def fn(x, batch):
        return (
            layer(x), x @ weight.T, torch.addmm(layer.bias, x, weight.T, beta=0.5), torch.bmm(batch, batch.transpose(1, 2)),
            torch.baddbmm(batch[:, :, :1], batch, batch[:, :1].transpose(1, 2)), torch.einsum("bij,bkj->bik", batch, batch),
            torch.mv(x, weight[0]),
        )

    _batch_dynamic(fn, torch.randn(3, 4), torch.randn(3, 2, 4), opset_version=opset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_det(dtype):
    a = torch.randn(2, 3, 3, dtype=dtype)
    a[1, 2] = a[1, 0]  # singular
    program = assert_batch_dynamic_equivalent(lambda a: (torch.linalg.det(a), torch.det(a[0])), a)
    assert op_histogram(program)["Det"] == 2


def test_slogdet_and_logdet():
    a = torch.randn(3, 4, 4)
    spd = a[0] @ a[0].T + torch.eye(4)
    program = assert_batch_dynamic_equivalent(lambda a, s: (torch.linalg.slogdet(a), torch.logdet(s)), a, spd, batched=[True, False], atol=1e-5)
    assert op_histogram(program)["Det"] == 2


@pytest.mark.parametrize("ord", ["fro", 1, -1, math.inf, -math.inf])
def test_matrix_norm(ord):
    assert_exports_equivalent(lambda a: torch.linalg.matrix_norm(a, ord, keepdim=ord == 1), (torch.randn(2, 3, 4),))


def test_cross():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    assert_batch_dynamic_equivalent(lambda a, b: (torch.linalg.cross(a, b), torch.cross(a[:, None], b[:, None], dim=-1)), a, b)


# -- bilinear (aten._trilinear) -----------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_bilinear_module(bias, dtype):
    torch.manual_seed(0)
    layer = torch.nn.Bilinear(3, 4, 5, bias=bias).to(dtype).eval()
    program = _batch_dynamic(layer, _sample(dtype, 6, 3), _sample(dtype, 6, 4))
    assert op_histogram(program)["Einsum"] == 1


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.float32])
def test_bilinear_functional_with_leading_dims(dtype):
    weight, bias = _sample(dtype, 2, 3, 4), _sample(dtype, 2)
    _batch_dynamic(
        lambda a, b: (F.bilinear(a, b, weight, bias), F.bilinear(a[0], b[0], weight)),
        _sample(dtype, 3, 5, 3), _sample(dtype, 3, 5, 4),
    )


def test_trilinear_sums_any_dims():
    # Dims every operand lacks are summed away (size 1) when listed in sumdim.
    a, b, c = torch.randn(2, 3), torch.randn(3), torch.randn(2, 3)
    assert_exports_equivalent(
        lambda a, b, c: (
            torch.ops.aten._trilinear(a, b, c, [], [0], [], [1]),
            torch.ops.aten._trilinear(a, a, c, [0], [0], [0], [0, -1]),
            torch.ops.aten._trilinear(a, b, c, [], [0], [], []),
        ),
        (a, b, c),
    )


@pytest.mark.parametrize(
    "shapes",
    [((1, 0, 0), (0, 0, 0)), ((1, 2, 0), (3, 0, 4)), ((1, 3), (0, 3, 2)), ((0,), (2, 0, 3)), ((2, 1, 0, 3), (1, 4, 3, 2))],
    ids=lambda shapes: "@".join("x".join(map(str, shape)) for shape in shapes),
)
def test_matmul_broadcasting_empty_dims(shapes):
    # Regression (property tests): onnxruntime's MatMul cannot broadcast a second operand's size-0
    # batch dim, and with a size-0 inner dim it mis-sizes the batch and leaves the output unset.
    a, b = (torch.randn(s) for s in shapes)
    assert_exports_equivalent(torch.matmul, (a, b))


def test_addmm_with_empty_inner_dim_scales_self():
    # Regression (property tests): onnxruntime's Gemm returns C, not beta * C, when K is 0.
    self, mat1, mat2 = torch.randn(2, 3), torch.randn(2, 0), torch.randn(0, 3)
    assert_exports_equivalent(lambda s, m1, m2: torch.addmm(s, m1, m2, beta=0.5, alpha=2.0), (self, mat1, mat2))


# -- transformers' grouped product of mixture-of-experts layers ----------------------------------


def _grouped_mm_fallback():
    pytest.importorskip("transformers")
    from tests.torchvision_ops import load_torchvision_if_installed

    load_torchvision_if_installed()  # transformers imports torchvision as it loads
    import transformers.integrations.moe  # noqa: F401  (defines the operator)

    return torch.ops.transformers.grouped_mm_fallback


def test_grouped_mm_fallback_over_expert_slices():
    # 4 experts; expert 1 gets no row, and the rows after the last offset (expert-parallel
    # sentinels) come out zero.
    grouped_mm = _grouped_mm_fallback()
    torch.manual_seed(0)
    weight = torch.randn(4, 6, 5)

    def product(rows, offs):
        return grouped_mm(rows, weight, offs)

    calls = [
        (torch.randn(7, 6), torch.tensor([2, 2, 5, 6], dtype=torch.int32)),
        (torch.randn(12, 6), torch.tensor([0, 4, 9, 12], dtype=torch.int32)),
        (torch.randn(3, 6), torch.tensor([1, 1, 1, 1], dtype=torch.int32)),
    ]
    assert_exports_equivalent(
        product, calls[0], dynamic_shapes=({0: torch.export.Dim("rows")}, None), resized=calls[1:], atol=1e-5,
    )


def test_grouped_mm_fallback_of_routed_tokens():
    # As transformers calls it: token-expert pairs sorted by expert, counted with histc.
    grouped_mm = _grouped_mm_fallback()
    torch.manual_seed(0)
    weight = torch.randn(3, 8, 4)

    def experts(hidden, expert_ids):
        sorted_ids, order = torch.sort(expert_ids.reshape(-1))
        counts = torch.histc(sorted_ids.float(), bins=3, min=0, max=2)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        products = grouped_mm(hidden[order // expert_ids.shape[1]], weight, offs)
        return products[torch.argsort(order)]  # each pair back in its place: ties sort either way

    tokens = torch.export.Dim("tokens")
    assert_exports_equivalent(
        experts, (torch.randn(5, 8), torch.randint(0, 3, (5, 2))), dynamic_shapes=({0: tokens}, {0: tokens}),
        resized=[(torch.randn(9, 8), torch.randint(0, 3, (9, 2))), (torch.randn(2, 8), torch.tensor([[2, 2], [2, 2]]))],
        atol=1e-5,
    )
