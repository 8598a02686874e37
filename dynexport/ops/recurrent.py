"""Recurrent layers: ``aten.lstm`` and ``aten.gru`` as ONNX LSTM and GRU, one node per layer.

The alternative, torch's decomposition, unrolls the time loop into one cell per step.
PyTorch stacks the gates of its weights as (input, forget, cell, output) for LSTM and
(reset, update, new) for GRU; ONNX wants (input, output, forget, cell) and (update, reset,
hidden), so each weight's gate blocks are reordered.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from dynexport.ops._helpers import argument, ints
from dynexport.registry import translates

aten = torch.ops.aten

_LSTM_GATES = (0, 3, 1, 2)  # ONNX i, o, f, c from PyTorch i, f, g, o
_GRU_GATES = (1, 0, 2)  # ONNX z, r, h from PyTorch r, z, n


def _inference_without_projection(node: torch.fx.Node) -> bool:
    # LSTM projections (proj_size) have no ONNX counterpart; dropout only acts in training.
    states = argument(node, "hx")
    states = states if isinstance(states, (list, tuple)) else [states]
    same_sizes = states[0].meta["val"].shape[-1] == states[-1].meta["val"].shape[-1]
    # ONNX takes the hidden size as an attribute, and the gate blocks are sliced at fixed rows.
    static = all(is_concrete_int(v.meta["val"].shape[0]) for v in argument(node, "params")) and is_concrete_int(
        states[0].meta["val"].shape[-1]
    )
    return same_sizes and static and not (argument(node, "train") and argument(node, "dropout") > 0)


def _reordered(ctx, weight, gates: tuple[int, ...]):
    """``weight``'s gate blocks (along dim 0) in ``gates`` order."""
    size = weight.shape[0] // len(gates)
    blocks = [ctx.op.Slice(weight, ints(ctx, [g * size]), ints(ctx, [(g + 1) * size]), ints(ctx, [0])) for g in gates]
    return ctx.op.Concat(*blocks, axis=0)


def _stacked(ctx, weights):
    """One (directions, ...) tensor from a weight per direction."""
    return ctx.op.Concat(*[ctx.op.Unsqueeze(w, ints(ctx, [0])) for w in weights], axis=0)


def _layer_weights(ctx, params, layer: int, directions: int, has_biases: bool, gates: tuple[int, ...]):
    """The W, R and B inputs of ONNX LSTM/GRU for one layer (B is None without biases)."""
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


def _run_layers(ctx, op_name, input, states, params, has_biases, num_layers, bidirectional, batch_first, gates):
    """Feed ``input`` through ``num_layers`` ONNX ``op_name`` nodes; returns the sequence output
    and, per state, the final states of every layer concatenated as PyTorch returns them."""
    directions = 2 if bidirectional else 1
    hidden = states[0].shape[-1]
    direction = "bidirectional" if bidirectional else "forward"
    x = ctx.op.Transpose(input, perm=[1, 0, 2]) if batch_first else input
    finals: list[list] = [[] for _ in states]
    for layer in range(num_layers):
        weights = _layer_weights(ctx, params, layer, directions, has_biases, gates)
        initial = [_layer_states(ctx, s, layer, num_layers, directions) for s in states]
        extra = {"linear_before_reset": 1} if op_name == "GRU" else {}
        outputs = getattr(ctx.op, op_name)(
            x, *weights, None, *initial, hidden_size=hidden, direction=direction, _outputs=1 + len(states), **extra
        )
        x = _sequence_output(ctx, outputs[0], directions, hidden)
        for final, value in zip(finals, outputs[1:]):
            final.append(value)
    output = ctx.op.Transpose(x, perm=[1, 0, 2]) if batch_first else x
    return output, [f[0] if len(f) == 1 else ctx.op.Concat(*f, axis=0) for f in finals]


@translates(aten.lstm.input, checker=_inference_without_projection)
def lstm(ctx, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    output, (h_n, c_n) = _run_layers(
        ctx, "LSTM", input, hx, params, has_biases, num_layers, bidirectional, batch_first, _LSTM_GATES
    )
    return output, h_n, c_n


@translates(aten.gru.input, checker=_inference_without_projection)
def gru(ctx, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    output, (h_n,) = _run_layers(
        ctx, "GRU", input, [hx], params, has_biases, num_layers, bidirectional, batch_first, _GRU_GATES
    )
    return output, h_n


# -- single steps (nn.LSTMCell, nn.GRUCell, nn.RNNCell): the gate arithmetic itself ----------


def _projected(ctx, x, weight, bias):
    """``x @ weight.T + bias``; MatMul also takes an unbatched (1-D) x."""
    product = ctx.op.MatMul(x, ctx.op.Transpose(weight, perm=[1, 0]))
    return product if bias is None else ctx.op.Add(product, bias)


def _gate_blocks(ctx, gates, count: int) -> list:
    return list(ctx.op.Split(gates, axis=-1, num_outputs=count, _outputs=count))


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
