"""Ops whose output size depends on tensor values (unbacked SymInts in the FX graph).

Each model is exported once and run on inputs that give a different data-dependent size than
the export inputs did; the ONNX output dim must be symbolic, not the size seen at export.
"""

from __future__ import annotations

import pytest
import torch

import dynexport
from dynexport.errors import TranslationError
from tests.equivalence import assert_exports_equivalent

N = torch.export.Dim("n")


class Unary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Binary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


def _assert_symbolic_first_dims(program) -> None:
    for output in program.model.graph.outputs:
        assert output.shape is not None and len(output.shape) > 0
        assert not isinstance(output.shape[0], int), f"{output.name} has a fixed size {output.shape[0]}"


x_signs = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 6.0])
more_positive = torch.tensor([1.0, 2.0, 3.0, -4.0, 5.0, 6.0, 7.0, 8.0])
all_negative = -more_positive.abs()


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: torch.nonzero(x > 0), id="nonzero"),
        pytest.param(lambda x: torch.masked_select(x, x > 0), id="masked_select"),
        pytest.param(lambda x: x[x > 0] * 2, id="boolean_index"),
        pytest.param(lambda x: torch.argwhere(x < 2), id="argwhere"),
    ],
)
def test_mask_selections_follow_the_data(fn):
    program = assert_exports_equivalent(
        Unary(fn), (x_signs,), dynamic_shapes=({0: N},), resized=[(more_positive,), (all_negative,)]
    )
    _assert_symbolic_first_dims(program)


def test_boolean_mask_over_rows_and_over_a_matrix():
    rows = Binary(lambda x, keep: (x[keep], x[x > 0]))
    x = x_signs.reshape(3, 2)
    program = assert_exports_equivalent(
        rows,
        (x, torch.tensor([True, False, True])),
        resized=[(x, torch.tensor([False, False, True])), (-x, torch.tensor([True, True, True]))],
    )
    _assert_symbolic_first_dims(program)


def test_nonzero_as_tuple_indexes_back():
    def coordinates(x):
        rows, cols = torch.nonzero(x > 0, as_tuple=True)
        return rows, x[rows, cols]

    x = x_signs.reshape(2, 3)
    assert_exports_equivalent(Unary(coordinates), (x,), resized=[(-x,), (x.abs(),)])


def test_unique_sorted_with_inverse_and_counts():
    def distinct(x):
        return torch.unique(x, return_inverse=True, return_counts=True)

    program = assert_exports_equivalent(
        Unary(distinct),
        (torch.tensor([[3, 1], [3, 2]]),),
        dynamic_shapes=({0: N},),
        resized=[(torch.tensor([[5, 5], [5, 1], [7, 7]]),), (torch.tensor([[4, 4]]),)],
    )
    values, _, counts = program.model.graph.outputs
    assert not isinstance(values.shape[0], int) and not isinstance(counts.shape[0], int)


def test_unique_values_only_and_along_a_dim():
    def distinct(x):
        return torch.unique(x), torch.unique(x, dim=0, return_counts=True)

    assert_exports_equivalent(
        Unary(distinct),
        (torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 1.0]]),),
        dynamic_shapes=({0: N},),
        resized=[(torch.tensor([[3.0, 2.0], [1.0, 2.0], [0.0, 1.0], [3.0, 2.0], [0.0, 0.0]]),)],
    )


def test_unique_consecutive_runs():
    def runs(x):
        return torch.unique_consecutive(x, return_inverse=True, return_counts=True)

    assert_exports_equivalent(
        Unary(runs),
        (torch.tensor([1.0, 1.0, 2.0, 2.0, 3.0, 1.0]),),
        dynamic_shapes=({0: N},),
        resized=[(torch.tensor([1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 4.0]),), (torch.tensor([7.0]),)],
    )


@pytest.mark.parametrize("dim", [0, 1])
def test_unique_consecutive_slices_along_a_dim(dim):
    def runs(x):
        return torch.unique_consecutive(x, return_inverse=True, return_counts=True, dim=dim)

    x = torch.tensor([[1.0, 1.0, 2.0, 2.0, 3.0], [0.0, 0.0, 5.0, 5.0, 5.0], [0.0, 0.0, 5.0, 5.0, 5.0], [1.0, 2.0, 2.0, 2.0, 2.0]])
    assert_exports_equivalent(
        Unary(runs),
        (x,),
        dynamic_shapes=({0: N, 1: torch.export.Dim("m")},),
        resized=[(x.t().contiguous(),), (torch.randint(0, 2, (7, 3)).float(),), (torch.zeros(1, 2),)],
    )


