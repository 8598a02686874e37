"""Indexing rules (gathers, advanced indexing and index_put, scatters, masked_fill, tril/triu,
repeat, roll, flip) against onnxruntime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.equivalence import (
    assert_batch_dynamic_equivalent,
    assert_exports_equivalent,
    op_histogram,
)
from tests.opset_parametrization import max_min_scatter_refused_below_18

B = torch.export.Dim("batch", min=2)
COLUMNS = torch.export.Dim("columns", min=4)
aten = torch.ops.aten
DTYPES = [torch.float32, torch.float16, torch.float64, torch.int64, torch.int32]


def _batch_dynamic(fn, inputs, batched, **options):
    return assert_batch_dynamic_equivalent(fn, *inputs, batched=batched, smaller=True, dim=B, **options)


def _data(dtype, *shape):
    return (torch.randn(shape) * 10).to(dtype)


# -- lookups and gathers ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding_with_dynamic_token_batch(dtype, index_dtype):
    weight = _data(dtype, 10, 4)
    tokens = torch.tensor([[1, 2, 9], [0, 0, 5], [3, 4, 4]], dtype=index_dtype)
    program = _batch_dynamic(lambda w, t: F.embedding(t, w, padding_idx=0), (weight, tokens), (False, True))
    assert op_histogram(program)["Gather"] == 1


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim):
    x = torch.randn(4, 5)
    _batch_dynamic(
        lambda x: (x.index_select(dim, torch.tensor([1, 0, 1, 1])), x.index_select(dim, torch.tensor(1))),
        (x,), (True,),
    )


@pytest.mark.parametrize("dim", [0, -1])
def test_index_select_of_a_0d_tensor(dim):
    assert_exports_equivalent(
        lambda x, i: (x.index_select(dim, i), x.index_select(dim, i[0])), (torch.tensor(2.5), torch.tensor([0]))
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dtype, dim):
    x = _data(dtype, 3, 4)
    index = torch.tensor([[0, 1], [1, 1], [1, 0]])
    _batch_dynamic(lambda x, i: torch.gather(x, dim, i), (x, index), (True, True))


def test_gather_with_index_smaller_than_input():
    index = torch.tensor([[5, 0], [1, 3]])
    _batch_dynamic(lambda x, i: torch.gather(x, 1, i), (torch.randn(4, 6), index), (True, False))


# -- advanced indexing ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i: x[i],
        lambda x, i: x[:, i],
        lambda x, i: x[..., i],
        lambda x, i: x[i.view(2, 2)],
        lambda x, i: x[:, i.view(2, 2), 1:],
        lambda x, i: x[i, i],
        lambda x, i: x[:, i, i],
        lambda x, i: x[i, :, i],
        lambda x, i: x[i.view(4, 1), i[:3]],
        lambda x, i: x[:, i.view(4, 1), i[:3]],
        lambda x, i: x[1:, i.view(4, 1)][..., i[:2]],
        lambda x, i: x[i, 1],
        lambda x, i: x[:, 2, i],
    ],
    ids=["first", "second", "last", "2d_index", "2d_index_middle", "pair_front", "pair_middle",
         "split_pair", "broadcast_front", "broadcast_middle", "two_steps", "tensor_and_int",
         "int_and_tensor_middle"],
)
def test_index_tensor_with_negative_indices(fn, dtype):
    x = _data(dtype, 4, 4, 3) if dtype is not torch.bool else torch.randn(4, 4, 3) > 0
    i = torch.tensor([1, -1, 0, -3])
    assert_exports_equivalent(fn, (x, i), dynamic_shapes=({1: COLUMNS}, None), resized=[(torch.cat([x] * 2, 1), i)])


def test_index_tensor_with_dynamic_index_length():
    x = torch.randn(5, 6)
    i = torch.tensor([0, 4, -2])
    j = torch.tensor([1, 5, -6])
    assert_exports_equivalent(
        lambda x, i, j: (x[i, j], x[:, j], x[i]),
        (x, i, j),
        dynamic_shapes=(None, {0: B}, {0: B}),
        resized=[(x, torch.tensor([4, 3, 2, 1, 0, -1]), torch.tensor([0, 1, 2, 3, 4, 5])), (x, i[:2], j[:2])],
    )


def _padding_mask_read(mask, length, offset: int = 0, start: int = 0):
    """transformers' padding mask function: ``mask[batch_idx, kv_idx]`` over index aranges."""
    batch = torch.arange(mask.shape[0])[:, None, None, None]
    kv = (torch.arange(start, length) + offset)[None, None, None, :]
    return mask[batch, kv]


