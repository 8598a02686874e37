"""View, reshape, join, split, copy and cast rules, and SymInt shape arithmetic."""

from __future__ import annotations

import pytest
import torch

import dynexport
from dynexport.errors import TranslationError
from tests.equivalence import assert_exports_equivalent, op_histogram
from tests.opset_parametrization import max_min_scatter_refused_below_18

B = torch.export.Dim("batch")
S = torch.export.Dim("seq")


def _check(fn, x, *others, resized_batch=5):
    dynamic = ({0: B},) + tuple(None for _ in others)
    resized = (torch.randn(resized_batch, *x.shape[1:]).to(x.dtype),) + others
    return assert_exports_equivalent(fn, (x, *others), dynamic_shapes=dynamic, resized=[resized])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.view(x.shape[0], -1),
        lambda x: x.reshape(-1, 4),
        lambda x: x.reshape(x.shape[0] * 3, 4),
        lambda x: x.view(x.shape[0], 3, 2, 2).permute(0, 2, 3, 1),
        lambda x: x.transpose(0, 2),
        lambda x: x.transpose(-1, -2).contiguous(),
        lambda x: x.flatten(),
        lambda x: x.flatten(1),
        lambda x: x.flatten(0, 1),
        lambda x: x.unsqueeze(0).unsqueeze(-1),
        lambda x: x[:, None, 1:],
        lambda x: x[:, 1],
        lambda x: x[:, -1, ::2],
        lambda x: x[..., 1:-1],
        lambda x: x.narrow(2, 1, 2),
        lambda x: x.select(-1, 0),
        lambda x: x.expand(x.shape[0], 3, 4),
        lambda x: x[:, :1].expand(-1, 5, -1),
        lambda x: x.unsqueeze(1).expand(-1, 2, -1, -1),
        lambda x: x.mT,
        lambda x: x.clone().detach(),
    ],
    ids=["view", "reshape_minus1", "reshape_symbolic", "permute", "transpose", "transpose_neg",
         "flatten_all", "flatten_1", "flatten_01", "unsqueeze", "slice_none", "select", "neg_select_step",
         "ellipsis", "narrow", "select_last", "expand", "expand_minus1", "expand_new_dim", "mT", "clone"],
)
def test_views(fn):
    _check(fn, torch.randn(2, 3, 4))


def test_squeeze_variants():
    x = torch.randn(2, 1, 3, 1)
    _check(lambda t: (t.squeeze(1), t.squeeze(-1), t.squeeze((1, 3)), t.squeeze(2)), x)
    assert_exports_equivalent(lambda t: t.squeeze(), (x,))


class _SqueezeDim1(torch.nn.Module):
    def forward(self, x):
        return x.squeeze(1)


class _SqueezeAll(torch.nn.Module):
    def forward(self, x):
        return x.squeeze()


@pytest.mark.parametrize("model", [_SqueezeDim1(), _SqueezeAll()], ids=["dim", "all"])
def test_squeeze_of_a_dynamic_dim_that_may_be_one_is_refused(model):
    # Eager removes dim 1 at size 1 and keeps it otherwise: the rank is decided at run time.
    with pytest.raises(TranslationError, match=r"dynamic \((batch|n)\) and may be 1") as error:
        dynexport.export(model, (torch.randn(2, 1, 4),), input_names=["x"], dynamic_axes={"x": {0: "batch", 1: "n"}})
    assert "squeeze" in str(error.value) and "return x.squeeze(" in str(error.value)
    assert "example size >= 2" in str(error.value)


def test_squeeze_of_a_dynamic_dim_that_is_never_one():
    n = torch.export.Dim("n", min=2)
    x = torch.randn(2, 3, 4)
    assert_exports_equivalent(
        lambda t: t.squeeze(1), (x,), dynamic_shapes=({1: n},), resized=[(torch.randn(2, 5, 4),)]
    )


def test_squeeze_keeps_dynamic_dim_even_when_exported_at_size_one():
    program = _check(lambda t: t.squeeze(1) * 2, torch.randn(1, 1, 3))
    assert program.model.graph.inputs[0].shape[0] == "batch"


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_and_stack(dim):
    x = torch.randn(2, 3)
    _check(lambda a: (torch.cat([a, a * 2], dim=dim), torch.stack([a, a + 1, a], dim=dim)), x)


