"""TorchScript models and ``dynamo=False``: the seed examples of the old torch.onnx docs, and each
control-flow construct run in onnxruntime on inputs that take another branch or trip count."""

from __future__ import annotations

from typing import Optional, Tuple

import pytest
import torch
from torch import Tensor
from torch.export import Dim

import dynexport
from dynexport import torchscript
from dynexport.errors import TorchScriptConversionError, TracedSizesError
from tests.equivalence import assert_close, assert_exports_equivalent, op_histogram
from tests.seed_models import LoopModel2, loop

# --- The seed examples, as the old torch.onnx docs wrote them. ---------------------------------


class LoopModel(torch.nn.Module):
    def forward(self, x, y):
        for i in range(y):
            x = x + i
        return x


class ListLoopModel(torch.nn.Module):
    def forward(self, x):
        res = []
        res1 = []
        arr = x.split(2, 0)
        res2 = torch.zeros(3, 4, dtype=torch.long)
        for i in range(len(arr)):
            res = res.append(arr[i].sum(0, False))
            res1 = res1.append(arr[-1 - i].sum(0, False))
            res2 += 1
        return torch.stack(res), torch.stack(res1), res2


class InPlaceIndexedAssignment(torch.nn.Module):
    def forward(self, data, new_data):
        data[1] = new_data
        return data


class ImplicitCastType(torch.jit.ScriptModule):
    @torch.jit.script_method
    def forward(self, x):
        # Exporter knows x is float32, will export '2' as float32 as well.
        y = x + 2
        # Without type propagation, exporter doesn't know the datatype of y.
        # Thus '3' is exported as int64 by default.
        return y + 3


def test_traced_loop_model_unrolls():
    dummy_input = torch.ones(2, 3, dtype=torch.long)
    loop_count = torch.tensor(5, dtype=torch.long)
    program = assert_exports_equivalent(
        LoopModel(), (dummy_input, loop_count), dynamo=False, resized=[(dummy_input * 7, loop_count)]
    )
    # x + 0 folds away: the four Adds of the docs' graph, no Loop.
    assert op_histogram(program) == {"Add": 4}


def test_scripted_loop_in_module_is_an_onnx_loop():
    dummy_input = torch.ones(2, 3, dtype=torch.long)
    loop_count = torch.tensor(5, dtype=torch.long)
    program = dynexport.export(
        LoopModel2(), (dummy_input, loop_count), dynamo=False, input_names=["input_data", "loop_range"]
    )
    assert op_histogram(program)["Loop"] == 1
    assert [value.name for value in program.model.graph.inputs] == ["input_data", "loop_range"]
    assert torch.equal(program(dummy_input, torch.tensor(9)), torch.full((2, 3), 37))
    for trip_count in (0, 1, 5, 12):
        assert_close(program(dummy_input, torch.tensor(trip_count)), loop(dummy_input, torch.tensor(trip_count)))


def test_script_function_exports_with_a_dynamic_trip_count():
    x = torch.randn(2, 3)
    program = assert_exports_equivalent(
        loop, (x, torch.tensor(3)), resized=[(x, torch.tensor(0)), (torch.randn(2, 3), torch.tensor(8))]
    )
    assert op_histogram(program)["Loop"] == 1


def test_list_loop_model():
    # The lists' length is the number of chunks of x, fixed by x's shape: the loop unrolls.
    model = torch.jit.script(ListLoopModel())
    program = assert_exports_equivalent(model, (torch.randn(16),), resized=[(torch.randn(16),)])
    assert "Loop" not in op_histogram(program)


@pytest.mark.parametrize("script", [False, True], ids=["traced", "scripted"])
def test_in_place_indexed_assignment(script):
    model = torch.jit.script(InPlaceIndexedAssignment()) if script else InPlaceIndexedAssignment()
    data, new_data = torch.zeros(3, 4), torch.arange(4).to(torch.float32)
    assert_exports_equivalent(
        model, (data, new_data), dynamo=False, resized=[(torch.randn(3, 4), torch.randn(4))]
    )


def test_implicit_cast_type():
    x = torch.tensor([1.0], dtype=torch.float32)
    program = assert_exports_equivalent(ImplicitCastType(), (x,), resized=[(torch.tensor([-4.5]),)])
    assert program(x).dtype == torch.float32