def test_indexing_every_dim_by_aranges_reads_the_leading_columns_without_a_gather_nd():
    past, seq = torch.export.Dim("past", min=0), torch.export.Dim("seq")
    width = torch.export.Dim("width")

    def read(mask, past_keys, new_tokens):
        return _padding_mask_read(mask, past_keys.shape[0] + new_tokens.shape[0]) * 2

    mask, keys, tokens = torch.randint(0, 2, (2, 9)).bool(), torch.randn(3), torch.randn(4)
    program = assert_exports_equivalent(
        lambda mask, keys, tokens: read(mask, keys, tokens).int(),
        (mask, keys, tokens),
        dynamic_shapes=({0: B, 1: width}, {0: past}, {0: seq}),
        # masks as wide as past + new, and wider (their leading columns are read)
        resized=[(torch.randint(0, 2, (3, 12)).bool(), torch.randn(5), torch.randn(7)),
                 (torch.randint(0, 2, (4, 1)).bool(), torch.randn(0), torch.randn(1))],
    )
    assert "GatherND" not in op_histogram(program) and op_histogram(program)["Gather"] == 1
    # A mask narrower than past + new fails, as in PyTorch, also in onnxruntime.
    narrow = (torch.randint(0, 2, (2, 5)).bool(), torch.randn(3), torch.randn(4))
    with pytest.raises(IndexError):
        read(*narrow)
    with pytest.raises(Exception, match="out of data bounds"):
        program(*narrow)


def test_indexing_by_aranges_along_swapped_axes_transposes():
    def swapped(x):
        return x[torch.arange(x.shape[0])[None, :], torch.arange(x.shape[1])[:, None]]

    x = torch.randn(3, 5)
    program = assert_exports_equivalent(
        swapped, (x,), dynamic_shapes=({0: B, 1: COLUMNS},), resized=[(torch.randn(6, 4),)]
    )
    assert op_histogram(program) == {"Transpose": 1}


@pytest.mark.parametrize("offset, start", [(1, 0), (0, 1)])
def test_aranges_that_do_not_start_at_zero_still_gather(offset, start):
    def read(mask):
        return _padding_mask_read(mask, mask.shape[1] - 1, offset=offset, start=start)

    mask = torch.randn(2, 9)
    program = assert_exports_equivalent(
        read, (mask,), dynamic_shapes=({0: B, 1: COLUMNS},), resized=[(torch.randn(5, 4),)]
    )
    assert "GatherND" in op_histogram(program)


