"""Custom operators: torch.library ops reach the table whole, custom domains and their opset
versions, custom translations in torch.onnx's forms, and the custom-domain fallback for operators
nobody translates."""

from __future__ import annotations

import warnings

import onnx
import onnxscript
import pytest
import torch
from onnxscript import opset18
from onnxscript import opset20 as op

import dynexport
from dynexport.errors import ExportError, TranslationError, UnsupportedOperatorError
from tests.equivalence import assert_exports_equivalent, op_histogram

BATCH = torch.export.Dim("batch")


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


def test_a_rule_that_reads_a_dynamic_size_as_an_int_is_refused():
    """A size read as an int fixes it to the example's for the whole program: the graph would be
    right at the example only. Refused, naming the operator, the dim and the fix."""

    def rows_as_int(ctx, x, scale):
        rows = int(ctx.node.meta["val"].shape[0])
        return ctx.op.Mul(ctx.op.Tanh(x), ctx.constant(scale / rows, x.dtype))

    with pytest.raises(TranslationError, match=r"(?s)scaled_tanh.*fixes sizes.*batch = 3.*op.Shape"):
        dynexport.export(
            UsesCustomOp(), (torch.randn(3, 4),), dynamic_shapes=({0: BATCH},),
            custom_translation_table={torch.ops.dynexport_custom.scaled_tanh.default: rows_as_int},
        )


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


# torch.onnx's forms, as its tutorial "Extending the ONNX Exporter Operator Support" writes them
# (the functions are copied unchanged).


def custom_aten_add(self, other, alpha: float = 1.0):
    if alpha != 1.0:
        alpha = opset18.CastLike(alpha, other)
        other = opset18.Mul(other, alpha)
    # To distinguish the custom implementation from the builtin one, we switch the order of the inputs
    return opset18.Add(other, self)


class AddModel(torch.nn.Module):
    def forward(self, input_x, input_y):
        return torch.ops.aten.add.Tensor(input_x, input_y)


class AddWithAlpha(torch.nn.Module):
    def forward(self, input_x, input_y):
        return torch.add(input_x, input_y, alpha=3)


@pytest.mark.parametrize("model", [AddModel(), AddWithAlpha()])
def test_torch_onnx_plain_function_translates_without_a_context(model):
    x, y = torch.tensor([1.0]), torch.tensor([2.0])
    program = assert_exports_equivalent(
        model, (x, y), resized=[(torch.randn(5), torch.randn(5))],
        custom_translation_table={torch.ops.aten.add.Tensor: custom_aten_add},
        dynamic_shapes=({0: BATCH}, {0: BATCH}),
    )
    add = next(n for n in program.model.graph if n.op_type == "Add")
    assert add.inputs[1].name == "input_x"  # the custom rule's order, not the built-in one's
    assert op_histogram(program)["Mul"] == (1 if isinstance(model, AddWithAlpha) else 0)


@pytest.mark.parametrize("opset", [18, 23])
def test_opset18_ops_written_into_models_of_other_opsets(opset):
    # CastLike was redefined at 19, 21 and 23 (new types only): the node means the same.
    program = assert_exports_equivalent(
        AddWithAlpha(), (torch.randn(3), torch.randn(3)), opset_version=opset,
        custom_translation_table={torch.ops.aten.add.Tensor: custom_aten_add},
    )
    assert program.model.opset_imports[""] == opset


microsoft_op = onnxscript.values.Opset(domain="com.microsoft", version=1)


@onnxscript.script(microsoft_op)
def custom_aten_gelu(self: onnxscript.FLOAT, approximate: str = "none") -> onnxscript.FLOAT:
    return microsoft_op.Gelu(self)


class GeluModel(torch.nn.Module):
    def forward(self, input_x):
        return torch.ops.aten.gelu(input_x)


def test_onnxscript_function_in_a_custom_domain_runs_in_onnxruntime():
    program = assert_exports_equivalent(
        GeluModel(), (torch.randn(3, 4),), resized=[(torch.randn(7, 4),)],
        custom_translation_table={torch.ops.aten.gelu.default: custom_aten_gelu},
        dynamic_shapes=({0: BATCH},),
    )
    assert [(n.domain, n.op_type) for n in program.model.graph] == [("com.microsoft", "Gelu")]
    assert program.model.opset_imports["com.microsoft"] == 1


class GeluBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) + x