# --- Control flow constructs. ------------------------------------------------------------------


class Branch(torch.nn.Module):
    def forward(self, x):
        if bool(x.sum() > 0):
            y = x * 2
        else:
            y = x - 1
        return y


def test_if_takes_either_branch():
    program = assert_exports_equivalent(
        torch.jit.script(Branch()), (torch.ones(3),), resized=[(-torch.ones(3),), (torch.randn(3),)]
    )
    assert op_histogram(program)["If"] == 1


def test_traced_if_keeps_the_branch_of_the_trace():
    program = assert_exports_equivalent(Branch(), (torch.ones(3),), dynamo=False, resized=[(torch.rand(3) + 1,)])
    assert "If" not in op_histogram(program)
    assert torch.equal(program(-torch.ones(3)), -torch.ones(3) * 2)  # eager would take the else branch


@torch.jit.script
def doubling(x, limit: float):
    while bool(x.sum() < limit):
        x = x * 2
    return x


def test_while_loop_runs_until_its_condition_fails():
    program = assert_exports_equivalent(
        doubling,
        (torch.ones(3), 100.0),
        resized=[(torch.full((3,), 0.01), 100.0), (torch.full((3,), 500.0), 100.0)],
    )
    assert op_histogram(program)["Loop"] == 1


@torch.jit.script
def double_until_large(x, steps):
    for _ in range(int(steps)):
        if bool(x.abs().max() > 50.0):
            break
        x = x * 2
    return x


def test_dynamic_loop_with_a_tensor_break():
    # TorchScript's loop condition combines the trip count with the break flag, as ints.
    program = assert_exports_equivalent(
        double_until_large,
        (torch.ones(3), torch.tensor(3)),
        resized=[(torch.ones(3), torch.tensor(0)), (torch.ones(3), torch.tensor(30)), (torch.full((3,), 60.0), torch.tensor(4))],
    )
    assert op_histogram(program)["Loop"] == 1


@torch.jit.script
def count_below(x, limit):
    # `and` short-circuits: an If whose branches give a bool computed from x and a constant.
    i = 0
    while i < x.size(0) and bool(x[i] < limit):
        i += 1
    return x[:i] * 2, i


def test_short_circuit_while_condition_over_data():
    program = assert_exports_equivalent(
        count_below,
        (torch.tensor([1, 2, 3, 9, 4]), torch.tensor(5)),
        dynamic_shapes={"x": {0: Dim("length")}, "limit": None},
        resized=[(torch.tensor([1, 2, 3]), torch.tensor(9)), (torch.tensor([7, 1]), torch.tensor(2))],
    )
    assert op_histogram(program)["Loop"] == 1


@torch.jit.script
def scale_or_count(x):
    if bool(x.sum() > 0):
        y, k = x * 2, 3
    else:
        y, k = x - 1, x.size(0)
    return y * k


def test_branches_give_an_int_from_a_constant_and_a_size():
    assert_exports_equivalent(
        scale_or_count,
        (torch.ones(3, 2),),
        dynamic_shapes={"x": {0: Dim("rows")}},
        resized=[(-torch.ones(5, 2),), (torch.randn(4, 2).abs(),)],
    )


@torch.jit.script
def count_up(x, steps):
    # The loop carries a dynamic size (a SymInt) and a float.
    n = x.size(0)
    scale = 1.0
    for _ in range(int(steps)):
        n = n + 2
        scale = scale * 0.5
    return x * n * scale


def test_a_dynamic_loop_carries_a_size_and_a_float():
    assert_exports_equivalent(
        count_up,
        (torch.ones(3), torch.tensor(2)),
        dynamic_shapes={"x": {0: Dim("length")}, "steps": None},
        resized=[(torch.ones(5), torch.tensor(0)), (torch.ones(2), torch.tensor(7))],
    )


