"""Recurrent modules on packed sequences (``pack_padded_sequence`` -> nn.LSTM/GRU/RNN ->
``pad_packed_sequence``), exported as one ONNX LSTM/GRU/RNN per layer with ``sequence_lens``, the
batch and the time steps dynamic, checked in onnxruntime against eager PyTorch at other batch
sizes and other lengths (shorter than the padded time too; the inputs past each length are noise,
and the padded outputs there must be the padding value)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import dynexport
from dynexport.errors import TranslationError
from tests.equivalence import assert_exports_equivalent, op_histogram

Dim = torch.export.Dim
aten = torch.ops.aten

# (lengths, padded time steps): the example, then other batch sizes and lengths.
EXAMPLE = ([5, 2, 3], 5)
RESIZED = [([3, 7, 1, 2], 7), ([1], 2), ([2, 1, 3, 3, 1], 6)]


class PackedRecurrent(nn.Module):
    """``rnn`` over the valid steps of padded sequences, as models write it."""

    def __init__(self, rnn: nn.RNNBase, *, enforce_sorted: bool = False, padding_value: float = 0.0,
                 total_length: bool = False):
        super().__init__()
        self.rnn, self.enforce_sorted = rnn, enforce_sorted
        self.padding_value, self.total_length = padding_value, total_length

    def forward(self, x, lengths, hx=None):
        batch_first = self.rnn.batch_first
        packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=self.enforce_sorted)
        output, hidden = self.rnn(packed, hx)
        total_length = x.size(1 if batch_first else 0) if self.total_length else None
        padded, lengths = pad_packed_sequence(
            output, batch_first=batch_first, padding_value=self.padding_value, total_length=total_length
        )
        return padded, hidden, lengths


def _states(rnn: nn.RNNBase, batch: int):
    shape = (rnn.num_layers * (2 if rnn.bidirectional else 1), batch, rnn.hidden_size)
    return (torch.randn(shape), torch.randn(shape)) if isinstance(rnn, nn.LSTM) else torch.randn(shape)


def _inputs(model: PackedRecurrent, lengths: list[int], steps: int, with_states: bool) -> tuple:
    rnn = model.rnn
    batch = len(lengths)
    x = torch.randn((batch, steps, rnn.input_size) if rnn.batch_first else (steps, batch, rnn.input_size))
    lengths = torch.tensor(sorted(lengths, reverse=True) if model.enforce_sorted else lengths)
    return (x, lengths, _states(rnn, batch)) if with_states else (x, lengths)


def _dims(model: PackedRecurrent, with_states: bool) -> tuple:
    batch, steps = Dim("batch"), Dim("steps")
    x = {0: batch, 1: steps} if model.rnn.batch_first else {0: steps, 1: batch}
    if not with_states:
        return x, {0: batch}
    states = ({1: batch}, {1: batch}) if isinstance(model.rnn, nn.LSTM) else {1: batch}
    return x, {0: batch}, states


def _assert_exports(model: PackedRecurrent, with_states: bool, **options) -> dynexport.ONNXProgram:
    torch.manual_seed(0)
    model.eval()
    program = assert_exports_equivalent(
        model, _inputs(model, *EXAMPLE, with_states), dynamic_shapes=_dims(model, with_states),
        resized=[_inputs(model, lengths, steps, with_states) for lengths, steps in RESIZED],
        rtol=1e-4, atol=1e-5, **options,
    )
    histogram = op_histogram(program)
    op = type(model.rnn).__name__
    assert histogram[op] == model.rnn.num_layers, histogram
    # Packing, the layers and padding in a chain: the layers read the padded input and padding
    # masks their padded output, so nothing is gathered into packed form or scattered back.
    assert not {"Loop", "Scan", "NonZero", "GatherND", "ScatterND"} & set(histogram), histogram
    return program


@pytest.mark.parametrize(
    "model, with_states",
    [
        (PackedRecurrent(nn.LSTM(4, 8, batch_first=True)), False),
        (PackedRecurrent(nn.LSTM(4, 8, num_layers=2, bidirectional=True), enforce_sorted=True), True),
        (PackedRecurrent(nn.LSTM(4, 8, bidirectional=True, bias=False, batch_first=True)), True),
        (PackedRecurrent(nn.GRU(4, 8, bidirectional=True, batch_first=True), enforce_sorted=True), True),
        (PackedRecurrent(nn.GRU(4, 8, num_layers=2)), False),
        (PackedRecurrent(nn.RNN(4, 8, num_layers=2, bidirectional=True, batch_first=True)), True),
        (PackedRecurrent(nn.RNN(4, 8, bidirectional=True, nonlinearity="relu"), enforce_sorted=True), False),
    ],
    ids=["lstm_batch_first", "lstm_2layer_bidirectional_sorted_states", "lstm_bidirectional_no_bias_states",
         "gru_bidirectional_batch_first_sorted_states", "gru_2layer", "rnn_tanh_2layer_bidirectional_states",
         "rnn_relu_bidirectional_sorted"],
)
def test_one_onnx_node_per_layer_with_sequence_lens(model, with_states):
    program = _assert_exports(model, with_states)
    recurrent = next(node for node in program.model.graph if node.op_type == type(model.rnn).__name__)
    assert recurrent.inputs[4] is not None  # sequence_lens


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "time_major"])
def test_total_length_and_padding_value(batch_first):
    # The padded time is then the input's, not the longest length; past each length, -1.5.
    model = PackedRecurrent(nn.GRU(4, 8, batch_first=batch_first), padding_value=-1.5, total_length=True)
    _assert_exports(model, with_states=False)


def test_dropout_between_layers_is_inactive_in_eval():
    _assert_exports(PackedRecurrent(nn.LSTM(4, 8, num_layers=2, dropout=0.5)), with_states=False)


@pytest.mark.parametrize("opset", [13, 15, 23])
def test_opsets(opset):
    # Sorted lengths: unsorting them is a scatter_, whose rule needs opset 16.
    model = PackedRecurrent(nn.LSTM(4, 8, num_layers=2, bidirectional=True, batch_first=True), enforce_sorted=True)
    _assert_exports(model, with_states=True, opset_version=opset)


class PackedDataRead(nn.Module):
    """A layer applied to the packed output's data, which is then padded: the packed layout (the
    valid steps, time-major, longest sequence first) is read as it is."""

    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.GRU(4, 8, batch_first=True), nn.Linear(8, 3)

    def forward(self, x, lengths):
        packed, hidden = self.rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        heads = PackedSequence(self.head(packed.data), packed.batch_sizes, packed.sorted_indices,
                               packed.unsorted_indices)
        return pad_packed_sequence(heads, batch_first=True)[0], packed.data.sum(0), hidden


def test_packed_data_read_by_other_layers():
    torch.manual_seed(0)
    model = PackedDataRead().eval()
    assert_exports_equivalent(
        model, (torch.randn(3, 5, 4), torch.tensor([5, 2, 3])),
        dynamic_shapes=({0: Dim("batch"), 1: Dim("steps")}, {0: Dim("batch")}),
        resized=[(torch.randn(4, 7, 4), torch.tensor([3, 7, 1, 2])), (torch.randn(2, 3, 4), torch.tensor([1, 2]))],
        rtol=1e-4, atol=1e-5,
    )


def test_projection_is_refused_naming_the_model_line():
    model = PackedRecurrent(nn.LSTM(4, 8, proj_size=3)).eval()
    with pytest.raises(TranslationError, match=r"(?s)proj_size.*output, hidden = self\.rnn\(packed, hx\)"):
        dynexport.export(model, _inputs(model, *EXAMPLE, with_states=False), dynamic_shapes=_dims(model, False))


def test_dropout_in_training_is_refused():
    model = PackedRecurrent(nn.GRU(4, 8, num_layers=2, dropout=0.5))
    with pytest.raises(TranslationError, match="no dropout between layers, which acts in training mode"):
        dynexport.export(model, _inputs(model, *EXAMPLE, with_states=False), dynamic_shapes=_dims(model, False),
                         training=torch.onnx.TrainingMode.TRAINING)


def test_capture_leaves_torch_as_it_was():
    kernels = {op: dict(op.py_kernels) for op in (aten.lstm.data, aten.gru.input, aten.rnn_relu.data)}
    check_forward_args = nn.RNNBase.check_forward_args
    model = PackedRecurrent(nn.GRU(4, 8)).eval()
    dynexport.export(model, _inputs(model, *EXAMPLE, with_states=False), dynamic_shapes=_dims(model, False))
    assert {op: dict(op.py_kernels) for op in kernels} == kernels
    assert nn.RNNBase.check_forward_args is check_forward_args
    assert torch._VF._pad_packed_sequence is torch._C._VariableFunctions._pad_packed_sequence
    assert torch._library.simple_registry.singleton.find("aten::_pack_padded_sequence").fake_impl.kernel is None


def test_program_verifies_against_itself_run_eagerly():
    # Its graph holds dynexport::pad_packed_sequence, which has an eager kernel too.
    torch.manual_seed(0)
    model = PackedRecurrent(nn.GRU(4, 8, batch_first=True)).eval()
    program = dynexport.export(model, _inputs(model, *EXAMPLE, with_states=False), dynamic_shapes=_dims(model, False))
    assert program.verify(*_inputs(model, *RESIZED[0], with_states=False)).passed
