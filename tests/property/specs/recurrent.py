"""Property specs: LSTM, GRU and RNN layers on padded and packed sequences, and their cells
(dynexport/ops/recurrent.py)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tests.property.specs.common import F32, LOW_PRECISION_SUM, OpSpec, composite
from tests.property.strategies import FLOATS, Domain, tensors

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _recurrent(kind: str):
    gates = _GATES[kind]

    @composite
    def sample(draw, dtype):
        steps, batch, size, hidden = (
            draw(st.integers(1, 4)),
            draw(st.integers(1, 3)),
            draw(st.integers(1, 3)),
            draw(st.integers(1, 3)),
        )
        x = draw(tensors([steps, batch, size], dtype, Domain(-2, 2)))
        states = [draw(tensors([1, batch, hidden], dtype, Domain(-1, 1))) for _ in range(2 if kind == "lstm" else 1)]
        weights = [
            draw(tensors(shape, dtype, Domain(-1, 1)))
            for shape in ([gates * hidden, size], [gates * hidden, hidden], [gates * hidden], [gates * hidden])
        ]
        # The weights are constants of the one-op model, as a module's parameters are.
        return (x, *states), {"weights": weights}

    return sample


def _lstm(x, h, c, weights):
    return torch.lstm(x, (h, c), weights, True, 1, 0.0, False, False, False)


def _one_state_layer(op):
    return lambda x, h, weights: op(x, h, weights, True, 1, 0.0, False, False, False)


def _packed(kind: str):
    """A packed sequence (its data and batch sizes, from lengths sorted longest first), states and
    the weights of one bidirectional layer."""
    gates = _GATES[kind]

    @composite
    def sample(draw, dtype):
        batch, size, hidden = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
        lengths = sorted(draw(st.lists(st.integers(1, 4), min_size=batch, max_size=batch)), reverse=True)
        batch_sizes = torch.tensor([sum(length > t for length in lengths) for t in range(lengths[0])])
        data = draw(tensors([sum(lengths), size], dtype, Domain(-2, 2)))
        states = [draw(tensors([2, batch, hidden], dtype, Domain(-1, 1))) for _ in range(2 if kind == "lstm" else 1)]
        shapes = ([gates * hidden, size], [gates * hidden, hidden], [gates * hidden], [gates * hidden]) * 2
        weights = [draw(tensors(shape, dtype, Domain(-1, 1))) for shape in shapes]
        return (data, batch_sizes, *states), {"weights": weights}

    return sample


def _packed_lstm(data, batch_sizes, h, c, weights):
    return torch.lstm(data, batch_sizes, (h, c), weights, True, 1, 0.0, False, True)


def _packed_one_state(op):
    return lambda data, batch_sizes, h, weights: op(data, batch_sizes, h, weights, True, 1, 0.0, False, True)


def _cell(kind: str):
    gates = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}[kind]

    @composite
    def sample(draw, dtype):
        size, hidden = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        batch = draw(st.sampled_from([[], [1], [3]]))  # [] : one unbatched step
        x = draw(tensors([*batch, size], dtype, Domain(-2, 2)))
        states = [draw(tensors([*batch, hidden], dtype, Domain(-1, 1))) for _ in range(2 if kind == "lstm" else 1)]
        shapes = [[gates * hidden, size], [gates * hidden, hidden]] + draw(
            st.sampled_from([[], [[gates * hidden]] * 2])
        )
        weights = [draw(tensors(shape, dtype, Domain(-1, 1))) for shape in shapes]
        return (x, *states), {"weights": weights}

    return sample


def _lstm_cell(x, h, c, weights):
    return torch.lstm_cell(x, (h, c), *weights)


def _one_state_cell(op):
    return lambda x, h, weights: op(x, h, *weights)


SPECS: list[OpSpec] = [
    # float32 only: onnxruntime's LSTM and GRU have no float64 kernels.
    OpSpec("lstm.input", _lstm, _recurrent("lstm"), F32, tolerances={torch.float32: (1e-4, 1e-5)}),
    OpSpec("gru.input", _one_state_layer(torch.gru), _recurrent("gru"), F32, tolerances={torch.float32: (1e-4, 1e-5)}),
    OpSpec(
        "rnn_tanh.input",
        _one_state_layer(torch.rnn_tanh),
        _recurrent("rnn_tanh"),
        F32,
        tolerances={torch.float32: (1e-4, 1e-5)},
    ),
    OpSpec(
        "rnn_relu.input",
        _one_state_layer(torch.rnn_relu),
        _recurrent("rnn_relu"),
        F32,
        tolerances={torch.float32: (1e-4, 1e-5)},
    ),
    # The batch sizes must describe the data: grown sizes would not, so the exports are static.
    OpSpec("lstm.data", _packed_lstm, _packed("lstm"), F32, dynamic=False, static=True,
           tolerances={torch.float32: (1e-4, 1e-5)}),
    OpSpec("gru.data", _packed_one_state(torch.gru), _packed("gru"), F32, dynamic=False, static=True,
           tolerances={torch.float32: (1e-4, 1e-5)}),
    OpSpec("rnn_tanh.data", _packed_one_state(torch.rnn_tanh), _packed("rnn_tanh"), F32, dynamic=False,
           static=True, tolerances={torch.float32: (1e-4, 1e-5)}),
    OpSpec("rnn_relu.data", _packed_one_state(torch.rnn_relu), _packed("rnn_relu"), F32, dynamic=False,
           static=True, tolerances={torch.float32: (1e-4, 1e-5)}),
    OpSpec("lstm_cell.default", _lstm_cell, _cell("lstm"), FLOATS, tolerances=LOW_PRECISION_SUM),
    OpSpec("gru_cell.default", _one_state_cell(torch.gru_cell), _cell("gru"), FLOATS, tolerances=LOW_PRECISION_SUM),
    OpSpec(
        "rnn_tanh_cell.default",
        _one_state_cell(torch.rnn_tanh_cell),
        _cell("rnn_tanh"),
        FLOATS,
        tolerances=LOW_PRECISION_SUM,
    ),
    OpSpec(
        "rnn_relu_cell.default",
        _one_state_cell(torch.rnn_relu_cell),
        _cell("rnn_relu"),
        FLOATS,
        tolerances=LOW_PRECISION_SUM,
    ),
]
