"""Recurrent layers: ``aten.lstm``, ``aten.gru``, ``aten.rnn_tanh`` and ``aten.rnn_relu`` as ONNX
LSTM, GRU and RNN, one node per layer, on padded and on packed sequences.

The alternative, torch's decomposition, unrolls the time loop into one cell per step.
PyTorch stacks the gates of its weights as (input, forget, cell, output) for LSTM and
(reset, update, new) for GRU; ONNX wants (input, output, forget, cell) and (update, reset,
hidden), so each weight's gate blocks are reordered.

A packed sequence (``pack_padded_sequence``) holds the valid steps of its sequences time-major:
the steps at time 0 of every sequence (sorted longest first), then those at time 1, and so on,
with ``batch_sizes[t]`` the number of sequences longer than ``t``. Its operators (packing, each
recurrent op, padding) are translated one by one, each exactly: a recurrent op on packed data
scatters it back to padded (time, batch, features) form, runs one ONNX node per layer with
``sequence_lens`` (the lengths read back from ``batch_sizes``), and gathers the valid steps of
its output back into packed form. Where packed data comes straight from packing or from a
recurrent op (the usual pack -> LSTM -> pad chain), the next op reads the padded tensor it was
gathered from instead, whose steps past each length ``sequence_lens`` leaves out and padding
masks: the gathers and scatters are then left unused, and the optimizer drops them.
"""

from __future__ import annotations

import operator

import onnx_ir as ir
import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int, statically_known_true

from dynexport.decompositions import recurrent  # noqa: F401  (defines dynexport::pad_packed_sequence)
from dynexport.errors import TranslationError, source_line
from dynexport.ops._helpers import argument, cast, ints, pad, reduce, scalar, shape_tensor, split_equally, with_shape
from dynexport.registry import translates

aten = torch.ops.aten
dynexport_ops = torch.ops.dynexport

_LSTM_GATES = (0, 3, 1, 2)  # ONNX i, o, f, c from PyTorch i, f, g, o
_GRU_GATES = (1, 0, 2)  # ONNX z, r, h from PyTorch r, z, n
_RNN_GATES = (0,)


def _unsupported(node: torch.fx.Node) -> tuple[str, str] | None:
    """Why ONNX's recurrent ops cannot compute ``node``, and the fix; None when they can."""
    states = argument(node, "hx")
    states = states if isinstance(states, (list, tuple)) else [states]
    if states[0].meta["val"].shape[-1] != states[-1].meta["val"].shape[-1]:
        return (
            "ONNX LSTM has no projection (proj_size > 0)",
            (
                "a projection exports only with a static number of time steps, which torch's "
                "decomposition unrolls: give the module a padded tensor, not a PackedSequence, and "
                "its time dim as static"
            ),
        )
    if argument(node, "train") and argument(node, "dropout") > 0:
        return (
            "ONNX's recurrent ops have no dropout between layers, which acts in training mode",
            "export in eval mode (training=TrainingMode.EVAL, the default)",
        )
    # ONNX takes the hidden size as an attribute, and the gate blocks are sliced at fixed rows.
    static = all(is_concrete_int(v.meta["val"].shape[0]) for v in argument(node, "params")) and is_concrete_int(
        states[0].meta["val"].shape[-1]
    )
    if not static:
        return "the hidden size is symbolic, and ONNX takes it as an attribute", "make the hidden size static"
    return None


def _refuse_unsupported(ctx) -> None:
    unsupported = _unsupported(ctx.node)
    if unsupported is not None:
        raise TranslationError(str(ctx.node.target), source_line(ctx.node), *unsupported)


def _onnx_or_refused(node: torch.fx.Node) -> bool:
    """Checker of the padded ops: ONNX's op computes ``node``, or the rule refuses it because its
    number of steps is dynamic. Otherwise (static steps) it decomposes: torch's decomposition
    unrolls the steps, a projection and dropout included."""
    input = node.args[0].meta["val"]
    steps = input.shape[1 if argument(node, "batch_first") else 0]
    return _unsupported(node) is None or not is_concrete_int(steps)


