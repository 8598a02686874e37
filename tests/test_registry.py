"""The table's mechanics: rule choice by opset and checker, user rules layered above ours, the
forms a rule may take."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import onnxscript
import pytest
import torch
from onnxscript import opset18

import dynexport
from dynexport.errors import OpsetTooLowError
from dynexport.registry import Rule, RuleForm, TranslationTable, default_table, rule_form

aten = torch.ops.aten


def _rule(name, **options):
    def fn(ctx, *args):
        return name

    return Rule(fn=fn, targets=(aten.relu.default,), **options)


def test_highest_applicable_opset_wins():
    table = TranslationTable([_rule("old"), _rule("new", min_opset=21)])
    assert table.lookup(aten.relu.default, None, 20).fn(None) == "old"
    assert table.lookup(aten.relu.default, None, 23).fn(None) == "new"


def test_lowest_opset_is_that_of_the_oldest_rule_accepting_the_node():
    table = TranslationTable([_rule("new", min_opset=21), _rule("newest", min_opset=23)])
    assert table.lookup(aten.relu.default, None, 20) is None
    assert table.lowest_opset(aten.relu.default, None) == 21
    assert TranslationTable([_rule("declines", min_opset=19, checker=lambda n: False)]).lowest_opset(
        aten.relu.default, object()
    ) is None
    assert table.lowest_opset(aten.sin.default, None) is None


def test_an_operator_translated_only_at_a_later_opset_is_refused_naming_that_opset():
    def model(x):
        return torch.nn.functional.grid_sample(x, torch.zeros(1, 2, 2, 2, 3), align_corners=False)

    with pytest.raises(OpsetTooLowError, match=r"aten.grid_sampler_3d.default .*from opset 20") as raised:
        dynexport.export(model, (torch.randn(1, 2, 3, 3, 3),), opset_version=19)
    assert raised.value.min_opset == 20 and "opset_version=20" in str(raised.value)


def test_a_rule_writing_an_op_the_opset_lacks_is_refused_naming_the_op():
    def mish(ctx, self):
        return ctx.op.Mish(self)

    with pytest.raises(OpsetTooLowError, match=r"ONNX Mish exists from opset 18") as raised:
        dynexport.export(
            torch.nn.Mish(), (torch.randn(2, 3),), opset_version=17,
            custom_translation_table={aten.mish.default: mish},
        )
    assert raised.value.uses[0].target == "aten.mish.default"
    assert "opset_version=18" in str(raised.value)


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


def test_user_rules_rank_above_builtin_ones_whatever_the_order_and_opset():
    builtin = _rule("builtin", builtin=True, min_opset=20)
    user = _rule("user")
    for rules in ([builtin, user], [user, builtin]):
        assert TranslationTable(rules).lookup(aten.relu.default, None, 20) is user
    declining = _rule("declining", checker=lambda node: False)
    node = torch.fx.Graph().placeholder("x")
    assert TranslationTable([builtin, declining]).lookup(aten.relu.default, node, 20) is builtin


_REGISTRATION_ORDER = textwrap.dedent("""
    import sys
    import torch
    import dynexport

    aten = torch.ops.aten
    x = torch.tensor([-1.0, 2.0])
    assert "dynexport.ops" not in sys.modules  # the built-in rules load at the first export

    @dynexport.translates(aten.relu.default)
    def relu_as_abs(ctx, self):
        return ctx.op.Abs(self)

    assert dynexport.export(torch.nn.ReLU(), (x,))(x).tolist() == [1.0, 2.0]
    assert "dynexport.ops" in sys.modules

    @dynexport.translates(aten.gelu.default)  # after; the built-in rule is Gelu from opset 20
    def gelu_as_neg(ctx, self, approximate="none"):
        return ctx.op.Neg(self)

    assert dynexport.export(torch.nn.GELU(), (x,))(x).tolist() == [1.0, -2.0]
""")


def test_translates_from_user_code_wins_registered_before_or_after_the_first_export():
    result = subprocess.run([sys.executable, "-c", _REGISTRATION_ORDER], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_rule_forms_are_told_apart_without_asking():
    def ours(ctx, x):
        return x

    def annotated(context: dynexport.TranslationContext, x):
        return x

    def theirs(self, other, alpha: float = 1.0):
        return opset18.Add(self, other)

    @onnxscript.script()
    def scripted(x):
        return opset18.Neg(x)

    assert rule_form(ours) is RuleForm.CONTEXT
    assert rule_form(annotated) is RuleForm.CONTEXT
    assert rule_form(theirs) is RuleForm.TORCH_ONNX
    assert rule_form(abs) is RuleForm.TORCH_ONNX
    assert rule_form(scripted) is RuleForm.ONNXSCRIPT_FUNCTION


def test_a_packet_in_the_table_stands_for_each_overload():
    def add_as_sub(self, other, alpha=1):
        return opset18.Sub(self, other)

    table = default_table.with_overrides({aten.add: add_as_sub})
    for overload in (aten.add.Tensor, aten.add.Scalar):
        rule = table.lookup(overload, None, 20)
        assert rule.form is RuleForm.TORCH_ONNX and not rule.builtin
    x, y = torch.tensor([1.0, 5.0]), torch.tensor([2.0, 3.0])
    program = dynexport.export(lambda a, b: a + b, (x, y), custom_translation_table={aten.add: add_as_sub})
    torch.testing.assert_close(program(x, y), x - y)


def test_a_failing_user_rule_is_not_called_a_dynexport_bug():
    def broken(self):
        raise KeyError("boom")

    with pytest.raises(dynexport.errors.TranslationError) as caught:
        dynexport.export(torch.nn.ReLU(), (torch.randn(2),), custom_translation_table={aten.relu.default: broken})
    assert "custom translation raised it" in str(caught.value) and "bug in dynexport" not in str(caught.value)
