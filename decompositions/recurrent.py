"""Recurrent layers kept whole while capturing, with a symbolic number of time steps.

torch.export records ``aten.lstm``, ``aten.gru``, ``aten.rnn_tanh`` and ``aten.rnn_relu`` as
nodes, but computes their outputs with torch's decompositions: Python loops over the time steps
(over the values of the batch sizes, for a packed sequence), which would fix the sequence length
at the example's, or fail on a data-dependent one. While capturing, these operators get kernels
that give fake tensors outputs of the right shapes; real tensors still run torch's.

A packed sequence (``pack_padded_sequence`` -> recurrent module -> ``pad_packed_sequence``) needs
three more things, each for the duration of the capture only:

- ``aten._pack_padded_sequence`` gets a fake kernel: torch's gives the packed data the padded
  input's shape and the batch sizes a float dtype. Here the data is (total, *) and the batch sizes
  int64 (steps,), both sizes data-dependent.
- ``batch_sizes[0]``, which the recurrent modules read as the batch size of their initial states,
  is the padded input's batch size: every length is at least 1 (``pack_padded_sequence`` refuses
  others). Its ``int(...)``, in ``RNNBase.get_expected_hidden_size``, would fix that size at the
  example's, so that method reads the batch size too.
- ``aten._pad_packed_sequence`` takes its ``total_length`` as a plain int, fixed at the example's:
  ``dynexport::pad_packed_sequence`` stands for it, with a symbolic length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

__all__ = ["pad_packed_sequence", "recurrent_ops_kept_whole"]

aten = torch.ops.aten

_LSTM_GATES, _GRU_GATES, _RNN_GATES = 4, 3, 1


@torch.library.custom_op("dynexport::pad_packed_sequence", mutates_args=())
def pad_packed_sequence(
    data: torch.Tensor,
    batch_sizes: torch.Tensor,
    batch_first: bool,
    padding_value: float,
    total_length: int,
    batch: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._pad_packed_sequence`` with a symbolic ``total_length``; ``batch`` is
    ``batch_sizes[0]``, the padded result's batch size."""
    return aten._pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length)


@pad_packed_sequence.register_fake
def _padded_shapes(data, batch_sizes, batch_first, padding_value, total_length, batch):
    sizes = (batch, total_length) if batch_first else (total_length, batch)
    return data.new_empty((*sizes, *data.shape[1:])), batch_sizes.new_empty((batch,))


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


class _PackedBatches:
    """The batch size behind each ``batch_sizes`` tensor packed while capturing, found by the
    tensor's identity (a tensor's ``==`` is elementwise); the tensors are held, so that their ids
    are not reused."""

    def __init__(self) -> None:
        self._batches: dict[int, tuple[torch.Tensor, Any]] = {}

    def add(self, batch_sizes: torch.Tensor, batch: Any) -> None:
        self._batches[id(batch_sizes)] = (batch_sizes, batch)

    def get(self, batch_sizes: Any) -> Any:
        entry = self._batches.get(id(batch_sizes))
        return None if entry is None else entry[1]


def _packing(batches: _PackedBatches) -> Callable[..., Any]:
    """Fake kernel of ``aten._pack_padded_sequence``."""

    def pack(input, lengths, batch_first):
        ctx = torch.library.get_ctx()
        total, steps = ctx.new_dynamic_size(), ctx.new_dynamic_size(min=1)
        # No length exceeds the padded time (torch does not check it: it would read past the input).
        torch._check(steps <= input.shape[1 if batch_first else 0])
        data = input.new_empty((total, *input.shape[2:]))
        batch_sizes = lengths.new_empty((steps,), dtype=torch.int64)
        batches.add(batch_sizes, input.shape[0 if batch_first else 1])
        return data, batch_sizes

    return pack


class _PackedSequenceCalls(TorchFunctionMode):
    """``batch_sizes[0]`` of a packed sequence as its batch size (memoized as the value its
    ``.item()`` reads), and ``_pad_packed_sequence`` as ``dynexport::pad_packed_sequence``."""

    def __init__(self, batches: _PackedBatches):
        super().__init__()
        self._batches = batches

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch._C._VariableFunctions._pad_packed_sequence:
            return self._pad(*args, **kwargs)
        result = func(*args, **kwargs)
        if func is torch.Tensor.__getitem__ and type(args[1]) is int and args[1] == 0 and isinstance(result, FakeTensor):
            batch = self._batches.get(args[0])
            if batch is not None:
                result.item_memo = batch
        return result

    def _pad(self, data, batch_sizes, batch_first, padding_value, total_length):
        batch = self._batches.get(batch_sizes)
        if batch is None:
            return torch._C._VariableFunctions._pad_packed_sequence(
                data, batch_sizes, batch_first, padding_value, total_length
            )
        return torch.ops.dynexport.pad_packed_sequence(
            data, batch_sizes, batch_first, float(padding_value), total_length, batch
        )


@contextlib.contextmanager
def _expected_hidden_size_of_packed(batches: _PackedBatches) -> Iterator[None]:
    original = torch.nn.RNNBase.get_expected_hidden_size

    def get_expected_hidden_size(self, input, batch_sizes):
        batch = batches.get(batch_sizes)
        if batch is None:
            return original(self, input, batch_sizes)
        return (self.num_layers * (2 if self.bidirectional else 1), batch, self.proj_size or self.hidden_size)

    torch.nn.RNNBase.get_expected_hidden_size = get_expected_hidden_size
    try:
        yield
    finally:
        torch.nn.RNNBase.get_expected_hidden_size = original


@contextlib.contextmanager
def _packed_sequences() -> Iterator[None]:
    batches = _PackedBatches()
    library = torch.library.Library("aten", "FRAGMENT")
    try:
        torch.library.register_fake("aten::_pack_padded_sequence", _packing(batches), lib=library)
        with _expected_hidden_size_of_packed(batches), _PackedSequenceCalls(batches):
            yield
    finally:
        library._destroy()


@contextlib.contextmanager
def recurrent_ops_kept_whole() -> Iterator[None]:
    """While capturing, keep the recurrent operators whole with a symbolic sequence length, on
    padded and on packed sequences (see the module's docstring)."""
    with _shape_kernels(), _packed_sequences():
        yield