def _reordered(ctx, weight, gates: tuple[int, ...]):
    """``weight``'s gate blocks (along dim 0) in ``gates`` order."""
    if len(gates) == 1:
        return weight
    size = weight.shape[0] // len(gates)
    blocks = [ctx.op.Slice(weight, ints(ctx, [g * size]), ints(ctx, [(g + 1) * size]), ints(ctx, [0])) for g in gates]
    return ctx.op.Concat(*blocks, axis=0)


def _stacked(ctx, weights):
    """One (directions, ...) tensor from a weight per direction."""
    return ctx.op.Concat(*[ctx.op.Unsqueeze(w, ints(ctx, [0])) for w in weights], axis=0)


def _layer_weights(ctx, params, layer: int, directions: int, has_biases: bool, gates: tuple[int, ...]):
    """The W, R and B inputs of ONNX LSTM/GRU/RNN for one layer (B is None without biases)."""
    per_direction = 4 if has_biases else 2
    chunks = [params[(layer * directions + d) * per_direction:][:per_direction] for d in range(directions)]
    input_weights = _stacked(ctx, [_reordered(ctx, c[0], gates) for c in chunks])
    recurrent_weights = _stacked(ctx, [_reordered(ctx, c[1], gates) for c in chunks])
    if not has_biases:
        return input_weights, recurrent_weights, None
    biases = [ctx.op.Concat(_reordered(ctx, c[2], gates), _reordered(ctx, c[3], gates), axis=0) for c in chunks]
    return input_weights, recurrent_weights, _stacked(ctx, biases)


def _layer_states(ctx, state, layer: int, num_layers: int, directions: int):
    """Rows ``layer * directions`` up to the next layer of a (layers * directions, batch, hidden) state."""
    if num_layers == 1:
        return state
    start = layer * directions
    return ctx.op.Slice(state, ints(ctx, [start]), ints(ctx, [start + directions]), ints(ctx, [0]))


def _sequence_output(ctx, y, directions: int, hidden: int):
    """ONNX's (seq, directions, batch, hidden) output as PyTorch's (seq, batch, directions * hidden)."""
    y = ctx.op.Transpose(y, perm=[0, 2, 1, 3])
    return ctx.op.Reshape(y, ints(ctx, [0, 0, directions * hidden]))


def _attributes(ctx) -> dict:
    """The attributes that set ONNX's recurrent op to compute as PyTorch's ``ctx.node`` does."""
    target = ctx.node.target
    if target in (aten.gru.input, aten.gru.data):
        return {"linear_before_reset": 1}  # PyTorch applies the reset gate after the recurrent product
    if target in (aten.rnn_relu.input, aten.rnn_relu.data):
        return {"activations": ["Relu"] * (2 if argument(ctx.node, "bidirectional") else 1)}
    return {}


def _run_layers(ctx, op_name, x, states, params, has_biases, num_layers, bidirectional, gates, sequence_lens=None):
    """Feed the time-major ``x`` through ``num_layers`` ONNX ``op_name`` nodes; returns the
    time-major output and, per state, the final states of every layer concatenated as PyTorch
    returns them."""
    directions = 2 if bidirectional else 1
    hidden = states[0].shape[-1]
    direction = "bidirectional" if bidirectional else "forward"
    attributes = _attributes(ctx)
    finals: list[list] = [[] for _ in states]
    for layer in range(num_layers):
        weights = _layer_weights(ctx, params, layer, directions, has_biases, gates)
        initial = [_layer_states(ctx, s, layer, num_layers, directions) for s in states]
        outputs = getattr(ctx.op, op_name)(
            x, *weights, sequence_lens, *initial, hidden_size=hidden, direction=direction,
            _outputs=1 + len(states), **attributes,
        )
        x = _sequence_output(ctx, outputs[0], directions, hidden)
        for final, value in zip(finals, outputs[1:]):
            final.append(value)
    return x, [f[0] if len(f) == 1 else ctx.op.Concat(*f, axis=0) for f in finals]