def test_unique_consecutive_with_a_negative_dim_names_the_dim_to_pass():
    with pytest.raises(TranslationError, match=r"dim=1"):
        dynexport.export(Unary(lambda x: torch.unique_consecutive(x, dim=-1)), (torch.ones(3, 2),))


def test_item_feeds_creation_and_slicing_sizes():
    def sized_by(n, x):
        count = n.item()
        return torch.full((count, 2), 2.0) * x.sum(), x[:count], torch.arange(count)

    x = torch.arange(6.0)
    program = assert_exports_equivalent(
        Binary(sized_by), (torch.tensor(2), x), resized=[(torch.tensor(5), x), (torch.tensor(0), x)]
    )
    _assert_symbolic_first_dims(program)


def test_tolist_sizes_a_split():
    def split_by(x, sizes):
        return torch.split(x, sizes.tolist())

    x = torch.arange(6.0)
    assert_exports_equivalent(
        Binary(split_by), (x, torch.tensor([2, 4])), resized=[(x, torch.tensor([5, 1])), (x, torch.tensor([0, 6]))]
    )


def test_repeat_interleave_by_a_tensor_of_counts():
    def repeat(x, repeats):
        return x.repeat_interleave(repeats, dim=0), x.repeat_interleave(repeats[:2], dim=1), torch.repeat_interleave(repeats)

    x = torch.randn(3, 2)
    program = assert_exports_equivalent(
        Binary(repeat),
        (x, torch.tensor([1, 0, 2])),
        resized=[(x, torch.tensor([3, 1, 0])), (x, torch.tensor([0, 0, 0])), (x, torch.tensor([4, 4, 4]))],
    )
    assert not isinstance(program.model.graph.outputs[0].shape[0], int)


def test_unique_of_bfloat16_values():
    # ONNX Unique and Compress take no bfloat16: the values are compared as float32.
    x = torch.tensor([[1.5, 2.0, 1.5], [3.0, 3.0, 2.0]], dtype=torch.bfloat16)
    assert_exports_equivalent(
        Unary(lambda x: (torch.unique(x, return_inverse=True, return_counts=True), torch.unique_consecutive(x, return_counts=True), torch.unique(x, dim=0))),
        (x,),
    )


# --- Dynamic dims that are empty at run time. ----------------------------------------------------


def test_roll_of_a_dim_that_is_empty_at_run_time():
    # The shift is taken modulo the run-time size, which may be 0.
    def rolled(x):
        return torch.roll(x, 3), torch.roll(x, -2, 0)

    assert_exports_equivalent(
        Unary(rolled),
        (torch.randn(4, 3),),
        dynamic_shapes=({0: torch.export.Dim("n", min=0)},),
        resized=[(torch.randn(0, 3),), (torch.randn(7, 3),)],
    )


def test_group_norm_of_a_batch_that_is_empty_at_run_time():
    model = torch.nn.GroupNorm(2, 4).eval()
    assert_exports_equivalent(
        model,
        (torch.randn(3, 4, 5),),
        dynamic_shapes=({0: torch.export.Dim("n", min=0), 2: torch.export.Dim("length")},),
        resized=[(torch.randn(0, 4, 5),), (torch.randn(6, 4, 7),)],
    )


class GroupedQueryAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_grouped_query_attention_of_a_batch_that_is_empty_at_run_time():
    batch, steps = torch.export.Dim("batch", min=0), torch.export.Dim("steps")
    dims = {0: batch, 2: steps}

    def qkv(b, s):
        return torch.randn(b, 4, s, 8), torch.randn(b, 2, s, 8), torch.randn(b, 2, s, 8)

    assert_exports_equivalent(
        GroupedQueryAttention(), qkv(2, 5), dynamic_shapes=(dims, dims, dims), resized=[qkv(0, 3), qkv(3, 7)]
    )
