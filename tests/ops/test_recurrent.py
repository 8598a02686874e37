"""aten.lstm / gru / rnn_tanh / rnn_relu as ONNX LSTM, GRU and RNN nodes, on padded and packed
sequences, checked against eager PyTorch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dynexport
from dynexport.errors import TranslationError
from tests.equivalence import assert_exports_equivalent, op_histogram

Dim = torch.export.Dim


def _sequences(module: nn.Module, batch: int, steps: int) -> torch.Tensor:
    shape = (batch, steps, module.input_size) if module.batch_first else (steps, batch, module.input_size)
    return torch.randn(shape)


def _dims(module: nn.Module, *, steps: bool) -> dict:
    batch_dim, step_dim = (0, 1) if module.batch_first else (1, 0)
    return {batch_dim: Dim("batch"), **({step_dim: Dim("steps")} if steps else {})}


@pytest.mark.parametrize(
    "module",
    [
        nn.LSTM(4, 8),
        nn.LSTM(4, 8, num_layers=2, bidirectional=True, batch_first=True),
        nn.LSTM(4, 8, bias=False, bidirectional=True),
        nn.GRU(4, 8),
        nn.GRU(4, 8, num_layers=2, bidirectional=True, batch_first=True),
        nn.GRU(4, 8, num_layers=3, bias=False),
        nn.RNN(4, 8),
        nn.RNN(4, 8, num_layers=2, bidirectional=True, batch_first=True, nonlinearity="relu"),
        nn.RNN(4, 8, bias=False, nonlinearity="relu"),
    ],
    ids=["lstm", "lstm_2layer_bidirectional_batch_first", "lstm_no_bias", "gru", "gru_2layer_bidirectional_batch_first",
         "gru_3layer_no_bias", "rnn_tanh", "rnn_relu_2layer_bidirectional_batch_first", "rnn_relu_no_bias"],
)
def test_one_onnx_node_per_layer_with_dynamic_steps(module):
    torch.manual_seed(0)
    module.eval()
    program = assert_exports_equivalent(
        module, (_sequences(module, 2, 5),), dynamic_shapes=(_dims(module, steps=True),),
        resized=[(_sequences(module, b, s),) for b, s in [(3, 9), (1, 2), (4, 1)]],
    )
    op = type(module).__name__
    assert op_histogram(program)[op] == module.num_layers


def test_initial_states_are_used():
    torch.manual_seed(0)
    module = nn.LSTM(4, 8, num_layers=2, bidirectional=True).eval()
    states = (torch.randn(4, 2, 8), torch.randn(4, 2, 8))
    batch = Dim("batch")
    grown_states = (torch.randn(4, 3, 8), torch.randn(4, 3, 8))
    assert_exports_equivalent(
        module, (torch.randn(5, 2, 4), states), dynamic_shapes=({1: batch}, ({1: batch}, {1: batch})),
        resized=[(torch.randn(5, 3, 4), grown_states)],
    )


def test_lstm_with_projection_decomposes():
    """ONNX LSTM has no projection (proj_size): the rule declines and torch's cell loop is used."""
    torch.manual_seed(0)
    module = nn.LSTM(4, 8, proj_size=3).eval()
    program = assert_exports_equivalent(module, (torch.randn(5, 2, 4),), dynamic_shapes=({1: Dim("batch")},),
                                        resized=[(torch.randn(5, 3, 4),)])
    assert "LSTM" not in op_histogram(program)


def test_lstm_with_projection_and_dynamic_steps_is_refused():
    # torch's decomposition would unroll the steps of the example, fixing them.
    module = nn.LSTM(4, 8, proj_size=3).eval()
    with pytest.raises(TranslationError, match=r"ONNX LSTM has no projection \(proj_size > 0\)"):
        dynexport.export(module, (torch.randn(5, 2, 4),), dynamic_shapes=({0: Dim("steps")},))


def test_capture_keeps_steps_dynamic():
    # torch.export records aten.gru as one node but would compute its output with torch's
    # unrolled time loop, fixing the steps; capture gives it a shape-only fake kernel.
    module = nn.GRU(4, 8).eval()
    assert_exports_equivalent(module, (torch.randn(5, 2, 4),), dynamic_shapes=({0: Dim("steps")},),
                              resized=[(torch.randn(7, 2, 4),)])


class _PackedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 8, num_layers=2, bidirectional=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        output, h_n = self.gru(packed)
        return nn.utils.rnn.pad_packed_sequence(output, padding_value=-1.0)[0], h_n


def test_packed_sequence_one_node_per_layer_with_sequence_lens():
    # The rules of packing, the recurrent op on packed data and padding (tests/test_packed_sequences.py
    # covers the modules' variants).
    torch.manual_seed(0)
    program = assert_exports_equivalent(
        _PackedGRU().eval(), (torch.randn(5, 3, 4), torch.tensor([5, 2, 3])),
        dynamic_shapes=({0: Dim("steps"), 1: Dim("batch")}, {0: Dim("batch")}),
        resized=[(torch.randn(7, 4, 4), torch.tensor([3, 6, 1, 2])), (torch.randn(2, 1, 4), torch.tensor([1]))],
        rtol=1e-4, atol=1e-5,
    )
    assert op_histogram(program)["GRU"] == 2


@pytest.mark.parametrize("cell", [nn.LSTMCell(5, 6), nn.GRUCell(5, 6), nn.RNNCell(5, 6, nonlinearity="relu")], ids=["lstm", "gru", "rnn_relu"])
def test_one_step_of_a_cell_is_its_gate_arithmetic(cell):
    torch.manual_seed(0)
    cell.eval()
    states = 2 if isinstance(cell, nn.LSTMCell) else 1

    def inputs(batch):
        state = tuple(torch.randn(batch, 6) for _ in range(states))
        return (torch.randn(batch, 5), state if states == 2 else state[0])

    batch = Dim("batch")
    state_dims = ({0: batch}, {0: batch}) if states == 2 else {0: batch}
    program = assert_exports_equivalent(
        cell, inputs(2), dynamic_shapes=({0: batch}, state_dims), resized=[inputs(5), inputs(1)], atol=1e-5
    )
    assert not {"LSTM", "GRU", "RNN"} & set(op_histogram(program))
