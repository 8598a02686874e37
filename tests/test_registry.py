"""The table's mechanics: rule choice by opset and checker, user rules layered above ours."""

from __future__ import annotations

import pytest
import torch

import dynexport
from dynexport.registry import Rule, TranslationTable, default_table

aten = torch.ops.aten


def _rule(name, **options):
    def fn(ctx, *args):
        return name

    return Rule(fn=fn, targets=(aten.relu.default,), **options)


def test_highest_applicable_opset_wins():
    table = TranslationTable([_rule("old"), _rule("new", min_opset=21)])
    assert table.lookup(aten.relu.default, None, 20).fn(None) == "old"
    assert table.lookup(aten.relu.default, None, 23).fn(None) == "new"


def test_checker_declines_to_the_next_rule():
    table = TranslationTable([_rule("picky", checker=lambda node: False, min_opset=2), _rule("general")])
    node = torch.fx.Graph().placeholder("x")
    assert table.lookup(aten.relu.default, node, 20).fn(None) == "general"


def test_overrides_layer_above_and_fall_back_to_the_parent():
    base = TranslationTable([_rule("builtin")])
    layered = base.with_overrides({aten.relu.default: lambda ctx: "user"})
    assert layered.lookup(aten.relu.default, None, 20).fn(None) == "user"
    assert base.lookup(aten.relu.default, None, 20).fn(None) == "builtin"
    assert aten.relu.default in layered and aten.gelu.default not in layered


def test_register_and_unregister_translation():
    x = torch.tensor([-1.0, 2.0])
    dynexport.register_translation(aten.relu.default, lambda ctx, self: ctx.op.Abs(self))
    try:
        torch.testing.assert_close(dynexport.export(torch.nn.ReLU(), (x,))(x), x.abs())
    finally:
        dynexport.unregister_translation(aten.relu.default)
    torch.testing.assert_close(dynexport.export(torch.nn.ReLU(), (x,))(x), x.relu())
    assert aten.relu.default in default_table


def test_register_translation_rejects_bad_input():
    with pytest.raises(TypeError, match="must be callable"):
        dynexport.register_translation(aten.relu.default, "Abs")
    with pytest.raises(TypeError, match="overload such as"):
        dynexport.register_translation(aten.relu, lambda ctx, x: x)
    with pytest.raises(KeyError, match="no translation was registered"):
        dynexport.unregister_translation(aten.cosh.default)