def _time_major(ctx, x, batch_first: bool, rank: int = 3):
    """``x`` with its first two dims swapped when ``batch_first`` (the swap is its own inverse)."""
    if not batch_first:
        return x
    return ctx.op.Transpose(x, perm=[1, 0, *range(2, rank)])


def _padded_layers(ctx, op_name, input, states, params, has_biases, num_layers, bidirectional, batch_first, gates):
    _refuse_unsupported(ctx)
    x = _time_major(ctx, input, batch_first)
    output, finals = _run_layers(ctx, op_name, x, states, params, has_biases, num_layers, bidirectional, gates)
    return _time_major(ctx, output, batch_first), finals


@translates(aten.lstm.input, checker=_onnx_or_refused)
def lstm(ctx, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    output, (h_n, c_n) = _padded_layers(
        ctx, "LSTM", input, hx, params, has_biases, num_layers, bidirectional, batch_first, _LSTM_GATES
    )
    return output, h_n, c_n


@translates(aten.gru.input, checker=_onnx_or_refused)
def gru(ctx, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    output, (h_n,) = _padded_layers(
        ctx, "GRU", input, [hx], params, has_biases, num_layers, bidirectional, batch_first, _GRU_GATES
    )
    return output, h_n


@translates(aten.rnn_tanh.input, aten.rnn_relu.input, checker=_onnx_or_refused)
def rnn(ctx, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    output, (h_n,) = _padded_layers(
        ctx, "RNN", input, [hx], params, has_biases, num_layers, bidirectional, batch_first, _RNN_GATES
    )
    return output, h_n


# -- packed sequences ---------------------------------------------------------------------


_PACKED_RECURRENT = (aten.lstm.data, aten.gru.data, aten.rnn_tanh.data, aten.rnn_relu.data)


def _batch(ctx, batch_sizes):
    """A packed sequence's number of sequences, ``batch_sizes[0]`` (every length is at least 1)."""
    return ctx.op.Gather(batch_sizes, ctx.constant(0, ir.DataType.INT64), axis=0)


def _valid_steps(ctx, batch_sizes):
    """The (steps, batch) mask of a packed sequence's valid steps: sequence ``b`` has a step at
    time ``t`` when ``b < batch_sizes[t]`` (the sequences are sorted longest first)."""
    zero, one = ctx.constant(0, batch_sizes.dtype), ctx.constant(1, batch_sizes.dtype)
    sequences = ctx.op.Range(zero, _batch(ctx, batch_sizes), one)
    return ctx.op.Less(ctx.op.Unsqueeze(sequences, ints(ctx, [0])), ctx.op.Unsqueeze(batch_sizes, ints(ctx, [1])))


def _positions(ctx, valid):
    """The (time, sequence) coordinates of the True entries of ``valid`` in time-major order: the
    padded position of each row of the packed data (GatherND's and ScatterND's indices)."""
    return ctx.op.Transpose(ctx.op.NonZero(valid), perm=[1, 0])


def _lengths(ctx, valid, dtype: ir.DataType):
    """Each sequence's length: its number of valid steps."""
    return reduce(ctx, "ReduceSum", cast(ctx, valid, dtype), [0], keepdims=False)


def _padded(ctx, data, valid, leading_shape, fill):
    """The packed ``data`` scattered into a (*leading_shape, *features) tensor of ``fill``s."""
    features = ctx.op.Slice(ctx.op.Shape(data), ints(ctx, [1]), ints(ctx, [len(data.shape)]))  # Shape's start: opset 15
    shape = ctx.op.Concat(leading_shape, features, axis=0)
    return ctx.op.ScatterND(ctx.op.Expand(fill, shape), _positions(ctx, valid), data)


@translates(aten._pack_padded_sequence.default)
def _pack_padded_sequence(ctx, input, lengths, batch_first):
    padded = _time_major(ctx, input, batch_first, len(input.shape))
    zero, one = ctx.constant(0, lengths.dtype), ctx.constant(1, lengths.dtype)
    times = ctx.op.Range(zero, reduce(ctx, "ReduceMax", lengths, keepdims=False), one)
    valid = ctx.op.Less(ctx.op.Unsqueeze(times, ints(ctx, [1])), ctx.op.Unsqueeze(lengths, ints(ctx, [0])))
    data = ctx.op.GatherND(padded, _positions(ctx, valid))
    batch_sizes = reduce(ctx, "ReduceSum", cast(ctx, valid, ir.DataType.INT64), [1], keepdims=False)
    return data, batch_sizes


def _getitem_of(argument: object) -> tuple[torch.fx.Node, int] | None:
    """(node, index) when the FX argument is output ``index`` of ``node``."""
    if isinstance(argument, torch.fx.Node) and argument.target is operator.getitem:
        return argument.args[0], argument.args[1]
    return None


def _padded_source(ctx, data) -> ir.Value | None:
    """The time-major padded tensor that ``ctx.node``'s packed ``data`` was gathered from here,
    when it comes straight from packing, or from a recurrent op, with the same batch sizes (that
    tensor's steps past each length are then never read); None for other packed data."""
    data_source = _getitem_of(argument(ctx.node, "data"))
    batch_sizes_source = _getitem_of(argument(ctx.node, "batch_sizes"))
    if data_source is None or batch_sizes_source is None or data_source[1] != 0:
        return None
    producer = data_source[0]
    if producer.target is aten._pack_padded_sequence.default:
        straight = batch_sizes_source == (producer, 1)
    else:
        straight = (
            producer.target in _PACKED_RECURRENT
            and _getitem_of(argument(producer, "batch_sizes")) == batch_sizes_source
        )
    gather = data.producer()
    if not straight or gather is None or gather.op_type != "GatherND":
        return None
    return gather.inputs[0]


def _layers_input(ctx, data, valid):
    """The layers' time-major padded input; ``sequence_lens`` leaves out its steps past each length."""
    padded = _padded_source(ctx, data)
    if padded is not None:
        return padded
    return _padded(ctx, data, valid, ctx.op.Shape(valid), ctx.constant(0, data.dtype))


def _packed_layers(ctx, op_name, data, batch_sizes, states, params, has_biases, num_layers, bidirectional, gates):
    _refuse_unsupported(ctx)
    valid = _valid_steps(ctx, batch_sizes)
    sequence_lens = _lengths(ctx, valid, ir.DataType.INT32)
    output, finals = _run_layers(
        ctx, op_name, _layers_input(ctx, data, valid), states, params, has_biases, num_layers, bidirectional,
        gates, sequence_lens,
    )
    return ctx.op.GatherND(output, _positions(ctx, valid)), finals


@translates(aten.lstm.data)
def lstm_data(ctx, data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
    output, (h_n, c_n) = _packed_layers(
        ctx, "LSTM", data, batch_sizes, hx, params, has_biases, num_layers, bidirectional, _LSTM_GATES
    )
    return output, h_n, c_n


@translates(aten.gru.data)
def gru_data(ctx, data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
    output, (h_n,) = _packed_layers(
        ctx, "GRU", data, batch_sizes, [hx], params, has_biases, num_layers, bidirectional, _GRU_GATES
    )
    return output, h_n


@translates(aten.rnn_tanh.data, aten.rnn_relu.data)
def rnn_data(ctx, data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
    output, (h_n,) = _packed_layers(
        ctx, "RNN", data, batch_sizes, [hx], params, has_biases, num_layers, bidirectional, _RNN_GATES
    )
    return output, h_n


def _masked_steps(ctx, padded, rank: int, lengths, total_length, fill):
    """A time-major ``padded`` tensor with ``total_length`` steps and ``fill`` past each length."""
    steps = shape_tensor(ctx, [total_length])
    kept = with_shape(ctx.op.Slice(padded, ints(ctx, [0]), steps, ints(ctx, [0])), [None] * rank)
    if not _is_step_count(ctx.node):  # total_length may exceed the output's steps
        kept_steps = ctx.op.Slice(ctx.op.Shape(kept), ints(ctx, [0]), ints(ctx, [1]))
        kept = pad(ctx, kept, [0, ctx.op.Sub(steps, kept_steps)], axes=[0])
    zero, one = ctx.constant(0, ir.DataType.INT64), ctx.constant(1, ir.DataType.INT64)
    times = ctx.op.Range(zero, scalar(ctx, total_length, ir.DataType.INT64), one)
    valid = ctx.op.Less(ctx.op.Unsqueeze(times, ints(ctx, [1])), ctx.op.Unsqueeze(lengths, ints(ctx, [0])))
    return ctx.op.Where(ctx.op.Unsqueeze(valid, ints(ctx, list(range(2, rank)))), kept, fill)


def _is_step_count(node: torch.fx.Node) -> bool:
    """Whether the padding ``node``'s total_length is its packed sequence's number of steps
    (``pad_packed_sequence`` without ``total_length``)."""
    total_length = argument(node, "total_length")
    total_length = total_length.meta["val"] if isinstance(total_length, torch.fx.Node) else total_length
    return statically_known_true(total_length == argument(node, "batch_sizes").meta["val"].shape[0])


@translates(dynexport_ops.pad_packed_sequence.default)
def pad_packed_sequence(ctx, data, batch_sizes, batch_first, padding_value, total_length):
    valid = _valid_steps(ctx, batch_sizes)
    lengths = _lengths(ctx, valid, ir.DataType.INT64)
    fill = ctx.constant(padding_value, data.dtype)
    source = _padded_source(ctx, data)
    if source is not None:
        padded = _masked_steps(ctx, source, len(data.shape) + 1, lengths, total_length, fill)
    else:
        padded = _padded(ctx, data, valid, shape_tensor(ctx, [total_length, _batch(ctx, batch_sizes)]), fill)
    return _time_major(ctx, padded, batch_first, len(data.shape) + 1), lengths


# -- single steps (nn.LSTMCell, nn.GRUCell, nn.RNNCell): the gate arithmetic itself ----------


def _projected(ctx, x, weight, bias):
    """``x @ weight.T + bias``; MatMul also takes an unbatched (1-D) x."""
    product = ctx.op.MatMul(x, ctx.op.Transpose(weight, perm=[1, 0]))
    return product if bias is None else ctx.op.Add(product, bias)


def _gate_blocks(ctx, gates, count: int) -> list:
    return split_equally(ctx, gates, -1, count)


@translates(aten.lstm_cell.default)
def lstm_cell(ctx, input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    h, c = hx
    gates = ctx.op.Add(_projected(ctx, input, w_ih, b_ih), _projected(ctx, h, w_hh, b_hh))
    i, f, g, o = _gate_blocks(ctx, gates, 4)
    cell = ctx.op.Add(ctx.op.Mul(ctx.op.Sigmoid(f), c), ctx.op.Mul(ctx.op.Sigmoid(i), ctx.op.Tanh(g)))
    return ctx.op.Mul(ctx.op.Sigmoid(o), ctx.op.Tanh(cell)), cell


@translates(aten.gru_cell.default)
def gru_cell(ctx, input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    r_i, z_i, n_i = _gate_blocks(ctx, _projected(ctx, input, w_ih, b_ih), 3)
    r_h, z_h, n_h = _gate_blocks(ctx, _projected(ctx, hx, w_hh, b_hh), 3)
    reset = ctx.op.Sigmoid(ctx.op.Add(r_i, r_h))
    update = ctx.op.Sigmoid(ctx.op.Add(z_i, z_h))
    new = ctx.op.Tanh(ctx.op.Add(n_i, ctx.op.Mul(reset, n_h)))
    # (1 - z) * n + z * h, as n + z * (h - n)
    return ctx.op.Add(new, ctx.op.Mul(update, ctx.op.Sub(hx, new)))


@translates(aten.rnn_tanh_cell.default, aten.rnn_relu_cell.default)
def rnn_cell(ctx, input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    total = ctx.op.Add(_projected(ctx, input, w_ih, b_ih), _projected(ctx, hx, w_hh, b_hh))
    return ctx.op.Tanh(total) if ctx.node.target is aten.rnn_tanh_cell.default else ctx.op.Relu(total)