def test_cat_promotes_and_skips_legacy_empty():
    x, i, empty = torch.randn(2, 3), torch.ones(2, 3, dtype=torch.int64), torch.zeros(0)
    assert_exports_equivalent(
        lambda a, b, e: (torch.cat([a, b], 1), torch.cat([a, e])),
        (x, i, empty),
        dynamic_shapes=({0: B}, {0: B}, None),
        resized=[(torch.randn(5, 3), torch.ones(5, 3, dtype=torch.int64), empty)],
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.split(2, dim=1),
        lambda x: x.split([1, 3], dim=1),
        lambda x: x.chunk(3, dim=-1),
        lambda x: x.unbind(1),
        lambda x: x.tensor_split(3, dim=2),
    ],
    ids=["split", "split_sizes", "chunk", "unbind", "tensor_split"],
)
def test_splits(fn):
    _check(fn, torch.randn(2, 4, 5))


def test_split_along_dynamic_dim_with_symbolic_sizes():
    assert_exports_equivalent(
        lambda t: t.split([2, t.shape[0] - 2]), (torch.randn(5, 3),),
        dynamic_shapes=({0: torch.export.Dim("n", min=4)},), resized=[(torch.randn(9, 3),)],
    )


class _ViewTwice(torch.nn.Module):
    def forward(self, input):
        return input.view(-1, 2).view(1, -1)


def test_view_of_a_dynamic_dim_at_other_sizes_including_zero():
    # PyTorch's own ONNX test (test_view_dynamic_zero_dim): exported at 2, run at 0 and 6. The
    # second view, of a contiguous tensor, is captured without torch's reshape search
    # (dynexport.contiguous_views), which sized it [1, 2] from the first view's (s // 2) == 1.
    assert_exports_equivalent(
        _ViewTwice(), (torch.ones(2),), input_names=["input_1"], dynamic_axes={"input_1": [0]},
        resized=[(torch.empty(0),), (torch.ones(6),)],
    )


def test_view_of_a_dynamic_dim_whose_guards_admit_only_the_example_warns():
    # The first view's search still guards (s // 2) == 1; the graph no longer depends on it
    # (test above), but the warning cannot tell.
    pinned = r"guards admit no other size than the example's for input 'input' dim 0 = 2"
    with pytest.warns(UserWarning, match=pinned):
        dynexport.export(_ViewTwice(), (torch.ones(2),), input_names=["input_1"], dynamic_axes={"input_1": [0]})


def test_view_of_a_dynamic_dim_exported_at_size_zero():
    assert_exports_equivalent(
        _ViewTwice(), (torch.empty(0),), input_names=["input_1"], dynamic_axes={"input_1": [0]},
        resized=[(torch.ones(2),), (torch.ones(6),)],
    )


