"""Lists whose length is only known at run time become ONNX sequences: each model runs in
onnxruntime with other trip counts, other split sizes and other dynamic dims than at export, and
is compared with the TorchScript model run eagerly."""

from __future__ import annotations

import functools

import onnx_ir as ir
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.export import Dim

import dynexport
from dynexport.errors import CaptureError, TorchScriptConversionError
from tests.equivalence import assert_close, assert_exports_equivalent
from tests.test_torchscript import ListLoopModel


def ops_in(program: dynexport.ONNXProgram) -> set[str]:
    """Op types in the model, loop bodies and branches included."""
    found, pending = set(), [program.model.graph]
    while pending:
        graph = pending.pop()
        for node in graph:
            found.add(node.op_type)
            pending += [a.value for a in node.attributes.values() if a.type.name == "GRAPH"]
    return found


class Powers(torch.nn.Module):
    def forward(self, x, n):
        powers: list[torch.Tensor] = []
        for i in range(int(n)):
            powers.append(x * i)
        return torch.stack(powers, 1), len(powers), powers[-1]


def test_appending_in_a_loop_with_a_run_time_trip_count():
    program = assert_exports_equivalent(
        torch.jit.script(Powers()),
        (torch.randn(2, 3), torch.tensor(4)),
        dynamic_shapes={"x": {0: Dim("rows"), 1: Dim("cols")}, "n": None},
        resized=[(torch.randn(5, 2), torch.tensor(1)), (torch.randn(1, 7), torch.tensor(9))],
    )
    assert {"SequenceEmpty", "SequenceInsert", "Loop", "ConcatFromSequence", "SequenceLength", "SequenceAt"} <= ops_in(
        program
    )


class Columns(torch.nn.Module):
    def forward(self, x, n):
        columns = [x]
        for i in range(int(n)):
            columns.append(x[:, :1] + i)
        return torch.cat(columns, 1)


def test_a_list_that_starts_with_tensors_of_another_shape():
    # x is (rows, cols), what the loop appends (rows, 1): the sequence's elements share only
    # their first dim.
    program = assert_exports_equivalent(
        torch.jit.script(Columns()),
        (torch.randn(2, 3), torch.tensor(4)),
        dynamic_shapes={"x": {0: Dim("rows"), 1: Dim("cols")}, "n": None},
        resized=[(torch.randn(3, 5), torch.tensor(0)), (torch.randn(4, 1), torch.tensor(6))],
    )
    assert "SequenceConstruct" in ops_in(program)


class RunningMax(torch.nn.Module):
    def forward(self, x, n):
        steps = [x]
        for i in range(int(n)):
            steps.append(torch.maximum(steps[-1], x * (i % 3)))
        return torch.stack(steps)


def test_a_loop_reads_what_it_appended_in_earlier_iterations():
    # The elements' sizes are the dynamic dims of x: the body is given those symbols.
    assert_exports_equivalent(
        torch.jit.script(RunningMax()),
        (torch.randn(2, 3), torch.tensor(4)),
        dynamic_shapes={"x": {0: Dim("rows"), 1: Dim("cols")}, "n": None},
        resized=[(torch.randn(5, 2), torch.tensor(0)), (torch.randn(1, 7), torch.tensor(8))],
    )


class Tokens(torch.nn.Module):
    def forward(self, x, limit):
        kept: list[torch.Tensor] = [limit]
        for i in range(x.size(0)):
            if bool(x[i] >= limit):
                break
            kept.append(x[i] * 2)
        return torch.stack(kept), torch.tensor(len(kept))


def test_a_loop_that_breaks_on_data_collects_ints():
    x = torch.tensor([1, 2, 3, 9, 4])
    assert_exports_equivalent(
        torch.jit.script(Tokens()),
        (x, torch.tensor(5)),
        dynamic_shapes={"x": {0: Dim("length")}, "limit": None},
        resized=[(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7]), torch.tensor(6)), (torch.tensor([3, 3]), torch.tensor(9))],
    )


class ChunkSums(torch.nn.Module):
    def forward(self, x, size):
        chunks = x.split(int(size))
        sums: list[torch.Tensor] = []
        for chunk in chunks:
            sums.append(chunk.sum(0))
        return torch.stack(sums), len(chunks), chunks[-1]


