"""Matrix inverse and linear solve: linalg_inv (inverse), linalg_inv_ex, linalg_solve and
_linalg_solve_ex.

ONNX has no factorization, inverse or solve: Gauss-Jordan elimination with partial pivoting, one
Loop iteration per column, so that n and the batch may be dynamic. A singular matrix, for which
PyTorch raises (its _ex variants report it in info), divides by a zero pivot: inf and NaN in the
result. PyTorch's error checks (_linalg_check_errors) read info and return nothing; the
translator skips them, as it skips every node whose result nothing reads.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from dynexport.ops._helpers import (
    cast,
    ints,
    rank,
    reduce,
    reshape,
    shape_of,
    shape_tensor,
    size_of,
    with_shape,
)
from dynexport.ops.linalg import equal_batches
from dynexport.registry import translates

aten = torch.ops.aten

_INT32, _INT64 = ir.DataType.INT32, ir.DataType.INT64
# PyTorch's CPU kernels refuse float16 and bfloat16; the graph computes them in float32.
_SOLVED_IN = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _gauss_jordan(
    ctx, augmented: ir.Value, n: int | ir.Value, rank_: int, pivots: bool
) -> tuple[ir.Value, ir.Value | None]:
    """X for the augmented matrix [A | B] ([*, n, n + k], of rank ``rank_``): A X = B; and, with
    ``pivots``, the pivots [n, *, 1] (else None).

    Rows are not swapped, which would move the whole matrix at every step: each step picks its
    pivot among the rows no earlier step picked, and eliminates its column from every other row
    with LU's multipliers. At the end, the row of step k holds X's row k times its pivot."""
    dtype = augmented.dtype
    if isinstance(n, int):
        count, rows = ctx.constant(n, _INT64), ctx.constant(torch.arange(n).reshape(n, 1), _INT64)
    else:
        count = n
        rows = ctx.op.Unsqueeze(ctx.op.Range(ctx.constant(0, _INT64), n, ctx.constant(1, _INT64)), ints(ctx, [-1]))
    step_index, condition = ctx.value("step", 0), ctx.value("condition", True)
    matrix, unpicked = (
        ir.Value(name=f"{ctx.name}.{name}", type=ir.TensorType(dtype), shape=ir.Shape([None] * rank_))
        for name in ("augmented", "unpicked")
    )
    # onnxruntime's Where is slow (a scalar broadcast costs as much as the whole step): the rows
    # are masked with 0 and 1 instead.
    none_picked = ctx.op.ConstantOfShape(
        ctx.op.Concat(shape_of(ctx, augmented, end=-1), ints(ctx, [1]), axis=0), value=ir.tensor([1], dtype=dtype)
    )

    def step():
        # Every value [*, n, 1] (one per row) but the matrix and its pivot row [*, 1, n + k].
        start = ctx.op.Unsqueeze(step_index, ints(ctx, [0]))
        column = ctx.op.Slice(matrix, start, ctx.op.Add(start, ints(ctx, [1])), ints(ctx, [-1]))  # faster than Gather
        candidates = ctx.op.Mul(column, unpicked)
        # The first largest in the rows' own order (LAPACK's: in its swapped order, so a tie may
        # pick another row, as good). Where every candidate is 0 (singular), the pivot is 0.
        pivot_index = ctx.op.ArgMax(ctx.op.Abs(candidates), axis=-2, keepdims=1)
        pivot = ctx.op.GatherElements(candidates, pivot_index, axis=-2)
        pivot_row = ctx.op.GatherND(matrix, pivot_index, batch_dims=rank_ - 2)
        is_pivot = cast(ctx, ctx.op.Equal(rows, pivot_index), dtype)
        # The pivot row's multiplier is 0: it stays as it is.
        multipliers = ctx.op.Div(ctx.op.Sub(column, ctx.op.Mul(is_pivot, pivot)), pivot)
        eliminated = ctx.op.Sub(matrix, ctx.op.Mul(multipliers, pivot_row))
        return [condition, eliminated, ctx.op.Sub(unpicked, is_pivot), pivot_index, pivot]

    body = ctx.subgraph("elimination", [step_index, condition, matrix, unpicked], step)
    reduced, all_picked, order, diagonal = ctx.op.Loop(
        count, ctx.constant(True, ir.DataType.BOOL), augmented, none_picked, body=body, _outputs=4
    )
    for value, value_dtype in ((reduced, dtype), (all_picked, dtype), (order, _INT64), (diagonal, dtype)):
        value.dtype = value_dtype  # the builder cannot tell a Loop's output types
    solution = ctx.op.Slice(reduced, shape_tensor(ctx, [n]), ctx.constant([2**63 - 1], _INT64), ints(ctx, [-1]))
    # The steps' pivot positions and pivots ([*, 1, 1]) stacked, as [n, *, 1] (a reshape: onnxruntime
    # sizes what a Loop of no iteration stacks arbitrarily), then [*, n, 1]: step k's as row k.
    if augmented.shape is None:
        per_step = ctx.op.Concat(shape_tensor(ctx, [n]), shape_of(ctx, augmented, end=-2), ints(ctx, [1]), axis=0)
    else:
        per_step = [n, *(size_of(ctx, augmented, d) for d in range(rank_ - 2)), 1]
    order, diagonal = (reshape(ctx, x, per_step) for x in (order, diagonal))
    steps_last = [*range(1, rank_ - 1), 0, rank_ - 1]
    order, scale = (ctx.op.Transpose(x, perm=steps_last) for x in (order, diagonal))
    X = ctx.op.Div(ctx.op.GatherND(solution, order, batch_dims=rank_ - 2), scale)
    return X, diagonal if pivots else None


def _info(ctx, pivots: ir.Value, n: int | ir.Value) -> ir.Value:
    """LAPACK's info from the pivots [n, *, 1] (U's diagonal): 1 + the position of the first
    zero, 0 where none is."""
    if isinstance(n, int) and n == 0:  # ArgMax takes no empty axis
        return ctx.op.ConstantOfShape(shape_of(ctx, pivots, 1, -1), value=ir.tensor([0], dtype=_INT32))
    zero = cast(ctx, ctx.op.Equal(pivots, ctx.constant(0, pivots.dtype)), _INT32)
    first = cast(ctx, ctx.op.ArgMax(zero, axis=0, keepdims=0), _INT32)
    found = reduce(ctx, "ReduceMax", zero, [0], keepdims=False)
    return ctx.op.Squeeze(ctx.op.Mul(found, ctx.op.Add(first, ctx.constant(1, _INT32))), ints(ctx, [-1]))


# Cofactor i, j of a 3x3 matrix is A[i+1, j+1] A[i+2, j+2] - A[i+1, j+2] A[i+2, j+1], indices
# mod 3 (the signs come out of the cyclic order); of a 2x2 one, the opposite corner, signed.
_NEXT, _AFTER_NEXT = [1, 2, 0], [2, 0, 1]
_CLOSED_FORM_UP_TO = 3


def _cofactors(ctx, A: ir.Value, n: int) -> ir.Value:
    """The cofactor matrix of each [n, n] matrix of ``A`` (n 2 or 3)."""
    if n == 2:
        swapped = ctx.constant([1, 0], _INT64)
        corners = ctx.op.Gather(ctx.op.Gather(A, swapped, axis=-2), swapped, axis=-1)
        return ctx.op.Mul(corners, ctx.constant(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]), A.dtype))
    rows = [ctx.op.Gather(A, ctx.constant(order, _INT64), axis=-2) for order in (_NEXT, _AFTER_NEXT)]

    def columns(x: ir.Value, order: list[int]) -> ir.Value:
        return ctx.op.Gather(x, ctx.constant(order, _INT64), axis=-1)

    return ctx.op.Sub(
        ctx.op.Mul(columns(rows[0], _NEXT), columns(rows[1], _AFTER_NEXT)),
        ctx.op.Mul(columns(rows[0], _AFTER_NEXT), columns(rows[1], _NEXT)),
    )


def _closed_form_inverse(ctx, A: ir.Value, n: int) -> ir.Value:
    """The adjugate over the determinant, for static n up to 3: no Loop, a dozen nodes (the
    cofactor form of small inverses, as Eigen's). Its error is Gauss-Jordan's there."""
    if n == 1:
        return ctx.op.Reciprocal(A)
    cofactors = _cofactors(ctx, A, n)
    # Laplace's expansion along the first row (onnxruntime has no float64 Det).
    first_row = ctx.op.Slice(ctx.op.Mul(A, cofactors), ints(ctx, [0]), ints(ctx, [1]), ints(ctx, [-2]))
    determinant = reduce(ctx, "ReduceSum", first_row, [-1], keepdims=True)
    adjugate = ctx.op.Transpose(cofactors, perm=[*range(rank(A) - 2), rank(A) - 1, rank(A) - 2])
    return ctx.op.Div(adjugate, determinant)


def _in_solved_dtype(ctx, solve, *operands: ir.Value) -> tuple[ir.Value, ir.Value | None]:
    """``solve(*operands)``, (X, pivots), computed in float32 or float64; X cast back."""
    dtype = operands[0].dtype
    compute = dtype if dtype in _SOLVED_IN else ir.DataType.FLOAT
    X, pivots = solve(*(cast(ctx, x, compute) for x in operands))
    return cast(ctx, X, dtype), pivots


def _inverse(ctx, A: ir.Value, pivots: bool) -> tuple[ir.Value, ir.Value | None]:
    n = size_of(ctx, A, -1)
    if isinstance(n, int):
        identity = ctx.constant(torch.eye(n), A.dtype)
    else:
        rows = ctx.op.Range(ctx.constant(0, _INT64), n, ctx.constant(1, _INT64))
        identity = cast(ctx, ctx.op.Equal(ctx.op.Unsqueeze(rows, ints(ctx, [-1])), rows), A.dtype)
    augmented = ctx.op.Concat(A, ctx.op.Expand(identity, shape_of(ctx, A)), axis=-1)
    return _gauss_jordan(ctx, with_shape(augmented, [*A.shape[:-1], _static_sum(n, n)]), n, rank(A), pivots)


def _solve(ctx, A: ir.Value, B: ir.Value, left: bool, vector: bool, pivots: bool) -> tuple[ir.Value, ir.Value | None]:
    """torch.linalg.solve (and the pivots of A's batch): B [*, n] where ``vector``, else
    [*, n, k] ([*, k, n] unless ``left``); the batch dims broadcast."""
    n, rank_ = size_of(ctx, A, -1), max(rank(A), rank(B) + vector)
    if vector:
        B = with_shape(ctx.op.Unsqueeze(B, ints(ctx, [-1])), [*B.shape, 1])
    if not left:
        # X A = B is A^T X^T = B^T (PyTorch refuses a vector B here).
        A, B = _transpose_matrices(ctx, A), _transpose_matrices(ctx, B)
    if rank(B) == 2 and rank(A) > 2:
        expanded = ctx.op.Expand(B, ctx.op.Concat(shape_of(ctx, A, end=-2), ints(ctx, [1, 1]), axis=0))
        B = with_shape(expanded, [*A.shape[:-2], *B.shape])
    broadcast = A.shape[:-2] != B.shape[:-2]
    if broadcast:
        augmented = ctx.op.Concat(*equal_batches(ctx, A, B), axis=-1)
    else:
        augmented = with_shape(ctx.op.Concat(A, B, axis=-1), [*A.shape[:-1], _static_sum(n, B.shape[-1])])
    X, factored = _gauss_jordan(ctx, augmented, n, rank_, pivots)
    if broadcast and pivots:
        factored = _pivots_of(ctx, factored, A, rank_)
    if not left:
        X = ctx.op.Transpose(X, perm=[*range(rank_ - 2), rank_ - 1, rank_ - 2])
    return (ctx.op.Squeeze(X, ints(ctx, [-1])) if vector else X), factored


def _static_sum(*sizes) -> int | None:
    """The sum of static sizes (ints); None if one is dynamic."""
    return sum(sizes) if all(isinstance(size, int) for size in sizes) else None


def _pivots_of(ctx, pivots: ir.Value, A: ir.Value, rank_: int) -> ir.Value:
    """The pivots [n, *, 1] of the broadcast batch cut to A's batch (B's batch repeats A's
    matrices), as PyTorch factors A alone."""
    added = rank_ - rank(A)
    ends = ctx.op.Concat(ints(ctx, [1] * added), shape_of(ctx, A, end=-2), axis=0)
    batch = list(range(1, rank_ - 1))
    cut = ctx.op.Slice(pivots, ints(ctx, [0] * len(batch)), ends, ints(ctx, batch))
    return ctx.op.Squeeze(cut, ints(ctx, batch[:added])) if added else cut


def _transpose_matrices(ctx, x: ir.Value) -> ir.Value:
    *batch, rows, columns = x.shape
    transposed = ctx.op.Transpose(x, perm=[*range(len(batch)), len(batch) + 1, len(batch)])
    return with_shape(transposed, [*batch, columns, rows])


def _solved_vectors(ctx, A: ir.Value) -> bool:
    # PyTorch takes B as a vector (or a batch of them) where the result has a dim fewer than A.
    result = ctx.out[0] if isinstance(ctx.out, (tuple, list)) else ctx.out
    return result.dim() == rank(A) - 1


def _solution_and_info_only(node: torch.fx.Node) -> bool:
    # The LU factors and pivots only serve backward.
    return all(user.args[1] in (0, 3) or not user.users for user in node.users)


@translates(aten.linalg_inv.default, aten.inverse.default)
def linalg_inv(ctx, A):
    n = size_of(ctx, A, -1)
    if isinstance(n, int) and 1 <= n <= _CLOSED_FORM_UP_TO:
        return _in_solved_dtype(ctx, lambda A: (_closed_form_inverse(ctx, A, n), None), A)[0]
    return _in_solved_dtype(ctx, lambda A: _inverse(ctx, A, pivots=False), A)[0]


@translates(aten.linalg_inv_ex.default)
def linalg_inv_ex(ctx, A, *, check_errors=False):
    inverse, pivots = _in_solved_dtype(ctx, lambda A: _inverse(ctx, A, pivots=True), A)
    return inverse, _info(ctx, pivots, size_of(ctx, A, -1))


@translates(aten.linalg_solve.default)
def linalg_solve(ctx, A, B, *, left=True):
    vector = _solved_vectors(ctx, A)
    return _in_solved_dtype(ctx, lambda A, B: _solve(ctx, A, B, left, vector, pivots=False), A, B)[0]


@translates(aten._linalg_solve_ex.default, checker=_solution_and_info_only)
def linalg_solve_ex(ctx, A, B, *, left=True, check_errors=False):
    vector = _solved_vectors(ctx, A)
    X, pivots = _in_solved_dtype(ctx, lambda A, B: _solve(ctx, A, B, left, vector, pivots=True), A, B)
    return X, None, None, _info(ctx, pivots, size_of(ctx, A, -1))