class _Chunk(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.chunk(x, 3, dim=self.dim)


@pytest.mark.parametrize("dim", [1, -1])
@pytest.mark.parametrize("example", [(1, 18), (2, 7)])
def test_chunk_of_a_dynamic_dim_sizes_its_pieces_at_run_time(dim, example):
    # PyTorch's own ONNX test: pieces of ceil(n / 3), the last what is left (13 -> 5, 5, 3). An
    # example size of 1 keeps 0 in the dims' range: an empty dim gives three empty pieces.
    empty = [(torch.randn(2, 0),)] if 1 in example else []
    program = assert_exports_equivalent(
        _Chunk(dim), (torch.randn(*example),),
        input_names=["x"], dynamic_axes={"x": {0: "batch_size", 1: "dims"}},
        resized=[(torch.randn(2, n),) for n in (13, 14, 15)] + [(torch.randn(3, 7),), (torch.randn(2, 9),)] + empty,
    )
    assert op_histogram(program)["Split"] == 1
    # At 4, eager returns two pieces (2, 2): the model fails rather than return a third, empty one.
    with pytest.raises(Exception, match="split"):
        program(torch.randn(2, 4))


class _Halves(torch.nn.Module):
    def forward(self, x):
        first, second = x.chunk(2)
        return first * 2, second - 1, *x.split(x.shape[1] // 2, dim=1)


def test_pieces_equal_at_every_size_are_one_split_of_equal_parts():
    # 2 * half rows in two, 2 * n columns by n: no size arithmetic at run time (RAFT chunks
    # its two images' features, stacked in one batch, back into two).
    dims = ({0: 2 * torch.export.Dim("half"), 1: 2 * torch.export.Dim("n")},)
    program = assert_exports_equivalent(
        _Halves(), (torch.randn(4, 6),), dynamic_shapes=dims,
        resized=[(torch.randn(2 * h, 2 * n),) for h, n in [(1, 5), (5, 1), (3, 4)]],
    )
    assert op_histogram(program) == {"Split": 2, "Mul": 1, "Sub": 1}


class _SplitByTwo(torch.nn.Module):
    def forward(self, x):
        return x.split(2, dim=1)


class _Unbind(torch.nn.Module):
    def forward(self, x):
        return x.unbind(1)


def test_chunk_into_one_piece_of_a_dynamic_dim_that_may_grow_is_refused():
    # Exported at 1, chunk(3) gives one piece; eager gives 2 at 2, 3 at 0 and 3.
    with pytest.raises(TranslationError, match=r"dynamic \(dims\).*number of outputs \(1 at the example\)"):
        dynexport.export(_Chunk(1), (torch.randn(2, 1),), input_names=["x"], dynamic_axes={"x": {1: "dims"}})


def test_unbind_of_a_dynamic_dim_is_refused():
    # Eager returns n tensors: an ONNX node's outputs are fixed.
    with pytest.raises(TranslationError, match=r"dynamic \(n\).*number of outputs") as error:
        dynexport.export(_Unbind(), (torch.randn(2, 1),), input_names=["x"], dynamic_axes={"x": {0: "batch", 1: "n"}})
    assert "return x.unbind(1)" in str(error.value) and "make n static" in str(error.value)


def test_split_of_a_dynamic_dim_holds_for_the_sizes_torch_proved():
    # Exported at n = 1, torch bounds n to [0, 2], where split(2) gives one piece.
    assert_exports_equivalent(
        _SplitByTwo(), (torch.randn(2, 1),), input_names=["x"], dynamic_axes={"x": {0: "batch", 1: "n"}},
        resized=[(torch.randn(3, 0),), (torch.randn(3, 2),)],
    )


@pytest.mark.parametrize("model", [_SplitByTwo(), _Unbind()], ids=["split", "unbind"])
def test_split_into_a_number_of_pieces_set_by_a_dynamic_dim_is_refused(model):
    with pytest.raises(dynexport.errors.ExportError, match="n|x.size"):
        dynexport.export(model, (torch.randn(2, 5),), input_names=["x"], dynamic_axes={"x": {0: "batch", 1: "n"}})


def test_split_of_a_dynamic_dim_of_an_empty_tensor_is_refused():
    # Of a (3, 0) tensor, Dim.AUTO leaves dim 0 dynamic: split(2) gives 2 pieces at 3 and 3 at 5,
    # which one ONNX node cannot.
    with pytest.raises(TranslationError, match=r"dynamic \(x_dim_0\).*number of outputs \(2 at the example\)"):
        dynexport.export(lambda x: x.split(2, dim=0), (torch.randn(3, 0),), dynamic_shapes=({0: torch.export.Dim.AUTO},))


def test_split_of_a_static_dim_next_to_a_dynamic_one():
    _check(lambda x: (x.split(2, dim=1), x.unbind(1)), torch.randn(3, 5), resized_batch=1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.int32, torch.bool, torch.float64])
def test_casts(dtype):
    x = torch.randn(2, 3) * 3
    _check(lambda a: (a.to(dtype), a.to(dtype).float(), a.type(dtype), a.to(torch.float32)), x)


def test_type_as():
    _check(lambda a, b: a.type_as(b), torch.randn(2, 3), torch.ones(1, dtype=torch.int32))


def test_noop_views_emit_no_nodes():
    program = _check(lambda a: a.contiguous().clone()[:, :].permute(0, 1) + 1, torch.randn(2, 3))
    assert op_histogram(program) == {"Add": 1}


def test_symbolic_arithmetic_follows_new_sizes():
    def fn(x):
        n = x.shape[0]
        return x.reshape(-1)[: n * 2 - 1] * (x.numel() // n) * (n % 3 + 1) - (n - 5) // 2

    assert_exports_equivalent(
        fn, (torch.randn(4, 3),), dynamic_shapes=({0: torch.export.Dim("n", min=2)},),
        resized=[(torch.randn(7, 3),), (torch.randn(2, 3),)],
    )


def test_dropout_in_eval_is_identity():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5)).eval()
    program = _check(model, torch.randn(2, 3))
    assert "Dropout" not in op_histogram(program)