def test_unsafe_index_and_index_put():
    x = torch.randn(3, 4, 5)
    i = torch.tensor([3, 0, -1])
    _batch_dynamic(
        lambda x, i: (
            aten._unsafe_index(x, [None, i.view(3, 1), i[:2]]),
            aten._unsafe_index(x, [None, i]),
            aten._unsafe_index_put(x, [None, i], torch.tensor(2.0), True),
        ),
        (x, i), (True, False),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_boolean_mask_index_has_data_dependent_size(dtype):
    def fn(x, m):
        return x[x > 0], x[m], x[m[:, 0]], x[:, m[0]], x[x > 0].shape[0] + x[m].sum()

    x = _data(dtype, 4, 5)
    program = _batch_dynamic(fn, (x, torch.randn(4, 5) > 0), (True, True))
    assert op_histogram(program)["NonZero"] >= 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(
    "indices, values_shape",
    [
        (lambda i: [i], (3, 5, 3)),
        (lambda i: [i], (5, 1)),
        (lambda i: [i], ()),
        (lambda i: [None, i], (4, 3, 3)),
        (lambda i: [None, i], (3, 1)),
        (lambda i: [i, i + 1], (3, 3)),
        (lambda i: [i, None, i.view(3, 1)], (3, 3, 5)),
        (lambda i: [i, None, i.view(3, 1)], (5,)),
        (lambda i: [None, i, i + 1], (4, 3)),
        (lambda i: [None, i.view(3, 1), i[:2]], (2,)),
        (lambda i: [None, None, i[1:].abs()], (4, 1, 2)),
    ],
    ids=["rows", "rows_broadcast", "scalar", "columns", "columns_broadcast", "pairs", "split",
         "split_broadcast", "middle", "middle_broadcast", "last"],
)
def test_index_put(indices, values_shape, accumulate, dtype):
    x = _data(dtype, 4, 5, 3)
    i = torch.tensor([0, -2, 1])
    v = _data(dtype, *values_shape)
    assert_exports_equivalent(lambda x, i, v: torch.ops.aten.index_put(x, indices(i), v, accumulate), (x, i, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_put_accumulates_duplicates(dtype):
    x = _data(dtype, 4, 3)
    i = torch.tensor([0, 2, 0, -4, 1])
    v = _data(dtype, 5, 3)
    _batch_dynamic(lambda x, i, v: x.index_put((i,), v, accumulate=True), (x, i, v), (False, True, True))


def test_setitem_with_dynamic_batch():
    def fn(x, i, v, w):
        x = x.clone()
        x[i] = v
        x[:, i] = 0.5
        x[x > 1] = w
        x[:, 1, 1:] = -7.0
        return x

    x = torch.randn(3, 5, 4)
    i = torch.tensor([1, -1])
    _batch_dynamic(fn, (x, i, torch.randn(2, 5, 4), torch.tensor(3.0)), (True, False, False, False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize(
    "indices, values_shape",
    [
        (lambda m, c: [m], ()),
        (lambda m, c: [None, c], (2,)),
        (lambda m, c: [m[:, :, 0]], (2,)),
        (lambda m, c: [m[:, 0, 0], torch.tensor([3])], ()),
    ],
    ids=["full_mask", "column_mask", "leading_mask", "mask_and_tensor"],
)
def test_index_put_with_boolean_masks(indices, values_shape, dtype):
    x = _data(dtype, 4, 5, 2)
    mask = x > 0
    columns = torch.tensor([True, False, True, True, False])
    values = _data(dtype, *values_shape)

    def fn(x, m, c, v):
        return torch.ops.aten.index_put(x, indices(m, c), v), torch.ops.aten.index_put(x, indices(m, c), v, True)

    _batch_dynamic(fn, (x, mask, columns, values), (True, True, False, False))


@pytest.mark.parametrize("dtype", DTYPES + [torch.int16, torch.bool])
def test_masked_fill(dtype):
    # In onnxruntime itself: it has no bool or int16 Where kernel.
    x = _data(dtype, 3, 4) if dtype is not torch.bool else torch.randn(3, 4) > 0
    mask = torch.randn(3, 4) > 0
    row_mask = torch.tensor([True, False, False, True])
    _batch_dynamic(
        lambda x, m, r: (
            x.masked_fill(m, 1), x.masked_fill(r, 0), x.masked_fill(m, x[0, 0]), x.masked_fill(~m, torch.tensor(2.0)),
            x.masked_select(r),
        ),
        (x, mask, row_mask), (True, True, False), runtime="onnxruntime",
    )


def test_masked_fill_with_infinities_in_half():
    x = torch.randn(2, 3, dtype=torch.float16)
    _batch_dynamic(lambda x: x.masked_fill(x > 0, float("-inf")), (x,), (True,))


# -- scatters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_src_value_and_add(dtype, dim):
    x = _data(dtype, 3, 4)
    index = torch.tensor([[0, 2], [1, 0], [2, 1]]) if dim == 0 else torch.tensor([[0, -1], [2, 1], [3, 3]])
    index = index.clamp(min=0)
    src = _data(dtype, 3, 2)
    _batch_dynamic(
        lambda x, i, s: (x.scatter(dim, i, s), x.scatter(dim, i, 5), x.scatter_add(dim, i, s)),
        (x, index, src), (False, False, False),
    )


def test_scatter_with_dynamic_rows_and_larger_src():
    x = torch.zeros(3, 6)
    index = torch.tensor([[5, 1], [0, 2], [3, 3]])
    src = torch.randn(3, 4)
    _batch_dynamic(lambda x, i, s: (x.scatter(1, i, s), x.scatter_add(1, i, s)), (x, index, src), (True, True, True))


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
def test_scatter_reduce(reduce):
    x = torch.randn(3, 5)
    index = torch.tensor([[0, 1, 0, 4], [2, 2, 2, 2], [1, 3, 1, 0]])
    src = torch.randn(3, 4)
    with max_min_scatter_refused_below_18(reduce):
        _batch_dynamic(lambda x, i, s: x.scatter_reduce(1, i, s, reduce), (x, index, src), (True, True, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.int32])
@pytest.mark.parametrize("reduce", ["sum", "mean", "prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_mean_and_without_self_like_pytorch(dtype, reduce, include_self):
    # Column 2 is never written; integer means floor negative averages, as PyTorch does.
    x = (torch.tensor([[3.0, -7.0, 5.0, 1.0, -2.0], [4.0, 2.0, -1.0, 9.0, 6.0], [-3.0, 8.0, 0.0, 2.0, -5.0]]) * 2).to(dtype)
    index = torch.tensor([[0, 1, 0, 4], [3, 3, 3, 3], [1, 3, 1, 0]])
    src = torch.tensor([[1.0, -4.0, 2.0, 7.0], [-3.0, 5.0, -6.0, 2.0], [8.0, -1.0, -9.0, 3.0]]).to(dtype)
    with max_min_scatter_refused_below_18(reduce):
        _batch_dynamic(
            lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self), (x, index, src), (True, True, True)
        )


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_of_bools(reduce, include_self):
    # onnxruntime reduces no bools: they scatter as bytes.
    x = torch.tensor([[True, False, True, False, False], [False, True, True, False, True]])
    index = torch.tensor([[0, 1, 0, 4], [3, 3, 3, 3]])
    src = torch.tensor([[False, True, True, False], [True, False, True, True]])
    with max_min_scatter_refused_below_18(reduce):
        _batch_dynamic(
            lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self), (x, index, src), (True, True, True)
        )


def test_scatters_of_0d_tensors():
    x, index, src = torch.tensor(2.0), torch.tensor(0), torch.tensor(5.0)
    assert_exports_equivalent(
        lambda x, i, s: (
            x.scatter(0, i, s), x.scatter(0, i, 3.0), x.scatter_add(0, i, s),
            x.scatter_reduce(0, i, s, "mean", include_self=False), x.index_reduce(0, i.reshape(1), s, "prod"),
        ),
        (x, index, src),
    )
    with max_min_scatter_refused_below_18("amin"):
        assert_exports_equivalent(lambda x, i, s: x.scatter_reduce(0, i, s, "amin"), (x, index, src))


def test_scatter_with_the_deprecated_reduce_argument():
    x, index, src = torch.randn(3, 5), torch.tensor([[0, 1, 0, 4], [2, 2, 2, 2], [1, 3, 1, 0]]), torch.randn(3, 4)
    _batch_dynamic(
        lambda x, i, s: (x.scatter(1, i, s, reduce="add"), x.scatter(1, i, s, reduce="multiply"), x.scatter(1, i, 2.0, reduce="multiply")),
        (x, index, src), (True, True, True),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(dtype, reduce, include_self):
    x, source = (torch.randn(5, 3) * 8).to(dtype), (torch.randn(4, 3) * 8).to(dtype)
    index = torch.tensor([0, 4, 0, 2])
    with max_min_scatter_refused_below_18(reduce):
        _batch_dynamic(
            lambda x, s, i: (x.index_reduce(0, i, s, reduce, include_self=include_self), x.T.index_reduce(1, i, s.T, reduce)),
            (x, source, index), (False, False, False),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize(
    "target",
    [
        lambda x: x[:, 1],
        lambda x: x[:, -1],
        lambda x: x[1],
        lambda x: x[:, 1:3],
        lambda x: x[:, -3:],
        lambda x: x[:, ::2],
        lambda x: x[:, 1:-1:2],
        lambda x: x[:, :, 1],
        lambda x: x[:, 3:10],
    ],
    ids=["select", "select_negative", "select_batch", "slice", "slice_negative", "slice_step",
         "slice_step_bounds", "select_last", "slice_clamped"],
)
def test_functionalized_slice_and_select_assignment(target, dtype):
    def fn(x, y):
        x = x.clone()
        view = target(x)
        view.copy_(view * 3 - 1)
        x[:, 0] = y
        return x

    _batch_dynamic(fn, (_data(dtype, 3, 5, 2), _data(dtype, 3, 2)), (True, True))


def test_functionalized_slice_fill():
    def fn(x):
        x = x.clone()
        x[:, 1:3] = 2.0
        x[-1] = 1.0
        return x

    _batch_dynamic(fn, (torch.randn(3, 4),), (True,))


def test_slice_scatter_and_select_scatter_ops():
    x = torch.randn(4, 6)
    _batch_dynamic(
        lambda x, s, r: (
            torch.slice_scatter(x, s, 1, 1, 5, 2),
            torch.slice_scatter(x, s, 1, -5, -1, 2),
            torch.slice_scatter(x, s[:, :1], 1, 9 - 10, None),
            torch.select_scatter(x, r, 1, -2),
            torch.select_scatter(x, s[:, 0], 1, 0),
            torch.slice_scatter(x, x * 2),
        ),
        (x, torch.randn(4, 2), torch.randn(4)), (True, True, True),
    )


# -- moving elements --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + [torch.int8, torch.uint8, torch.int16, torch.bool])
@pytest.mark.parametrize("diagonal", [0, 1, -2])
def test_tril_triu(dtype, diagonal):
    # In onnxruntime itself: it has no 8- or 16-bit integer Trilu.
    x = _data(dtype, 2, 4, 5) if dtype is not torch.bool else torch.randn(2, 4, 5) > -1
    _batch_dynamic(lambda x: (x.tril(diagonal), x.triu(diagonal)), (x,), (True,), runtime="onnxruntime")


def test_triu_with_symbolic_diagonal():
    _batch_dynamic(lambda x: torch.ones(5, 6).triu(x.shape[0]) + x.sum(), (torch.randn(2, 3),), (True,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_repeat(dtype):
    x = _data(dtype, 2, 3) if dtype is not torch.bool else torch.randn(2, 3) > 0
    _batch_dynamic(
        lambda x: (
            x.repeat(2, 1), x.repeat(1, 1, 3), x.repeat(2, 3, 1, 2), x.repeat(x.shape[0], 1), x[0, 0].repeat(3)
        ),
        (x,), (True,),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_roll(dtype):
    x = _data(dtype, 4, 5)
    _batch_dynamic(
        lambda x: (x.roll(1, 0), x.roll(-2, 1), x.roll(7, -1), x.roll((1, 3), (0, 1)), x.roll(3), x.roll(5, 1),
                   x.roll(x.shape[0], 1)),
        (x,), (True,),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_flip(dtype):
    x = _data(dtype, 3, 4, 2) if dtype is not torch.bool else torch.randn(3, 4, 2) > 0
    _batch_dynamic(lambda x: (x.flip(0), x.flip(-1), x.flip((0, 2)), x.flip(1, 0, 2)), (x,), (True,))


@pytest.mark.parametrize("opset", [18, 19, 21, 22, 23])
def test_indexing_across_opsets(opset):
    x = torch.randn(4, 5)
    i = torch.tensor([0, -1, 1])
    _batch_dynamic(
        lambda x, i: (x[:, i], x[i, i], x.index_put((i,), torch.tensor(1.0)), x.masked_fill(x > 0, 0),
                      x.tril(), x.roll(1, 0), x.flip(1), x.scatter(1, i.abs().view(1, 3).expand(x.shape[0], 3), 2.0)),
        (x, i), (True, False), opset_version=opset,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_masked_select(dtype):
    x = _data(dtype, 4, 5)
    _batch_dynamic(
        lambda x, m: (torch.masked_select(x, x > 0), torch.masked_select(x, m[0]), torch.masked_select(x[0], m)),
        (x, torch.randn(4, 5) > 0), (True, True),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_masked_scatter(dtype):
    x = _data(dtype, 4, 5)
    source = torch.arange(60).reshape(12, 5).to(dtype)  # enough for the grown batch
    _batch_dynamic(
        lambda x, m, s: (x.masked_scatter(m, x * 3), x.masked_scatter(m[0], s), x.masked_scatter(x > 0, s)),
        (x, torch.randn(4, 5) > 0, source), (True, True, False),
    )


def test_index_copy_index_fill_take_along_dim():
    x = torch.randn(4, 5)
    i = torch.tensor([3, 0])

    def fn(x, i):
        return (
            x.index_copy(1, i, x[:, :2] * 2),
            x.index_fill(1, i, -1.5),
            x.index_fill(1, i, x[0, 0]),
            torch.take_along_dim(x, x.argsort(dim=1)[:, :3], 1),
        )

    assert_exports_equivalent(fn, (x, i), resized=[(torch.randn(4, 5), torch.tensor([4, 1]))])


@pytest.mark.parametrize("offset", [0, 2, -1, 9])
@pytest.mark.parametrize("dims", [(1, 2), (2, 1), (-1, -2)])
def test_diagonal(offset, dims):
    x = torch.randn(2, 3, 5)
    _batch_dynamic(lambda x: torch.diagonal(x, offset, *dims) * 2, (x,), (True,))
    assert_exports_equivalent(lambda x: torch.diagonal(x, offset), (torch.randn(4, 4),))


def test_masked_index_decomposition_may_change_its_list_argument():
    # torch's decomposition of _unsafe_masked_index rewrites its indices list in place.
    x, mask, index = torch.randn(4, 5), torch.rand(2, 5) > 0.5, torch.tensor([0, 2])
    assert_exports_equivalent(lambda x, m, i: torch.ops.aten._unsafe_masked_index(x, m, [i], 0.0), (x, mask, index))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_bag_with_offsets(mode, padding_idx):
    # Bag 1 is empty (a repeated offset); the resized calls change both the indices and the bags.
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 3, mode=mode, padding_idx=padding_idx).eval()
    indices, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4, 4, 6])
    with max_min_scatter_refused_below_18(mode):
        program = assert_exports_equivalent(
            bag, (indices, offsets), dynamic_shapes=({0: torch.export.Dim("n")}, {0: torch.export.Dim("bags")}),
            resized=[(torch.tensor([0, 1, 2]), torch.tensor([0, 0])), (torch.tensor([4, 4, 3, 3, 3]), torch.tensor([0, 2]))],
        )
        # The rule reads offsets' rank without restating its shape: the input keeps its declared dim.
        assert [str(dim) for dim in program.model.graph.inputs[1].shape] == ["bags"]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_of_rows_with_dynamic_batch(mode):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 3, mode=mode).eval()
    with max_min_scatter_refused_below_18(mode):
        _batch_dynamic(bag, (torch.tensor([[1, 2, 4], [5, 4, 3]]),), (True,))


def test_embedding_bag_last_offset_and_per_sample_weights():
    torch.manual_seed(0)
    weight, indices = torch.randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    assert_exports_equivalent(
        lambda w, i, o, p: (
            F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
            F.embedding_bag(i, w, torch.cat([o, o.new_tensor([8])]), mode="mean", include_last_offset=True),
        ),
        (weight, indices, torch.tensor([0, 4, 4, 6]), torch.rand(8)),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_indices_past_the_last_offset(mode, padding_idx, dtype):
    # PyTorch's own ONNX test: 7 indices, include_last_offset=True and a last offset of 6. Its
    # float kernel ends the last bag there for sums without padding_idx (mean still counts the
    # 7th index); float64, max and padding_idx take the 7th index into the last bag.
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 5, mode=mode, include_last_offset=True, padding_idx=padding_idx).to(dtype)
    with max_min_scatter_refused_below_18(mode):
        assert_exports_equivalent(
            bag, (torch.tensor([2, 1, 2, 3, 2, 4, 5]), torch.tensor([0, 2, 5, 6])),
            input_names=["input", "offsets"], dynamic_axes={"input": [0], "offsets": [0]},
            resized=[(torch.tensor([3, 4, 5, 6]), torch.tensor([0, 3])), (torch.tensor([7, 8, 9]), torch.tensor([0, 3]))],
            runtime="onnxruntime",
        )


class _SummedBags(torch.nn.Module):
    def forward(self, embedding_matrix, input, weights, offsets=None):
        return F.embedding_bag(input, embedding_matrix, offsets=offsets, mode="sum", per_sample_weights=weights)


def test_embedding_bag_per_sample_weights_in_the_old_tests_form():
    # test_embedding_bag_dynamic_input: every dim dynamic, the table's too.
    torch.manual_seed(0)
    assert_exports_equivalent(
        _SummedBags(), (torch.rand(10, 15), torch.randint(7, (6,)), torch.randn(6), torch.tensor([0, 2, 5])),
        input_names=["embedding_matrix", "x", "w", "offsets"],
        dynamic_axes={"embedding_matrix": [0, 1], "x": [0], "w": [0], "offsets": [0]},
        resized=[(torch.rand(12, 25), torch.randint(7, (2,)), torch.randn(2), torch.tensor([0]))],
        runtime="onnxruntime",
    )
    assert_exports_equivalent(
        _SummedBags(), (torch.rand(10, 15), torch.randint(7, (2, 3)), torch.randn(2, 3)),
        input_names=["embedding_matrix", "x", "w"],
        dynamic_axes={"embedding_matrix": [0, 1], "x": [0, 1], "w": [0, 1]},
        resized=[(torch.rand(12, 25), torch.randint(7, (3, 5)), torch.randn(3, 5))],
        runtime="onnxruntime",
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("offset", [0, 2, -1])
@pytest.mark.parametrize("dims", [(1, 2), (2, 1), (0, -1)])
def test_diagonal_scatter(dims, offset, dtype):
    x = _data(dtype, 2, 3, 5)
    src = torch.diagonal(_data(dtype, 2, 3, 5) + 1, offset, *dims).contiguous()
    fn = lambda x, s: torch.diagonal_scatter(x, s, offset, *dims)  # noqa: E731
    if 0 in dims:
        assert_exports_equivalent(fn, (x, src))
    else:
        _batch_dynamic(fn, (x, src), (True, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize(("size", "fill_value"), [(3, -1), (20, -1), (20, 7)])
def test_nonzero_static_pads_or_cuts(size, fill_value, dtype):
    # Six nonzero entries: size 3 cuts them, size 20 pads with fill_value.
    x = torch.tensor([[0, 1, 2, 0], [3, 0, 0, 4], [0, 5, 6, 0]]).to(dtype)
    fn = lambda x: torch.nonzero_static(x, size=size, fill_value=fill_value)  # noqa: E731
    _batch_dynamic(fn, (x,), (True,))
    assert_exports_equivalent(fn, (torch.tensor(3).to(dtype),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool])
@pytest.mark.parametrize("accumulate", [False, True])
def test_put(accumulate, dtype):
    # Negative indices count from the end; with accumulate, the repeated index adds up.
    index, resized_index = torch.tensor([[0, -1], [7, 3]]), torch.tensor([[19, -20], [5, 0], [-2, 4]])
    if accumulate:
        index, resized_index = torch.tensor([[0, -1], [7, 7]]), torch.tensor([[19, -1], [5, 0], [-20, 19]])
    x, source = _data(dtype, 3, 4), _data(dtype, 2, 2)
    n = torch.export.Dim("n")
    assert_exports_equivalent(
        lambda x, i, s: x.put(i, s, accumulate=accumulate), (x, index, source),
        dynamic_shapes=({0: B}, {0: n}, {0: n}), resized=[(_data(dtype, 5, 4), resized_index, _data(dtype, 3, 2))],
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce(initial, reduce, dtype):
    # Segment 1 is empty: it holds initial, or the reduction's identity (NaN for mean).
    data, lengths = _data(dtype, 6, 2) / 10, torch.tensor([2, 0, 3, 1])
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    rows, segments = torch.export.Dim("rows"), torch.export.Dim("segments")
    resized_data, resized_lengths = _data(dtype, 9, 2) / 10, torch.tensor([4, 5, 0])
    with max_min_scatter_refused_below_18(reduce):
        assert_exports_equivalent(
            lambda d, n: torch.segment_reduce(d, reduce, lengths=n, initial=initial), (data, lengths),
            dynamic_shapes=({0: rows}, {0: segments}), resized=[(resized_data, resized_lengths)],
        )
        assert_exports_equivalent(
            lambda d, o: torch.segment_reduce(d.flatten(), reduce, offsets=o, initial=initial), (data, offsets * 2),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8])
def test_masked_scatter_with_empty_self_or_source(dtype):
    # Empty tensors take nothing from source, and an all-False mask accepts an empty source.
    rows, columns, n = torch.export.Dim("rows"), torch.export.Dim("columns"), torch.export.Dim("n")
    one_true = torch.zeros(3, 4, dtype=torch.bool)
    one_true[1, 2] = True
    scalar_source = torch.tensor(7).to(dtype)

    def inputs(x, mask, source):
        return x, mask, scalar_source, source

    assert_exports_equivalent(
        lambda x, m, s, t: (x.masked_scatter(m, s), x.masked_scatter(m, t)),
        inputs(_data(dtype, 3, 4), one_true, _data(dtype, 5)),
        dynamic_shapes=({0: rows, 1: columns}, {0: rows, 1: columns}, None, {0: n}),
        resized=[
            inputs(_data(dtype, 2, 0), torch.zeros(2, 0, dtype=torch.bool), _data(dtype, 2)),
            inputs(_data(dtype, 0, 0), torch.zeros(0, 0, dtype=torch.bool), _data(dtype, 0)),
            inputs(_data(dtype, 3, 4), torch.zeros(3, 4, dtype=torch.bool), _data(dtype, 0)),
        ],
    )
