"""Matrix product rules (matmul, mm, bmm, addmm, linear, baddbmm, einsum, ...), det, inverse and
solve against onnxruntime."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import dynexport
from tests.equivalence import (
    assert_batch_dynamic_equivalent,
    assert_close,
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


def test_logdet_is_the_log_of_the_determinant():
    # Negative determinants give NaN and singular matrices -inf, as in PyTorch: Log(Det), where
    # the slogdet route took Sign, Abs, Equal and Where too.
    a = torch.randn(4, 3, 3)
    a[1] = -a[1].abs().diag().diag()  # determinant < 0
    a[2, 2] = 0  # singular (a zero row: a determinant of exactly 0 in LAPACK and in onnxruntime)
    program = assert_batch_dynamic_equivalent(torch.logdet, a, atol=1e-5)
    assert op_histogram(program) == {"Det": 1, "Log": 1}


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


# -- inverse and solve (Gauss-Jordan in a Loop) ----------------------------------------------


def _invertible(*shape, dtype=torch.float32, pivoting=False):
    """Well-conditioned matrices; with ``pivoting``, rows reversed so that the diagonal holds
    small or zero entries and elimination must swap rows."""
    n = shape[-1]
    a = torch.randn(shape, dtype=dtype) + n * torch.eye(n, dtype=dtype)
    return a.flip(-2) if pivoting else a


def _square(name, batch=None):
    # min=2: a dim that could be 1 would broadcast.
    n = torch.export.Dim(name, min=2)
    return {0: batch, 1: n, 2: n} if batch is not None else {0: n, 1: n}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inverse_dynamic_batch_and_size(dtype):
    torch.manual_seed(0)
    a, b = _invertible(3, 4, 4, dtype=dtype), _invertible(4, 4, dtype=dtype, pivoting=True)
    exact = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 4.0], [1.0, 0.0, 0.0]], dtype=dtype)  # zero diagonal
    program = assert_exports_equivalent(
        lambda a, b, exact: (
            torch.linalg.inv(a), torch.inverse(b), torch.linalg.inv_ex(b).inverse, torch.linalg.inv(exact),
        ),
        (a, b, exact),
        dynamic_shapes=(_square("n", torch.export.Dim("batch")), _square("m"), None),
        resized=[(_invertible(5, 7, 7, dtype=dtype, pivoting=True), _invertible(2, 2, dtype=dtype), exact)],
    )
    assert op_histogram(program)["Loop"] == 3  # the static 3x3 is a closed form


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "shapes, left",
    [
        (((3, 4, 4), (3, 4, 2)), True),
        (((3, 4, 4), (3, 4)), True),  # a batch of vectors
        (((3, 4, 4), (4,)), True),
        (((3, 2, 4, 4), (4, 2)), True),
        (((4, 4), (3, 4, 2)), True),
        (((3, 1, 4, 4), (1, 5, 4, 2)), True),
        (((3, 4, 4), (3, 2, 4)), False),
        (((3, 2, 4, 4), (5, 4)), False),
    ],
    ids=lambda case: "@".join("x".join(map(str, s)) for s in case) if isinstance(case, tuple) else f"left={case}",
)
def test_solve_broadcasts_like_pytorch(shapes, left, dtype):
    # PyTorch takes B [*, n] as vectors where it is A's shape without the last dim: a B of rank
    # rank(A) - 1 asks whether the batch equals a size, which torch.export guards.
    torch.manual_seed(0)
    a = _invertible(*shapes[0], dtype=dtype, pivoting=True)
    b = torch.randn(shapes[1], dtype=dtype)
    program = _batch_dynamic(
        lambda a, b: torch.linalg.solve(a, b, left=left), a, b, batched=[len(s) > 1 and s[0] == 3 for s in shapes]
    )
    assert op_histogram(program)["Loop"] == 1


def test_solve_dynamic_size():
    torch.manual_seed(0)
    a, b = _invertible(2, 3, 3, pivoting=True), torch.randn(2, 3, 5)
    batch, n = torch.export.Dim("batch"), torch.export.Dim("n", min=2)
    assert_exports_equivalent(
        lambda a, b: (torch.linalg.solve(a, b), torch.linalg.solve(a, b[..., 0]), torch.linalg.solve_ex(a, b).result),
        (a, b),
        dynamic_shapes=({0: batch, 1: n, 2: n}, {0: batch, 1: n}),
        resized=[
            (_invertible(4, 6, 6), torch.randn(4, 6, 5)), (_invertible(1, 2, 2, pivoting=True), torch.randn(1, 2, 5)),
        ],
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_solve_in_half_precision_computes_in_float32(dtype):
    # PyTorch's CPU kernels refuse them (and torch.export refuses inv of them).
    torch.manual_seed(0)
    a, b = _invertible(3, 4, 4, pivoting=True).to(dtype), torch.randn(3, 4).to(dtype)
    program = dynexport.export(torch.linalg.solve, (a, b))
    expected = torch.linalg.solve(a.float(), b.float()).to(dtype)
    assert_close(program(a, b), expected)


def test_singular_matrix_gives_non_finite_values():
    # PyTorch raises; the graph divides by a zero pivot.
    program = dynexport.export(torch.linalg.inv, (_invertible(3, 3),))
    assert not program(torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]])).isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("pivoting", [False, True], ids=["diagonal-dominant", "rows-reversed"])
def test_small_static_inverse_is_a_closed_form(n, pivoting, dtype):
    # The adjugate over the determinant (Laplace's expansion: onnxruntime has no float64 Det): no
    # Loop, at most 14 nodes (camera intrinsics, 2x2 Jacobians).
    torch.manual_seed(0)
    program = _batch_dynamic(torch.linalg.inv, _invertible(3, n, n, dtype=dtype, pivoting=pivoting))
    assert "Loop" not in op_histogram(program)
    assert len(program.model.graph) <= 14
    other = _invertible(5, n, n, dtype=dtype, pivoting=pivoting)
    assert_close(program(other), torch.linalg.inv(other))  # in onnxruntime itself


def test_inverse_graph_is_one_loop():
    # 16 ops per column (and an Identity of the loop's condition), 8 around the loop.
    program = dynexport.export(torch.linalg.inv, (_invertible(2, 4, 4),))
    around = {"Concat": 1, "Loop": 1, "Slice": 1, "Reshape": 2, "Transpose": 2, "GatherND": 1, "Div": 1}
    assert op_histogram(program) == around
    (loop,) = (node for node in program.model.graph if node.op_type == "Loop")
    assert len(loop.attributes["body"].as_graph()) <= 17


def test_empty_matrices():
    # A Loop of no iteration stacks its steps' outputs in whatever shape: they are reshaped.
    assert_exports_equivalent(
        lambda a, b, c: (
            torch.linalg.inv_ex(a), torch.linalg.solve_ex(a, b), torch.linalg.inv(c), torch.linalg.solve(c, c),
        ),
        (torch.randn(2, 0, 0), torch.randn(0, 3), torch.randn(0, 3, 3)),
    )


def _singular_at(a, columns):
    """``a`` with matrix i's column ``columns[i]`` zero (None: kept): LU's pivot there is exactly
    0, whatever the order of its arithmetic, and info is that column + 1."""
    a = a.clone()
    for i, column in enumerate(columns):
        if column is not None:
            a[i, ..., column] = 0
    return a


def test_info_marks_singular_matrices():
    # kornia's safe_inverse_with_mask: inv_ex's info says which inverses hold.
    # solve_ex's info has A's batch, whatever B's broadcasts it to.
    def safe_inverse_and_solve(a, b, c):
        inverse, info = torch.linalg.inv_ex(a)
        ok = (info == 0)[..., None, None]
        x, solved = torch.linalg.solve_ex(a, b)
        y, also_solved = torch.linalg.solve_ex(a[:, 0], c)
        masked = torch.where(ok, inverse, 0), torch.where(ok, x, 0), torch.where(ok[:, 0], y, 0)
        return info, solved, also_solved, *masked

    torch.manual_seed(0)
    a = _singular_at(_invertible(4, 1, 4, 4, pivoting=True), [None, 0, 1, 3])
    b, c = torch.randn(1, 3, 4, 2), torch.randn(2, 1, 4, 3)
    _batch_dynamic(safe_inverse_and_solve, a, b, c, batched=[True, False, False])


class _PinholeCamera(torch.nn.Module):
    """Pixels (u, v) at depth d back to camera coordinates: d * K^-1 [u, v, 1]^T."""

    def forward(self, intrinsics, pixels, depth):
        homogeneous = torch.cat([pixels, torch.ones_like(pixels[..., :1])], dim=-1)  # [B, N, 3]
        rays = homogeneous @ torch.linalg.inv(intrinsics).transpose(-1, -2)
        return rays * depth.unsqueeze(-1)


def test_camera_unprojection_and_jacobian_inverse():
    # A camera model's intrinsics and a First-Order-Motion-style keypoint Jacobian [B, K, 2, 2].
    torch.manual_seed(0)

    def intrinsics(batch):
        k = torch.zeros(batch, 3, 3)
        k[:, 0, 0], k[:, 1, 1] = 500 + 100 * torch.rand(batch), 500 + 100 * torch.rand(batch)
        k[:, :2, 2], k[:, 2, 2] = 320 * torch.rand(batch, 2), 1
        return k

    camera = _PinholeCamera().eval()

    def model(k, pixels, depth, jacobian):
        return camera(k, pixels, depth), torch.matmul(jacobian, torch.inverse(jacobian.flip(-1)))

    def inputs(batch, points):
        pixels, depth = 640 * torch.rand(batch, points, 2), 1 + 10 * torch.rand(batch, points)
        return intrinsics(batch), pixels, depth, torch.eye(2) + 0.3 * torch.randn(batch, 10, 2, 2)

    batch, points = torch.export.Dim("batch"), torch.export.Dim("points")
    assert_exports_equivalent(
        model, inputs(2, 5),
        dynamic_shapes=({0: batch}, {0: batch, 1: points}, {0: batch, 1: points}, {0: batch}),
        resized=[inputs(4, 9)],
    )
