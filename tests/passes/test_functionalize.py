"""In-place ops are translated functionally without re-tracing, unless an alias could see the
mutation (then torch functionalizes the program)."""

from __future__ import annotations

import torch

import dynexport
from dynexport.passes.fx.functionalize import functional_variant, inplace_ops_are_local
from tests.equivalence import assert_exports_equivalent

aten = torch.ops.aten


def _graph(fn, *args):
    module = fn if isinstance(fn, torch.nn.Module) else _Wrap(fn)
    return torch.export.export(module, args, strict=False).graph


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _targets(graph):
    return [n.target for n in graph.nodes if n.op == "call_function"]


def test_functional_variant():
    assert functional_variant(aten.add_.Tensor) is aten.add.Tensor
    assert functional_variant(aten.relu_.default) is aten.relu.default
    assert functional_variant(aten.copy_.default) is aten.copy.default
    assert functional_variant(aten.add.Tensor) is None


def _chain(x):
    y = x * 2
    y.add_(1)
    y.relu_()
    return y * y


def test_owned_inplace_ops_are_local():
    graph = _graph(_chain, torch.randn(3))
    assert aten.add_.Tensor in _targets(graph)
    assert inplace_ops_are_local(graph)


def test_later_uses_read_the_mutated_value(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the program was re-traced")

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", forbidden)
    assert_exports_equivalent(_chain, (torch.randn(2, 3),))


def test_exported_program_given_by_the_user_is_not_modified():
    ep = torch.export.export(_Wrap(_chain), (torch.randn(3),), strict=False)
    before = [(n.target, n.args) for n in ep.graph.nodes]
    dynexport.export(ep, ())
    assert [(n.target, n.args) for n in ep.graph.nodes] == before


def test_mutation_through_a_view_is_left_to_torch():
    def fn(x):
        y = x.clone()
        y[:, 0] = 0.0
        return y

    assert not inplace_ops_are_local(_graph(fn, torch.randn(2, 3)))


def test_view_of_mutated_tensor_is_left_to_torch():
    def fn(x):
        y = x.clone()
        first = y[0]
        y.mul_(2)
        return first + 1

    assert not inplace_ops_are_local(_graph(fn, torch.randn(2, 3)))


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1)
        return x + self.calls


def test_buffer_mutation_is_seen_by_later_reads():
    assert_exports_equivalent(Counter(), (torch.randn(2, 3),))


def test_inplace_on_input():
    def fn(x):
        x.mul_(3)
        return x + 1

    x = torch.randn(2, 3)
    assert_exports_equivalent(lambda t: fn(t.clone()), (x,))


def test_export_falls_back_to_torch_functionalization_for_views():
    def fn(x):
        y = x.clone()
        y[:, 0] = 5.0
        return y * 2

    assert_exports_equivalent(fn, (torch.randn(2, 3),))