def test_split_by_a_run_time_size_is_split_to_sequence():
    program = assert_exports_equivalent(
        torch.jit.script(ChunkSums()),
        (torch.randn(7, 3), torch.tensor(2)),
        dynamic_shapes={"x": {0: Dim("length")}, "size": None},
        resized=[(torch.randn(10, 3), torch.tensor(3)), (torch.randn(4, 3), torch.tensor(4)), (torch.randn(9, 3), torch.tensor(1))],
    )
    assert "SplitToSequence" in ops_in(program)


class Horner(torch.nn.Module):
    def forward(self, coefficients, x):
        acc = torch.zeros_like(x)
        for c in coefficients.unbind(0):
            acc = acc * x + c
        return acc


def test_unbind_over_a_dynamic_dim_loops_over_its_rows():
    program = assert_exports_equivalent(
        torch.jit.script(Horner()),
        (torch.randn(5, 3), torch.randn(3)),
        dynamic_shapes={"coefficients": {0: Dim("degree")}, "x": None},
        resized=[(torch.randn(2, 3), torch.randn(3)), (torch.randn(9, 3), torch.randn(3))],
    )
    assert "SplitToSequence" in ops_in(program)


class Pieces(torch.nn.Module):
    def forward(self, x, size):
        return x.split(int(size)), x.sum()


def test_a_returned_list_of_run_time_length_is_a_sequence_output():
    program = assert_exports_equivalent(
        torch.jit.script(Pieces()),
        (torch.randn(7, 3), torch.tensor(2)),
        dynamic_shapes={"x": {0: Dim("length")}, "size": None},
        resized=[(torch.randn(9, 3), torch.tensor(4)), (torch.randn(3, 3), torch.tensor(5))],
    )
    assert program.model.graph.outputs[0].type == ir.SequenceType(ir.TensorType(program.model.graph.outputs[1].dtype))
    pieces, _ = program(torch.randn(9, 3), torch.tensor(4))
    assert [tuple(piece.shape) for piece in pieces] == [(4, 3), (4, 3), (1, 3)]


class PositiveRows(torch.nn.Module):
    def forward(self, x):
        kept = [x[:1] * 0]
        for i in range(x.size(0)):
            if bool(x[i].sum() > 0):
                kept.append(x[i : i + 1])
        return torch.cat(kept)


def test_appending_in_a_branch_inside_a_loop():
    x = torch.tensor([[1.0, 2.0], [-3.0, 0.0], [0.5, 0.5]])
    program = assert_exports_equivalent(
        torch.jit.script(PositiveRows()),
        (x,),
        dynamic_shapes={"x": {0: Dim("rows")}},
        resized=[(-x,), (torch.randn(8, 2),), (torch.ones(1, 2),)],
    )
    assert {"Loop", "If", "SequenceInsert"} <= ops_in(program)


class EvenValues(torch.nn.Module):
    def forward(self, x):
        # Empty before the loop, appended to in a branch: SequenceEmpty's dtype is found there.
        evens: list[torch.Tensor] = []
        for i in range(x.size(0)):
            if bool(x[i] % 2 == 0):
                evens.append(x[i])
        return torch.stack(evens + [x.sum()])


def test_an_empty_list_appended_to_in_a_branch_inside_a_loop():
    assert_exports_equivalent(
        torch.jit.script(EvenValues()),
        (torch.tensor([1, 2, 3, 4]),),
        dynamic_shapes={"x": {0: Dim("length")}},
        resized=[(torch.tensor([1, 3, 5, 7, 9]),), (torch.arange(12),)],
    )


class MaybeDoubled(torch.nn.Module):
    def forward(self, x):
        parts = [x]
        if bool(x.sum() > 0):
            parts.append(x * 2)
        return torch.cat(parts)


def test_appending_in_a_data_dependent_branch():
    program = assert_exports_equivalent(
        torch.jit.script(MaybeDoubled()),
        (torch.ones(2, 3),),
        dynamic_shapes={"x": {0: Dim("rows")}},
        resized=[(-torch.ones(4, 3),), (torch.randn(5, 3),)],
    )
    assert "If" in ops_in(program) and "ConcatFromSequence" in ops_in(program)


class Triangle(torch.nn.Module):
    def forward(self, x, n):
        rows: list[torch.Tensor] = []
        for i in range(int(n)):
            for j in range(i + 1):
                rows.append(x * (i * 10 + j))
        return torch.stack(rows)


class ReplaceElements(torch.nn.Module):
    def forward(self, x):
        rows: list[torch.Tensor] = []
        for i in range(x.size(0)):
            rows.append(x[i] * i)
        rows[-1] = rows[0] + 1
        if bool(x.sum() > 0):
            rows[1] = rows[1] * 10
        return torch.stack(rows)