class Recurrence(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(4, 4)

    def forward(self, xs):
        h = torch.zeros(xs.size(1), 4)
        for t in range(xs.size(0)):
            h = torch.tanh(self.cell(xs[t]) + h)
        return h


def test_loop_over_a_dynamic_dim_with_parameters():
    program = assert_exports_equivalent(
        torch.jit.script(Recurrence().eval()),
        (torch.randn(5, 2, 4),),
        dynamic_shapes=({0: Dim("steps")},),
        resized=[(torch.randn(9, 2, 4),), (torch.randn(1, 2, 4),)],
    )
    assert op_histogram(program)["Loop"] == 1
    assert {"cell.weight", "cell.bias"} <= set(program.model.graph.initializers)


def test_loop_over_a_static_dim_unrolls():
    program = assert_exports_equivalent(torch.jit.script(Recurrence().eval()), (torch.randn(3, 2, 4),))
    assert "Loop" not in op_histogram(program)
    assert op_histogram(program)["Tanh"] == 3


class Repeat(torch.nn.Module):
    def forward(self, x, scale: float = 2.0, times: int = 3):
        for i in range(times):
            x = x * scale
        return x


def test_keyword_and_default_arguments_are_bound_positionally():
    model = torch.jit.script(Repeat())
    module, args = torchscript.graph_module(model, (torch.ones(2),), {"times": 2})
    assert args[1:] == (2.0, 2)
    program = dynexport.export(model, (torch.ones(2),), kwargs={"times": 2})
    assert_close(program(*args), model(torch.ones(2), times=2))


# --- In-place writes within a branch or loop: the new value replaces the old after it. ---------


@torch.jit.script
def check_init(input_data, hidden_size: int, prev_state):
    # PyTorch's test_index_put_if_2: `state[:] = ...` in a branch on the previous state's size.
    batch_size = input_data.size(0)
    spatial_size_0 = input_data.size(2)
    spatial_size_1 = input_data.size(3)
    state_size = (2, batch_size, hidden_size, spatial_size_0, spatial_size_1)
    state = torch.zeros(state_size, device=input_data.device)
    if prev_state.size(0) < 4:
        state = state * 3
        if prev_state.size(0) < 3:
            state[:] = torch.ones(batch_size, hidden_size, spatial_size_0, spatial_size_1) * 3
        else:
            state = state + 2
    return state


class InitState(torch.nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size

    def forward(self, input_data, prev_state):
        prev_state = check_init(input_data, self.hidden_size, prev_state)
        return prev_state[0], prev_state[1]


def test_index_put_in_a_branch_on_a_dynamic_size():
    random_data, prev_state = torch.rand(2, 5, 6, 6), torch.zeros(2, 1, 1, 1, 1)
    program = assert_exports_equivalent(
        InitState(4),
        (random_data, prev_state),
        dynamo=False,
        input_names=["random_data", "prev_state"],
        dynamic_axes={"random_data": [0, 1, 2, 3], "prev_state": [0]},
        resized=[(torch.rand(3, 2, 4, 5), torch.zeros(n, 1, 1, 1, 1)) for n in (3, 4, 7)],
    )
    assert op_histogram(program)["If"] == 1


class InplaceOps(torch.nn.Module):
    # PyTorch's test_index_put_inplace_ops: `state[1] += ...` in a branch and a loop over a size.
    def forward(self, input_data):
        batch_size = input_data.size(0)
        spatial_size_0 = input_data.size(2)
        spatial_size_1 = input_data.size(3)
        state = torch.zeros((2, batch_size, 3, spatial_size_0, spatial_size_1), device=input_data.device)
        if input_data.size(0) == 2:
            state[1] += torch.ones(batch_size, 3, spatial_size_0, spatial_size_1) * 2
            state[1] /= torch.ones(batch_size, 3, spatial_size_0, spatial_size_1) * 3
        for i in range(input_data.size(0)):
            state[1] += torch.ones(batch_size, 3, spatial_size_0, spatial_size_1)
            state[1] /= torch.ones(batch_size, 3, spatial_size_0, spatial_size_1) * (i + 1)
        return state


def test_index_put_inplace_ops_in_a_branch_and_a_dynamic_loop():
    program = assert_exports_equivalent(
        torch.jit.script(InplaceOps()),
        (torch.rand(2, 5, 4, 4),),
        input_names=["random_data"],
        dynamic_axes={"random_data": [0, 1, 2, 3]},
        resized=[(torch.rand(3, 2, 5, 4),), (torch.rand(5, 2, 2, 3),)],
    )
    assert op_histogram(program)["Loop"] == 1


class MaskedWrite(torch.nn.Module):
    def forward(self, x, v):
        y = x.clone()
        if bool(x.sum() > 0):
            y[x > 0.5] = v
        else:
            y[x < -0.5] = 0.0  # aten::tensor(0.0) within the branch
        return y * 2


class IndexAddInBranch(torch.nn.Module):
    def forward(self, x, index, source):
        y = x.clone()
        if bool(x.sum() > 0):
            y.index_add_(0, index, source)
        else:
            y[0] = source[0]
        return y


@pytest.mark.parametrize(
    "model, args, resized",
    [
        (
            MaskedWrite(),
            (torch.rand(3, 4), torch.tensor(9.0)),
            [(torch.rand(5, 4) - 1, torch.tensor(9.0)), (torch.rand(2, 4), torch.tensor(-7.0))],
        ),
        (
            IndexAddInBranch(),
            (torch.rand(5, 3), torch.tensor([0, 2, 2]), torch.ones(3, 3)),
            [
                (torch.rand(7, 3) - 1, torch.tensor([1, 1, 6]), torch.randn(3, 3)),
                (torch.rand(4, 3), torch.tensor([3, 0, 3]), torch.randn(3, 3)),
            ],
        ),
    ],
    ids=["index_put_mask", "index_add_"],
)
def test_in_place_write_in_a_branch_on_data(model, args, resized):
    program = assert_exports_equivalent(
        torch.jit.script(model),
        args,
        input_names=["x", *(f"arg{i}" for i in range(1, len(args)))],
        dynamic_axes={"x": [0]},
        resized=resized,
    )
    assert op_histogram(program)["If"] == 1


class WriteAttributes(torch.nn.Module):
    # Scripting freezes the tensor attributes into constants: the index list is a constant too.
    def __init__(self):
        super().__init__()
        self.values = torch.tensor([1.0, 2.0])
        self.rows = torch.tensor([0, 2])

    def forward(self, x):
        y = x.clone()
        if bool(x.sum() > 0):
            y[0] = self.values
        else:
            y[self.rows] = self.values * 3
        return y


def test_write_of_tensor_attributes_in_a_branch_on_data():
    assert_exports_equivalent(
        torch.jit.script(WriteAttributes()),
        (torch.rand(3, 2),),
        dynamic_axes={"x": [0]},
        resized=[(-torch.rand(4, 2),), (torch.rand(5, 2),)],
    )


class WriteRow(torch.nn.Module):
    def forward(self, x, v, i: int):
        if bool(x.sum() > 0):
            x[i] = v
        else:
            x[i + 1] = -v
        return x


def test_write_to_an_input_in_a_branch():
    model = torch.jit.script(WriteRow())
    program = dynexport.export(model, (torch.rand(3, 4), torch.ones(4), 1), dynamic_axes={"x": [0]})
    assert op_histogram(program)["If"] == 1
    for x, v in [(torch.rand(3, 4), torch.ones(4)), (-torch.rand(5, 4), torch.randn(4))]:
        # Eager writes to x: each side gets its own copy.
        assert_close(program(x.clone(), v, 1), model(x.clone(), v, 1))


@torch.jit.script
def accumulate(x, steps):
    totals = torch.zeros(3)
    for i in range(int(steps)):
        totals[i % 3] += x[i]
    return totals


def test_write_to_a_tensor_of_the_enclosing_graph_in_a_dynamic_loop():
    program = assert_exports_equivalent(
        accumulate,
        (torch.arange(8.0), torch.tensor(5)),
        resized=[(torch.arange(8.0), torch.tensor(0)), (torch.randn(8), torch.tensor(8))],
    )
    assert op_histogram(program)["Loop"] == 1


@torch.jit.script
def rewrite_state(input_data, prev_state):
    # PyTorch's test_index_put_if_5: `state_ref` keeps the tensor the branch first writes to.
    state = torch.zeros((2, input_data.size(0), 3), device=input_data.device)
    state_ref = state
    if prev_state.size(0) < 3:
        state[:] = torch.ones(input_data.size(0), 3) * 3
        state = state + 3
        state[:] = torch.ones(input_data.size(0), 3) * 4
    else:
        state = state + 2
    return state, state_ref


def test_a_name_kept_for_the_tensor_a_branch_writes_to():
    assert_exports_equivalent(
        rewrite_state,
        (torch.rand(4, 2), torch.zeros(2)),
        dynamic_axes={"input_data": [0], "prev_state": [0]},
        resized=[(torch.rand(6, 2), torch.zeros(5)), (torch.rand(2, 2), torch.zeros(2))],
    )


@torch.jit.script
def ngram_attention_bias(sequence_length: int, ngram: int, device: torch.device, dtype: torch.dtype):
    bias = torch.ones((ngram, sequence_length), device=device, dtype=dtype) * float("-inf")
    for stream_idx in range(ngram):
        for i in range(sequence_length):
            bias = bias * 2
            bias[stream_idx, i] = 5
            bias = bias * 5
            bias[0, 0] = 5
    for stream_idx in range(ngram):
        for i in range(sequence_length):
            bias[stream_idx, i] = 5
            bias[0, i] = 5
    return bias


class NgramMask(torch.nn.Module):
    # PyTorch's test_index_put_loop (8 target positions instead of 512): writes in static loops,
    # a device and a dtype passed to a scripted function, `shape[:2]` of a list.
    def forward(self, hidden_states):
        seq_length, batch_size = hidden_states.shape[:2]
        mask = ngram_attention_bias(8, 2, hidden_states.device, hidden_states.dtype)
        return mask[:, :seq_length]


@pytest.mark.parametrize("script", [False, True], ids=["traced", "scripted"])
def test_index_put_in_static_loops(script):
    model = torch.jit.script(NgramMask()) if script else NgramMask()
    assert_exports_equivalent(
        model,
        (torch.randn(6, 2),),
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {0: "seq_length", 1: "batch_size"}},
        resized=[(torch.randn(4, 3),)],
    )


@torch.jit.script
def bin_positives(x, steps):
    # A branch on data within a dynamic loop writes to a tensor of the enclosing graph; the
    # branch that does not count returns the counter it was given.
    bins = torch.zeros(3)
    count = 0
    for k in range(int(steps)):
        if bool(x[k] > 0):
            bins[count % 3] += x[k]
            count += 1
    return bins, count


def test_write_in_a_branch_on_data_within_a_dynamic_loop():
    program = assert_exports_equivalent(
        bin_positives,
        (torch.randn(6), torch.tensor(6)),
        resized=[
            (torch.randn(6), torch.tensor(3)),
            (torch.randn(6), torch.tensor(0)),
            (-torch.rand(6), torch.tensor(6)),
        ],
    )
    assert op_histogram(program)["Loop"] == 1


class AccumulateInPlace(torch.nn.Module):
    def forward(self, x, n):
        a = torch.ones(3)
        start = a
        for _ in range(int(n)):
            a += x  # eager: writes to `start` too
        return a, start


class AccumulateInPlaceStatic(torch.nn.Module):
    def forward(self, x):
        a = torch.ones(3)
        start = a
        for _ in range(3):
            a += x
        return a, start


def test_a_loop_writing_to_its_carried_value_read_under_another_name():
    assert_exports_equivalent(
        torch.jit.script(AccumulateInPlaceStatic()), (torch.randn(3),), resized=[(torch.randn(3),)]
    )
    with pytest.raises(TorchScriptConversionError, match="the tensor the loop starts from, %a") as error:
        dynexport.export(torch.jit.script(AccumulateInPlace()), (torch.randn(3), torch.tensor(2)))
    assert "a += x" in error.value.reason


class ViewReadAfterWrite(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        row = y[0]
        if bool(x.sum() > 0):
            y[0] = 1.0
        return row


def test_a_view_taken_before_a_write_in_a_branch_on_data_is_refused():
    with pytest.raises(TorchScriptConversionError, match="another view of the same memory") as error:
        dynexport.export(torch.jit.script(ViewReadAfterWrite()), (torch.rand(2, 3),))
    assert "if bool(x.sum() > 0):" in error.value.source
    assert "y[0] = 1.0" in error.value.reason


class ViewReadAfterStaticWrite(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        row, column = y[0], y[:, 0]
        if x.size(0) > 2:
            y[0] = 1.0
        for _ in range(2):
            y[1] *= 2.0
        y[0] += 2.0
        return row, column, y


class OutputNamesATensorOfTheGraph(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        if x.size(0) > 2:
            z = y
        else:
            z = y * 2
        z[0] = 5.0  # eager: writes to y too when z is y
        return y, z


class OutputMayNameATensorOfTheGraph(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        if bool(x.sum() > 0):
            z = y
        else:
            z = y * 2
        z[0] = 5.0
        return y, z


def test_a_branch_output_that_is_a_tensor_of_the_graph_then_written_to():
    model = torch.jit.script(OutputNamesATensorOfTheGraph())
    assert_exports_equivalent(model, (torch.rand(3, 2),), resized=[(torch.rand(3, 2),)])
    assert_exports_equivalent(model, (torch.rand(2, 2),))
    # As torch.cond, z would be a copy of y: the write would not reach y.
    with pytest.raises(TorchScriptConversionError, match="output %z may be %y") as error:
        dynexport.export(torch.jit.script(OutputMayNameATensorOfTheGraph()), (torch.rand(3, 2),))
    assert "z[0] = 5.0" in error.value.reason


def test_a_branch_picked_at_export_or_an_unrolled_loop_writes_to_the_tensor_itself():
    # Every view of y sees every write, as in eager.
    assert_exports_equivalent(
        torch.jit.script(ViewReadAfterStaticWrite()), (torch.rand(3, 2),), resized=[(torch.rand(3, 2),)]
    )
    assert_exports_equivalent(torch.jit.script(ViewReadAfterStaticWrite()), (torch.rand(2, 2),))


# --- Numbers, devices and optional arguments. -------------------------------------------------


class ItemIndex(torch.nn.Module):
    # PyTorch's test_item.
    def forward(self, x, y, i: int):
        return int(x[y[i]].item())


def test_item_of_an_indexed_element_as_an_int():
    model = torch.jit.script(ItemIndex())
    x, y = torch.arange(6, dtype=torch.float), torch.tensor([0, 1, 2, 3, 4], dtype=torch.long)
    assert_exports_equivalent(
        model,
        (x, y, 3),
        input_names=["x", "y"],
        dynamic_axes={"x": [0], "y": [0]},
        resized=[(x * 2.5 - 7, y, 3), (torch.randn(9) * 9, torch.tensor([5, 4, 3, 8, 1, 0]), 3)],
    )


@torch.jit.script
def scale_by_item(x, scale):
    return x * float(scale.item()) + float(bool(scale.sum() > 1))


def test_float_of_item_and_of_a_bool():
    assert_exports_equivalent(
        scale_by_item,
        (torch.rand(3), torch.tensor(2.5)),
        dynamic_shapes={"x": {0: Dim("n")}, "scale": None},
        resized=[(torch.rand(5), torch.tensor(-1.5)), (torch.rand(2), torch.tensor(0.5))],
    )


class DeviceCheck(torch.nn.Module):
    # PyTorch's test_device_eq: Tensor.device (prim::device) against a torch.device constant.
    def forward(self, a):
        if a.device != torch.device("cpu"):
            return a
        return torch.zeros_like(a)


@torch.jit.script
def add_if_same_device(a, b):
    if (a + 1).device == b.device:
        return a + b
    return a - b


def test_device_comparisons():
    assert_exports_equivalent(
        torch.jit.script(DeviceCheck()),
        (torch.ones(3, 3),),
        input_names=["a"],
        dynamic_axes={"a": {0: "a_0"}},
        resized=[(torch.ones(5, 3),)],
    )
    assert_exports_equivalent(
        add_if_same_device, (torch.ones(3), torch.rand(3)), resized=[(torch.rand(3), torch.rand(3))]
    )


class OptionalInputs(torch.nn.Module):
    def forward(self, x, y: Optional[Tensor] = None, z: Optional[Tensor] = None):
        if y is not None:
            x = x + y
        if z is None:
            x = x * 2
        return x


def test_optional_inputs_left_at_none_are_not_graph_inputs():
    model = torch.jit.script(OptionalInputs())
    program = assert_exports_equivalent(
        model, (torch.rand(3),), input_names=["x"], dynamic_axes={"x": [0]}, resized=[(torch.rand(5),)]
    )
    assert [value.name for value in program.model.graph.inputs] == ["x"]

    program = dynexport.export(model, (torch.rand(3),), kwargs={"z": torch.rand(3)}, dynamic_axes={"x": [0], "z": [0]})
    assert [value.name for value in program.model.graph.inputs] == ["x", "z"]
    x, z = torch.rand(4), torch.rand(4)
    assert_close(program(x, z), model(x, z=z))


def test_traced_optional_inputs_left_at_none_are_not_graph_inputs():
    # dynamo=False traces the module with the arguments that are not None only.
    model = OptionalInputs()
    program = assert_exports_equivalent(
        model, (torch.rand(3),), dynamo=False, input_names=["x"], dynamic_axes={"x": [0]}, resized=[(torch.rand(5),)]
    )
    assert [value.name for value in program.model.graph.inputs] == ["x"]

    program = dynexport.export(
        model, (torch.rand(3), None, torch.rand(3)), dynamo=False, dynamic_axes={"x": [0], "z": [0]}
    )
    assert [value.name for value in program.model.graph.inputs] == ["x", "z"]
    x, z = torch.rand(4), torch.rand(4)
    assert_close(program(x, z), model(x, None, z))


class DefaultTensors(torch.nn.Module):
    # PyTorch's test_mixed_optional_default_tensor.
    def forward(self, x, y: Optional[Tensor] = torch.ones(2, 3), z: Optional[Tensor] = torch.zeros(2, 3)):
        if y is not None:
            return x + y
        if z is not None:
            return x + z
        return x


@pytest.mark.parametrize(
    "args, inputs",
    [
        ((torch.randn(2, 3),), ["x"]),
        ((torch.randn(2, 3), None), ["x"]),
        ((torch.randn(2, 3), None, torch.randn(2, 3)), ["x", "z"]),
    ],
    ids=["defaults", "y_none", "z_given"],
)
def test_arguments_left_at_a_default_tensor_are_constants(args, inputs):
    model = torch.jit.script(DefaultTensors())
    program = dynexport.export(model, args)
    assert [value.name for value in program.model.graph.inputs] == inputs
    for call in (args, tuple(None if value is None else torch.randn(2, 3) for value in args)):
        assert_close(program(*(value for value in call if value is not None)), model(*call))


# --- Errors. -----------------------------------------------------------------------------------


class CountingBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.count = 0

    def forward(self, x):
        if bool(x.sum() > 0):
            self.count = self.count + 1
        return x + 1


def test_unconvertible_construct_names_the_construct_and_line():
    with pytest.raises(TorchScriptConversionError, match=r"prim::If.*SetAttr") as error:
        dynexport.export(torch.jit.script(CountingBranch()), (torch.ones(2),))
    assert "if bool(x.sum() > 0):" in error.value.source


def test_dynamo_false_traces_tensors_only():
    with pytest.raises(TypeError, match="argument 'scale' is float"):
        dynexport.export(Repeat(), (torch.ones(2), 2.0), dynamo=False)


class TupleOfOptionals(torch.nn.Module):
    def forward(self, x, y: Tuple[Optional[Tensor], Optional[Tensor]]):
        a, b = y
        if a is not None:
            return x + a
        if b is not None:
            return x + b
        return x


def test_none_inside_a_tuple_argument_is_refused():
    with pytest.raises(TypeError, match="argument 'y' holds None inside a tuple"):
        dynexport.export(torch.jit.script(TupleOfOptionals()), (torch.randn(2, 3), (None, torch.randn(2, 3))))


class AppendsInABranchOnData(torch.nn.Module):
    def forward(self, x):
        parts = [x]
        if bool(x.sum() > 0):
            parts.append(x * 2)
        return torch.cat(parts)


@pytest.mark.parametrize("opset", [13, 17])
def test_scripted_lists_and_branches_at_low_opsets(opset):
    # The branch returns a sequence: below opset 14 (Identity of sequences) it is copied
    # by SequenceInsert and SequenceErase.
    program = assert_exports_equivalent(
        torch.jit.script(AppendsInABranchOnData()),
        (torch.ones(2, 3),),
        dynamic_shapes={"x": {0: Dim("rows")}},
        resized=[(-torch.ones(4, 3),), (torch.randn(5, 3),)],
        opset_version=opset,
    )
    assert program.model.opset_imports[""] == opset and "If" in op_histogram(program)


class VariadicForward(torch.nn.Module):
    # ultralytics' models: forward(self, x, *args, **kwargs).
    def forward(self, x, *args, **kwargs):
        return torch.nn.functional.relu(x) * 2


def test_traced_forward_with_empty_variadic_arguments_and_a_dynamic_dim_of_example_size_one():
    # What torch.onnx's TorchScript exporter takes: a batch of one declared dynamic stays dynamic.
    program = assert_exports_equivalent(
        VariadicForward(),
        (torch.randn(1, 3),),
        dynamo=False,
        input_names=["images"],
        dynamic_axes={"images": {0: "batch"}},
        resized=[(torch.randn(4, 3),)],
    )
    assert [value.name for value in program.model.graph.inputs] == ["images"]
    assert str(program.model.graph.inputs[0].shape[0]) == "batch"


class ScalesByPythonNumbers(torch.nn.Module):
    def forward(self, x):
        return x.long() * 0.5 + 1, x.half() * 3.0, x.long() + torch.tensor(2.5, dtype=torch.float64)


def test_python_numbers_of_a_traced_model_promote_as_numbers():
    # The trace records `* 0.5` as a 0-dim float64 tensor; as a tensor it would make the product
    # float64 where eager's is float32 (a Python number does not widen a tensor's dtype); a 0-dim
    # tensor constant stays one (long + float64 tensor is float64).
    model, x = ScalesByPythonNumbers(), torch.arange(6.0).reshape(2, 3)
    program = dynexport.export(model, (x,), dynamo=False)
    actual, expected = program(x), model(x)
    assert [a.dtype for a in actual] == [torch.float32, torch.float16, torch.float64] == [e.dtype for e in expected]
    assert_close(actual, expected)


class PerImage(torch.nn.Module):
    """A Python loop over the batch, as ultralytics' NMSModel writes it: traced, it unrolls."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        rows = []
        for i in range(x.shape[0]):
            rows.append(self.linear(x[i]) * 2)
        return torch.stack(rows)


class SizeAsNumber(torch.nn.Module):
    def forward(self, x):
        n = int(x.shape[1])
        return x / n


def test_a_trace_unrolled_over_a_dynamic_dim_is_refused():
    with pytest.raises(TracedSizesError, match="when batch is 4 instead of 2") as error:
        dynexport.export(PerImage(), (torch.randn(2, 4),), dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    assert error.value.dims == ["batch"]
    assert "rows.append(self.linear(x[i]) * 2)" in error.value.source
    assert "36 operations, 20 in the example's trace" in str(error.value)
    # Static, the unrolled trace is right.
    assert_exports_equivalent(PerImage(), (torch.randn(2, 4),), dynamo=False)


def test_a_size_read_as_a_number_by_a_trace_is_refused_when_declared_dynamic():
    with pytest.raises(TracedSizesError, match=r"when n is 10 instead of 5: the constant 10 where the example's trace has 5"):
        dynexport.export(SizeAsNumber(), (torch.randn(2, 5),), dynamo=False, dynamic_shapes=({1: Dim("n")},))
    # Only the dim it reads matters: the batch may be dynamic.
    assert_exports_equivalent(
        SizeAsNumber(), (torch.randn(2, 5),), dynamo=False, dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.randn(7, 5),)],
    )


class TiedLengths(torch.nn.Module):
    """Two inputs whose lengths the model ties (``x`` twice ``y``'s): neither grows alone."""

    def forward(self, x, y):
        return x + y.repeat(1, 2)


def test_dims_that_do_not_grow_alone_are_left_unchecked():
    # Their retraces fail (eager raises on the mismatched lengths); the batch, shared by both
    # inputs, is still retraced, and the export goes on.
    assert_exports_equivalent(
        TiedLengths(), (torch.randn(2, 6), torch.randn(2, 3)), dynamo=False,
        input_names=["x", "y"], dynamic_axes={"x": {0: "batch", 1: "long"}, "y": {0: "batch", 1: "short"}},
        resized=[(torch.randn(3, 10), torch.randn(3, 5))],
    )