def test_custom_domain_nodes_moved_into_module_functions_keep_their_import(tmp_path):
    model = torch.nn.Sequential(GeluBlock(), GeluBlock()).eval()
    program = assert_exports_equivalent(
        model, (torch.randn(3, 4),), resized=[(torch.randn(6, 4),)], f=tmp_path / "m.onnx",
        custom_translation_table={torch.ops.aten.gelu.default: custom_aten_gelu},
        export_modules_as_functions={GeluBlock}, dynamic_shapes=({0: BATCH},), report=True,
    )
    block = next(f for f in program.model_proto.functions if f.name == "GeluBlock")
    assert {o.domain: o.version for o in block.opset_import}["com.microsoft"] == 1
    assert program.model.opset_imports["com.microsoft"] == 1
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    assert (tmp_path / "m.report.md").exists()


@torch.library.custom_op("dynexport_custom::add_and_round_op", mutates_args=())
def add_and_round_op(input: torch.Tensor) -> torch.Tensor:
    return torch.round(input + input)


@add_and_round_op.register_fake
def _add_and_round_op_fake(tensor_x):
    return torch.empty_like(tensor_x)


class AddAndRoundModel(torch.nn.Module):
    def forward(self, input):
        return add_and_round_op(input)


def onnx_add_and_round(input):
    return opset18.Round(opset18.Add(input, input))


def test_torch_onnx_plain_function_translates_a_custom_op():
    program = assert_exports_equivalent(
        AddAndRoundModel(), (torch.tensor([1.0]),), resized=[(torch.randn(6) * 3,)],
        custom_translation_table={torch.ops.dynexport_custom.add_and_round_op.default: onnx_add_and_round},
        dynamic_shapes=({0: BATCH},),
    )
    assert op_histogram(program) == {"Add": 1, "Round": 1}


custom_aten = onnxscript.values.Opset(domain="custom.aten", version=1)


@onnxscript.script(custom_aten)
def custom_aten_add_script(input_x, input_y, alpha: float = 1.0):
    alpha = opset18.CastLike(alpha, input_y)
    input_y = opset18.Mul(input_y, alpha)
    return opset18.Add(input_x, input_y)


class AddThenScale(torch.nn.Module):
    def forward(self, x, y):
        return torch.add(x, y, alpha=2) * x + torch.add(x, y)


def test_onnxscript_function_is_inlined_with_its_attributes_and_verifies():
    # alpha reaches the function as the int 2 and as its default 1.0; its body reads a float.
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    table = {torch.ops.aten.add.Tensor: custom_aten_add_script}
    program = assert_exports_equivalent(
        AddThenScale(), (x, y), resized=[(torch.randn(5, 3), torch.randn(5, 3))],
        custom_translation_table=table, dynamic_shapes=({0: BATCH}, {0: BATCH}),
    )
    assert "custom.aten" not in program.model.opset_imports and not program.model.functions
    report = program.verify(x, y, compare_intermediates=True)
    assert report.passed
    report = dynexport.verify(AddThenScale(), (x, y), custom_translation_table=table, compare_intermediates=True)
    assert report.passed


def test_dynexport_export_verify_accepts_torch_onnx_forms():
    x = torch.randn(4)
    dynexport.export(AddAndRoundModel(), (x,), verify=True,
                     custom_translation_table={torch.ops.dynexport_custom.add_and_round_op.default: onnx_add_and_round})


def test_a_plain_function_calling_a_scripted_one_and_emitting_a_custom_domain_with_its_version():
    my_domain = onnxscript.values.Opset("my.domain", 2)

    @onnxscript.script(my_domain, default_opset=opset18)
    def ScaledTanh(x, scale: float):
        return opset18.Mul(opset18.Tanh(x), opset18.CastLike(scale, x))

    def scaled_tanh(x, scale):
        return ScaledTanh(x, scale=scale)

    x = torch.randn(2, 3)
    table = {torch.ops.dynexport_custom.scaled_tanh.default: scaled_tanh}
    assert_exports_equivalent(UsesCustomOp(), (x,), resized=[(torch.randn(4, 3),)],
                              custom_translation_table=table, dynamic_shapes=({0: BATCH},))


def test_custom_domain_version_comes_from_the_opset_and_custom_opsets_overrides_it():
    ort_v2 = onnxscript.values.Opset("com.example", 2)

    @onnxscript.script(ort_v2)
    def scaled_tanh_node(x, scale: float):
        return ort_v2.ScaledTanh(x, scale=scale)

    table = {torch.ops.dynexport_custom.scaled_tanh.default: scaled_tanh_node}
    program = dynexport.export(UsesCustomOp(), (torch.randn(2, 3),), custom_translation_table=table)
    assert program.model.opset_imports["com.example"] == 2
    onnx.checker.check_model(program.model_proto, full_check=True)
    program = dynexport.export(UsesCustomOp(), (torch.randn(2, 3),), custom_translation_table=table,
                               custom_opsets={"com.example": 5})
    assert program.model.opset_imports["com.example"] == 5


