"""Recurrent layers kept whole while capturing, with a symbolic number of time steps.

torch.export records ``aten.lstm``, ``aten.gru``, ``aten.rnn_tanh`` and ``aten.rnn_relu`` as
nodes, but computes their outputs with torch's decompositions: Python loops over the time steps
(over the values of the batch sizes, for a packed sequence), which would fix the sequence length
at the example's, or fail on a data-dependent one. While capturing, these operators get kernels
that give fake tensors outputs of the right shapes; real tensors still run torch's.

A packed sequence (``pack_padded_sequence`` -> recurrent module -> ``pad_packed_sequence``) needs
more, each for the duration of the capture only:

- ``aten._pack_padded_sequence`` gets a fake kernel: torch's gives the packed data the padded
  input's shape and the batch sizes a float dtype. Here the data is (total, *) and the batch sizes
  int64 (steps,), both sizes data-dependent; the padded input's batch size is remembered for the
  batch sizes tensor.
- The recurrent modules read ``batch_sizes[0]`` as the batch size of their initial states, a
  data-dependent value: the kernels of the recurrent ops state that it is the padded input's batch
  size (every length is at least 1: ``pack_padded_sequence`` refuses others), and so does
  ``RNNBase.check_forward_args``, whose ``int(batch_sizes[0])`` would fail.
- ``torch._VF._pad_packed_sequence`` is ``dynexport::pad_packed_sequence``: aten's takes its
  ``total_length`` as a plain int, which would be fixed at the example's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["pad_packed_sequence", "recurrent_ops_kept_whole"]

aten = torch.ops.aten

_LSTM_GATES, _GRU_GATES, _RNN_GATES = 4, 3, 1


class _PackedBatches:
    """The batch size of the padded input behind each ``batch_sizes`` tensor packed while
    capturing, found by the tensor's identity (a tensor's ``==`` is elementwise); the tensors are
    held until the capture ends, so that their ids are not reused."""

    def __init__(self) -> None:
        self._batches: dict[int, tuple[torch.Tensor, Any]] = {}

    def add(self, batch_sizes: torch.Tensor, batch: Any) -> None:
        self._batches[id(batch_sizes)] = (batch_sizes, batch)

    def get(self, batch_sizes: Any) -> Any:
        entry = self._batches.get(id(batch_sizes))
        return None if entry is None else entry[1]

    def clear(self) -> None:
        self._batches.clear()


# Captures are serialized (dynexport.capture.exclusive_tracing), so one table serves them all.
_PACKED_BATCHES = _PackedBatches()


@torch.library.custom_op("dynexport::pad_packed_sequence", mutates_args=())
def pad_packed_sequence(
    data: torch.Tensor, batch_sizes: torch.Tensor, batch_first: bool, padding_value: float, total_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._pad_packed_sequence`` with a symbolic ``total_length``."""
    return aten._pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length)


@pad_packed_sequence.register_fake
def _padded_shapes(data, batch_sizes, batch_first, padding_value, total_length):
    batch = _PACKED_BATCHES.get(batch_sizes)
    if batch is None:  # batch sizes the capture did not pack: batch_sizes[0], a data-dependent size
        batch = torch.library.get_ctx().new_dynamic_size(min=1)
    sizes = (batch, total_length) if batch_first else (total_length, batch)
    return data.new_empty((*sizes, *data.shape[1:])), batch_sizes.new_empty((batch,))


def _packed(input, lengths, batch_first):
    """Fake kernel of ``aten._pack_padded_sequence``."""
    ctx = torch.library.get_ctx()
    total, steps = ctx.new_dynamic_size(), ctx.new_dynamic_size(min=1)
    # No length exceeds the padded time (torch does not check it: it would read past the input).
    torch._check(steps <= input.shape[1 if batch_first else 0])
    data = input.new_empty((total, *input.shape[2:]))
    batch_sizes = lengths.new_empty((steps,), dtype=torch.int64)
    _PACKED_BATCHES.add(batch_sizes, input.shape[0 if batch_first else 1])
    return data, batch_sizes


def _check_first_layer(input_size, states: list[torch.Tensor], params: list[torch.Tensor], gates: int) -> None:
    # The sizes torch's kernel checks against the first layer's weights: said here, so that
    # torch.export relates (or fixes) the input and hidden sizes as it would.
    torch._check(input_size == params[0].shape[-1])
    torch._check(states[0].shape[-1] == params[1].shape[-1])
    torch._check(states[-1].shape[-1] * gates == params[0].shape[0])


