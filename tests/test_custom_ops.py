"""Custom operators: torch.library ops reach the table whole, custom domains and their opset
versions, and the custom-domain fallback for operators nobody translates."""

from __future__ import annotations

import warnings

import onnx
import onnxscript
import pytest
import torch
from onnxscript import opset20 as op

import dynexport
from dynexport.errors import UnsupportedOperatorError
from tests.equivalence import op_histogram


@torch.library.custom_op("dynexport_custom::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def forward(self, x):
        return torch.ops.dynexport_custom.scaled_tanh(x + 1, 2.5) - 1


def test_custom_op_reaches_the_table_whole_and_translates_with_standard_ops():
    def scaled_tanh_rule(ctx, x, scale):
        return ctx.op.Mul(ctx.op.Tanh(x), ctx.constant(scale, x.dtype))

    x = torch.randn(3, 4)
    program = dynexport.export(
        UsesCustomOp(), (x,), custom_translation_table={torch.ops.dynexport_custom.scaled_tanh.default: scaled_tanh_rule},
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    onnx.checker.check_model(program.model_proto, full_check=True)
    torch.testing.assert_close(program(torch.randn(6, 4)).shape, torch.Size([6, 4]))
    y = torch.randn(5, 4)
    torch.testing.assert_close(program(y), UsesCustomOp()(y))
    assert op_histogram(program)["Tanh"] == 1


@onnxscript.script(opset=onnxscript.values.Opset("my.domain", 2), default_opset=op)
def ScaledTanh(x, scale: float):
    return op.Mul(op.Tanh(x), op.CastLike(op.Constant(value_float=scale), x))


def test_rule_emitting_into_a_custom_domain_with_its_version():
    def rule(ctx, x, scale):
        return ctx.op.call(ScaledTanh, x, scale=scale)

    program = dynexport.export(
        UsesCustomOp(), (torch.randn(2, 3),),
        custom_translation_table={torch.ops.dynexport_custom.scaled_tanh.default: rule},
        custom_opsets={"my.domain": 2},
    )
    assert program.model.opset_imports["my.domain"] == 2
    proto = program.model_proto
    assert [f.name for f in proto.functions] == ["ScaledTanh"]
    onnx.checker.check_model(proto, full_check=True)
    x = torch.randn(2, 3)
    torch.testing.assert_close(program(x), UsesCustomOp()(x))


@torch.library.custom_op("dynexport_custom::opaque", mutates_args=())
def opaque(x: torch.Tensor, k: int, mode: str) -> torch.Tensor:
    return x * k


@opaque.register_fake
def _(x, k, mode):
    return torch.empty_like(x)


class UsesOpaque(torch.nn.Module):
    def forward(self, x):
        return torch.ops.dynexport_custom.opaque(x.relu(), 3, "fast") + 1


def test_custom_domain_fallback_keeps_the_op_as_one_node():
    with pytest.raises(UnsupportedOperatorError):
        dynexport.export(UsesOpaque(), (torch.randn(2, 3),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = dynexport.export(UsesOpaque(), (torch.randn(2, 3),), fallback="custom_domain")
    assert any("dynexport_custom.opaque.default" in str(w.message) for w in caught)
    nodes = [n for n in program.model.graph if n.domain == "pkg.torch.dynexport_custom"]
    assert len(nodes) == 1
    node = nodes[0]
    assert node.op_type == "opaque"
    assert node.attributes["k"].value == 3 and node.attributes["mode"].value == "fast"
    assert program.model.opset_imports["pkg.torch.dynexport_custom"] == 1
    onnx.checker.check_model(program.model_proto, full_check=True)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"custom_opsets": {"": 3}}, "default ONNX domain"),
        ({"custom_opsets": {"my.domain": 0}}, "positive int"),
        ({"fallback": "aten"}, "fallback='aten' is not supported"),
    ],
)
def test_bad_custom_options_fail_early(options, match):
    with pytest.raises(ValueError, match=match):
        dynexport.export(UsesOpaque(), (torch.randn(2, 3),), **options)