@pytest.mark.parametrize("dynamic", [False, True], ids=["list", "sequence"])
def test_assigning_to_a_list_element(dynamic):
    positive = torch.rand(4, 3)
    program = assert_exports_equivalent(
        torch.jit.script(ReplaceElements()),
        (positive,),
        dynamic_shapes=({0: Dim("rows")},) if dynamic else None,
        resized=[(-positive,), *(((torch.rand(6, 3),), (-torch.rand(2, 3),)) if dynamic else ())],
    )
    # The branch on data makes the list a sequence either way: its write is an erase and an insert.
    assert {"SequenceErase", "SequenceInsert", "If"} <= ops_in(program)


class BeamHypotheses(torch.nn.Module):
    # PyTorch's test_inplace_sequence_with_loop: `continue` on a tensor, `break`, appends, and
    # `done[i] = ...` written inside the branch on done[i].
    def process(self, beam_hyps: list[torch.Tensor], done: torch.Tensor, x):
        batch_size = x.shape[0]
        for i in range(batch_size):
            if done[i]:
                continue
            beam_idx = 0
            for _, token in enumerate(x[i]):
                beam_hyps.append(token)
                beam_idx += 1
                if beam_idx == 6:
                    break
            done[i] = len(beam_hyps) > 4
        return beam_hyps, done

    def forward(self, x):
        beam_hyps: list[torch.Tensor] = []
        batch_size = x.shape[0]
        cur_len = 0
        max_len = x.shape[1]
        done = torch.zeros(batch_size, dtype=torch.bool)
        while cur_len < max_len:
            beam_hyps, done = self.process(beam_hyps, done, x[:, 0, :])
            cur_len = cur_len + 1
        return beam_hyps


def test_a_write_in_a_branch_on_data_within_unrolled_loops():
    model = torch.jit.script(BeamHypotheses())
    x = torch.randn(4, 2, 3)
    program = dynexport.export(model, (x,))
    for inputs in (x, torch.randn(4, 2, 3)):
        assert_close(program(inputs), model(inputs))


def test_nested_loops_append_to_the_outer_list():
    program = assert_exports_equivalent(
        torch.jit.script(Triangle()),
        (torch.randn(3), torch.tensor(3)),
        resized=[(torch.randn(3), torch.tensor(1)), (torch.randn(3), torch.tensor(6))],
    )
    bodies = [a.value for node in program.model.graph for a in node.attributes.values() if a.type.name == "GRAPH"]
    assert any(node.op_type == "Loop" for body in bodies for node in body)


class BranchLocalList(torch.nn.Module):
    def forward(self, x, n):
        # The list is made and filled inside one branch: the other branch knows nothing of it.
        if bool(x.sum() > 0):
            parts: list[torch.Tensor] = []
            for i in range(int(n)):
                parts.append(x * i)
            y = torch.cat(parts + [x])
        else:
            y = x - 1
        return y


def test_a_list_local_to_a_branch_is_appended_to_in_a_loop():
    assert_exports_equivalent(
        torch.jit.script(BranchLocalList()),
        (torch.ones(2, 3), torch.tensor(3)),
        resized=[(-torch.ones(2, 3), torch.tensor(2)), (torch.ones(2, 3), torch.tensor(0)), (torch.ones(2, 3), torch.tensor(5))],
    )


def test_the_seed_list_loop_model_over_a_dynamic_length_is_an_onnx_loop():
    # The docs' ListLoopModel: the number of chunks of x now depends on x's run-time length.
    program = assert_exports_equivalent(
        torch.jit.script(ListLoopModel()),
        (torch.randn(16),),
        dynamic_shapes={"x": {0: Dim("length")}},
        resized=[(torch.randn(10),), (torch.randn(23),), (torch.randn(2),)],
    )
    assert {"SplitToSequence", "Loop", "SequenceAt", "ConcatFromSequence"} <= ops_in(program)
    assert not (ops_in(program) & {"Split"})