def test_one_custom_domain_at_two_versions_needs_custom_opsets():
    v1, v2 = onnxscript.values.Opset("com.example", 1), onnxscript.values.Opset("com.example", 2)

    @onnxscript.script(v1)
    def tanh_v1(x, scale: float):
        return v1.Tanh(x)

    @onnxscript.script(v2)
    def relu_v2(self, other):
        return v2.Relu(self)

    table = {torch.ops.dynexport_custom.scaled_tanh.default: tanh_v1, torch.ops.aten.sub.Tensor: relu_v2}

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.dynexport_custom.scaled_tanh(x, 2.0) - 1

    with pytest.raises(ExportError, match=r"'com.example' at versions \[1, 2\]"):
        dynexport.export(Model(), (torch.randn(2),), custom_translation_table=table)


def test_default_domain_ops_must_mean_the_same_at_the_model_opset():
    def rms_norm(input, normalized_shape, weight=None, eps=None):
        from onnxscript import opset23

        return opset23.RMSNormalization(input, weight, axis=-1, epsilon=eps or 1e-6)

    class Norm(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.rms_norm(x, [4], torch.ones(4))

    table = {torch.ops.aten.rms_norm.default: rms_norm}
    with pytest.raises(TranslationError, match="defined from opset 23") as caught:
        dynexport.export(Norm(), (torch.randn(2, 4),), custom_translation_table=table, opset_version=20)
    assert "opset_version=23" in str(caught.value)

    def grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
        return opset18.GridSample(input, grid, mode="bilinear", align_corners=int(align_corners))

    class Sample(torch.nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(x, grid, align_corners=False)

    args = (torch.randn(1, 1, 4, 4), torch.rand(1, 2, 2, 2) * 2 - 1)
    table = {torch.ops.aten.grid_sampler.default: grid_sample}
    with pytest.raises(TranslationError, match="GridSample means something else at opset 20"):
        dynexport.export(Sample(), args, custom_translation_table=table)
    assert_exports_equivalent(Sample(), args, custom_translation_table=table, opset_version=18)


class RoundsInABranch(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: add_and_round_op(t), lambda t: add_and_round_op(-t) * 2, (x,))


def test_torch_onnx_plain_function_inside_a_cond_branch():
    program = assert_exports_equivalent(
        RoundsInABranch(), (torch.ones(3),), resized=[(-torch.ones(5),), (torch.randn(4) * 3,)],
        custom_translation_table={torch.ops.dynexport_custom.add_and_round_op.default: onnx_add_and_round},
        dynamic_shapes=({0: BATCH},),
    )
    assert op_histogram(program)["If"] == 1


def test_batch_normalization_called_in_inference_mode_has_one_output():
    def batch_norm(input, weight, bias, running_mean, running_var, momentum, eps):
        normalized = opset18.BatchNormalization(input, weight, bias, running_mean, running_var, epsilon=eps)
        return normalized, None, None

    model = torch.nn.BatchNorm1d(3).eval()
    model.running_mean.uniform_(-1, 1)
    model.running_var.uniform_(0.5, 2)
    program = assert_exports_equivalent(
        model, (torch.randn(4, 3),), resized=[(torch.randn(9, 3),)], dynamic_shapes=({0: BATCH},),
        custom_translation_table={torch.ops.aten._native_batch_norm_legit_no_training.default: batch_norm},
    )
    assert [len(n.outputs) for n in program.model.graph if n.op_type == "BatchNormalization"] == [1]


def test_a_shape_with_symbolic_sizes_reaches_an_onnxscript_op_as_one_tensor():
    def view(self, size):
        return opset18.Reshape(self, size)

    class Regroup(torch.nn.Module):
        def forward(self, x):
            return x.view(x.shape[1] * 2, x.shape[0] // 2)

    # Two sizes known only at run time: no constant target can stand for this shape.
    program = assert_exports_equivalent(
        Regroup(), (torch.randn(4, 3),), resized=[(torch.randn(6, 5),)],
        dynamic_shapes=({0: 2 * torch.export.Dim("half_rows"), 1: torch.export.Dim("columns")},),
        custom_translation_table={torch.ops.aten.view.default: view},
    )
    assert op_histogram(program)["Concat"] == 1