def test_flatten_with_empty_dims_keeps_the_symbolic_ones():
    # -1 cannot stand for the merged size when another dim is 0: it is computed instead.
    x = torch.zeros(0, 2, 0, 3)
    assert_exports_equivalent(
        lambda x: (x.flatten(2, 3), x.flatten(1, 2), x.flatten()), (x,),
        dynamic_shapes=({1: torch.export.Dim("n"), 3: torch.export.Dim("m")},), resized=[(torch.zeros(0, 5, 0, 4),)],
    )
    y = torch.randn(2, 3, 4, 5)
    assert_exports_equivalent(
        lambda y: (y.flatten(1, 2), y.flatten(0, 1), y.flatten(2)), (y,),
        dynamic_shapes=({0: B, 2: S},), resized=[(torch.randn(3, 3, 7, 5),)],
    )


@pytest.mark.parametrize(
    "fn, x, dims, resized",
    [
        # Overlapping windows (unfold's strides), an offset, and a 0-d element.
        (lambda x: x.as_strided((3, 4), (2, 1), 1), torch.randn(12), None, []),
        (lambda x: x.as_strided((), (), 5), torch.randn(8), None, []),
        # Sizes and strides that follow dynamic dims.
        (lambda x: x.as_strided((x.shape[0] - 2, 3), (1, 1)), torch.randn(8), {0: torch.export.Dim("n", min=4)},
         [torch.randn(5), torch.randn(20)]),
        (lambda x: x.as_strided((2, x.shape[1] - 1), (x.shape[1], 1), 1), torch.randn(3, 5),
         {1: torch.export.Dim("m", min=3)}, [torch.randn(3, 9)]),
    ],
    ids=["windows", "element", "dynamic_size", "dynamic_stride"],
)
def test_as_strided_of_a_contiguous_tensor(fn, x, dims, resized):
    assert_exports_equivalent(fn, (x,), dynamic_shapes=(dims,) if dims else None, resized=[(r,) for r in resized])


def test_as_strided_over_a_view_is_refused():
    # x.t()'s storage is x's: the ONNX tensor of x.t() has no storage order to stride over.
    with pytest.raises(TranslationError, match=r"(?s)input is a view \(strides \(1, 5\).*call \.contiguous\(\)"):
        dynexport.export(lambda x: x.t().as_strided((2, 2), (1, 2)), (torch.randn(3, 5),))
    assert_exports_equivalent(lambda x: x.t().contiguous().as_strided((2, 2), (1, 2)), (torch.randn(3, 5),))


def test_as_strided_scatter_writes_the_strided_positions():
    # Disjoint positions: one ScatterND.
    program = assert_exports_equivalent(
        lambda x, y: torch.as_strided_scatter(x, y, (2, 2), (3, 1), 1), (torch.zeros(3, 3), torch.randn(2, 2))
    )
    assert op_histogram(program)["ScatterND"] == 1


@pytest.mark.parametrize(
    "fn, args, dims, resized",
    [
        # Overlapping windows: eager's copy writes in order, the last write to a position stays.
        (lambda x, y: torch.as_strided_scatter(x, y, (2, 2), (1, 1), 0), (torch.zeros(9), torch.randn(2, 2)), None, []),
        # Sizes and strides that follow a dynamic dim (whether they overlap is known only at run time).
        (lambda x, y: torch.as_strided_scatter(x, y, (2, y.shape[1]), (y.shape[1] - 1, 1), 1),
         (torch.zeros(20), torch.randn(2, 4)), (None, {1: torch.export.Dim("m", min=2, max=8)}),
         [(torch.zeros(20), torch.randn(2, 7)), (torch.zeros(20), torch.randn(2, 2))]),
    ],
    ids=["overlapping", "dynamic"],
)
def test_as_strided_scatter_of_overlapping_positions_keeps_the_last_write(fn, args, dims, resized):
    with max_min_scatter_refused_below_18("max"):
        assert_exports_equivalent(fn, args, dynamic_shapes=dims, resized=resized)