def _padded_outputs(gates: int) -> Callable[..., Any]:
    """Output shapes of ``aten.{lstm,gru,rnn_tanh,rnn_relu}.input``."""

    def shapes(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        _check_first_layer(input.shape[-1], states, params, gates)
        for state in states:
            torch._check(state.shape[1] == input.shape[0 if batch_first else 1])
        directions = 2 if bidirectional else 1
        output = input.new_empty([*input.shape[:-1], directions * states[0].shape[-1]])
        return (output, *(state.new_empty(state.shape) for state in states))

    return shapes


def _packed_outputs(gates: int) -> Callable[..., Any]:
    """Output shapes of ``aten.{lstm,gru,rnn_tanh,rnn_relu}.data``: the output is packed like
    the input."""

    def shapes(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        _check_first_layer(data.shape[-1], states, params, gates)
        batch = _PACKED_BATCHES.get(batch_sizes)
        if batch is not None:
            for state in states:  # zeros of batch_sizes[0] rows when the module made them
                torch._check(state.shape[1] == batch)
        directions = 2 if bidirectional else 1
        output = data.new_empty([data.shape[0], directions * states[0].shape[-1]])
        return (output, *(state.new_empty(state.shape) for state in states))

    return shapes


_OUTPUT_SHAPES = {
    aten.lstm.input: _padded_outputs(_LSTM_GATES),
    aten.gru.input: _padded_outputs(_GRU_GATES),
    aten.rnn_tanh.input: _padded_outputs(_RNN_GATES),
    aten.rnn_relu.input: _padded_outputs(_RNN_GATES),
    aten.lstm.data: _packed_outputs(_LSTM_GATES),
    aten.gru.data: _packed_outputs(_GRU_GATES),
    aten.rnn_tanh.data: _packed_outputs(_RNN_GATES),
    aten.rnn_relu.data: _packed_outputs(_RNN_GATES),
}

_KERNEL_KEYS = (
    torch._C.DispatchKey.Autograd,
    torch._C.DispatchKey.CompositeImplicitAutograd,
    torch._C.DispatchKey.Meta,
)


def _fake_shapes_else(original: Callable[..., Any], shapes: Callable[..., Any]) -> Callable[..., Any]:
    """A kernel giving fake tensors ``shapes(...)`` without running ``original``, torch's time
    loop; real tensors still run ``original``."""

    def kernel(*args, **kwargs):
        return (shapes if isinstance(args[0], FakeTensor) else original)(*args, **kwargs)

    return kernel


@contextlib.contextmanager
def _shape_kernels() -> Iterator[None]:
    swapped = []
    for op, shapes in _OUTPUT_SHAPES.items():
        for key in _KERNEL_KEYS:
            original = op.py_kernels.get(key)
            if original is not None:
                swapped.append((op, key, original))
                op.py_kernels[key] = _fake_shapes_else(original, shapes)
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, original in swapped:
            op.py_kernels[key] = original
            op._dispatch_cache.clear()


@contextlib.contextmanager
def _forward_checks_of_packed_batches() -> Iterator[None]:
    """``RNNBase.check_forward_args`` with a packed sequence's batch size read from the capture's
    table instead of ``int(batch_sizes[0])``."""
    original = torch.nn.RNNBase.check_forward_args

    def check_forward_args(self, input, hidden, batch_sizes):
        batch = _PACKED_BATCHES.get(batch_sizes)
        if batch is None:
            return original(self, input, hidden, batch_sizes)
        self.check_input(input, batch_sizes)
        torch._check(hidden.shape[1] == batch)
        directions = 2 if self.bidirectional else 1
        self.check_hidden_size(hidden, (self.num_layers * directions, batch, self.proj_size or self.hidden_size))

    torch.nn.RNNBase.check_forward_args = check_forward_args
    try:
        yield
    finally:
        torch.nn.RNNBase.check_forward_args = original


@contextlib.contextmanager
def _packed_sequences() -> Iterator[None]:
    library = torch.library.Library("aten", "FRAGMENT")
    torch._VF._pad_packed_sequence = torch.ops.dynexport.pad_packed_sequence
    try:
        torch.library.register_fake("aten::_pack_padded_sequence", _packed, lib=library)
        with _forward_checks_of_packed_batches():
            yield
    finally:
        del torch._VF._pad_packed_sequence  # torch._VF's own again, looked up in torch._C
        library._destroy()
        _PACKED_BATCHES.clear()


@contextlib.contextmanager
def recurrent_ops_kept_whole() -> Iterator[None]:
    """While capturing, keep the recurrent operators whole with a symbolic sequence length, on
    padded and on packed sequences (see the module's docstring)."""
    with _shape_kernels(), _packed_sequences():
        yield