class GreedyDecoder(torch.nn.Module):
    """A recurrent decoder: one token per step until it emits token 3 or reaches `max_steps`."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(8, 6)
        self.cell = torch.nn.GRUCell(6, 6)
        self.out = torch.nn.Linear(6, 8)

    def forward(self, hidden, start, max_steps):
        tokens: list[torch.Tensor] = []
        token = start
        for _ in range(int(max_steps)):
            hidden = self.cell(self.embed(token), hidden)
            token = self.out(hidden).argmax(-1)
            tokens.append(token)
            if bool(token[0] == 3):
                break
        return torch.stack(tokens, 1), hidden


def test_a_greedy_decoding_loop_collects_its_tokens():
    model = torch.jit.script(GreedyDecoder().eval())
    hidden = torch.randn(1, 6, generator=torch.Generator().manual_seed(1))
    runs = [(torch.randn(1, 6, generator=torch.Generator().manual_seed(seed)), torch.tensor([seed % 8]), torch.tensor(12)) for seed in range(2, 8)]
    program = assert_exports_equivalent(model, (hidden, torch.tensor([3]), torch.tensor(5)), resized=runs)
    assert {"Loop", "SequenceInsert", "ConcatFromSequence", "GRU"} & ops_in(program) >= {"Loop", "SequenceInsert", "ConcatFromSequence"}


# --- Properties: one export, many run-time lengths. ---------------------------------------------


@functools.cache
def exported(model: type[torch.nn.Module], dims: tuple[tuple[str, int], ...]) -> tuple[torch.jit.ScriptModule, dynexport.ONNXProgram]:
    scripted = torch.jit.script(model())
    if model is ChunkSums:
        args, shapes = (torch.randn(7, 3), torch.tensor(2)), {"x": {0: Dim("length"), 1: Dim("cols")}, "size": None}
    else:
        args, shapes = (torch.randn(3, 2),), {"x": {0: Dim("rows"), 1: Dim("cols")}}
    return scripted, dynexport.export(scripted, args, dynamic_shapes=shapes)


@settings(max_examples=30)
@given(length=st.integers(1, 30), cols=st.integers(1, 4), size=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_split_loops_match_eager_for_any_length_and_size(length, cols, size, seed):
    model, program = exported(ChunkSums, ())
    x = torch.randn(length, cols, generator=torch.Generator().manual_seed(seed))
    assert_close(program(x, torch.tensor(size)), model(x, torch.tensor(size)), where=f"length {length}, size {size}")


@settings(max_examples=30)
@given(rows=st.integers(1, 12), cols=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_branch_appends_match_eager_for_any_rows(rows, cols, seed):
    model, program = exported(PositiveRows, ())
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    assert_close(program(x), model(x), where=f"{rows} rows")


# --- Errors. -----------------------------------------------------------------------------------


class SplitByData(torch.nn.Module):
    def forward(self, x, n):
        return torch.stack([chunk.sum(0) for chunk in x.split(n.item())])


def test_torch_export_of_a_split_into_a_data_dependent_count_points_to_sequences():
    with pytest.raises(CaptureError) as error:
        dynexport.export(SplitByData(), (torch.randn(6, 3), torch.tensor(2)))
    message = str(error.value)
    assert "test_sequences.py" in message and "x.split(n.item())" in message
    assert "ONNX sequence" in message and "torch.jit.script" in message


class MixedDtypes(torch.nn.Module):
    def forward(self, x, n):
        out = [x]
        for i in range(int(n)):
            out.append(x.long())
        return len(out)


def test_a_list_of_several_dtypes_names_the_append_and_line():
    with pytest.raises(TorchScriptConversionError, match="one dtype") as error:
        dynexport.export(torch.jit.script(MixedDtypes()), (torch.ones(2), torch.tensor(3)))
    assert error.value.construct == "aten::append"
    assert "out.append(x.long())" in error.value.source


class Recurrence(torch.nn.Module):
    def forward(self, x, n):
        out: list[torch.Tensor] = []
        for i in range(int(n)):
            if i > 0:
                out.append(out[i - 1] * x)
            else:
                out.append(x)
        return torch.stack(out)


def test_reading_a_list_before_anything_is_appended_names_the_read():
    with pytest.raises(TorchScriptConversionError, match="read before anything is appended") as error:
        dynexport.export(torch.jit.script(Recurrence()), (torch.ones(2), torch.tensor(3)))
    assert error.value.construct == "aten::__getitem__"


def test_verify_asks_for_the_model_when_the_program_cannot_run_eagerly():
    model = torch.jit.script(Powers())
    program = dynexport.export(model, (torch.randn(2, 3), torch.tensor(4)))
    with pytest.raises(ValueError, match="pass the original model as model="):
        program.verify()
    assert program.verify(model=model).passed
    assert program(torch.randn(2, 3), torch.tensor(2))[0].shape == (2, 2, 3)
