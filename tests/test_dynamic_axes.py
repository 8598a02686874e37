"""torch.onnx's legacy dynamic_axes, input_names and output_names: output dims take the user's
names, names without a graph value warn, and every output gets a name of its own."""

from __future__ import annotations

import json

import pytest
import torch

import dynexport
from dynexport.translate import OUTPUT_DIMS_KEY
from tests.equivalence import assert_close, assert_exports_equivalent


def dims(value) -> list:
    return [d if isinstance(d, int) else str(d) for d in value.shape]


class Detector(torch.nn.Module):
    """A YOLO-like head: per-level predictions at strides 8, 16 and 32, concatenated along the
    anchors (every cell of every level)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=8, padding=1)
        self.down16 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.down32 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.head = torch.nn.Conv2d(8, 6, 1)

    def forward(self, images):
        p8 = self.stem(images)
        p16 = self.down16(p8)
        p32 = self.down32(p16)
        return torch.cat([self.head(p).flatten(2) for p in (p8, p16, p32)], 2)


def test_output_dims_take_the_names_dynamic_axes_gives():
    program = assert_exports_equivalent(
        Detector().eval(),
        (torch.randn(1, 3, 64, 96),),
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}},
        resized=[(torch.randn(2, 3, 128, 64),), (torch.randn(1, 3, 32, 32),)],
    )
    assert dims(program.model.graph.inputs[0]) == ["batch", 3, "height", "width"]
    assert dims(program.model.graph.outputs[0]) == ["batch", 6, "anchors"]
    sizes = json.loads(program.model.metadata_props[OUTPUT_DIMS_KEY])["output0"]
    assert sizes["0"] == "batch"
    assert "height" in sizes["2"] and "width" in sizes["2"] and "anchors" not in sizes["2"]
    anchors = program.model_proto.graph.output[0].type.tensor_type.shape.dim[2]
    assert anchors.dim_param == "anchors"


def test_an_output_dim_name_survives_the_optimizer_removing_the_last_node():
    program = assert_exports_equivalent(
        lambda x: (x[1:] * 2).unsqueeze(0).squeeze(0),
        (torch.randn(5, 3),),
        output_names=["y"],
        dynamic_axes={"x": {0: "n"}, "y": {0: "m"}},
        resized=[(torch.randn(9, 3),)],
    )
    assert dims(program.model.graph.outputs[0]) == ["m", 3]
    assert json.loads(program.model.metadata_props[OUTPUT_DIMS_KEY]) == {"y": {"0": "n - 1"}}


def test_list_form_names_output_dims_after_input_dims_or_the_output():
    program = assert_exports_equivalent(
        lambda x: (x.t(), x.flatten()),
        (torch.randn(4, 3),),
        output_names=["transposed", "flat"],
        dynamic_axes={"x": [0, 1], "transposed": [0, 1], "flat": [0]},
        resized=[(torch.randn(2, 7),)],
    )
    assert dims(program.model.graph.inputs[0]) == ["x_dim_0", "x_dim_1"]
    assert [dims(v) for v in program.model.graph.outputs] == [["x_dim_1", "x_dim_0"], ["flat_dim_0"]]
    assert json.loads(program.model.metadata_props[OUTPUT_DIMS_KEY]) == {"flat": {"0": "x_dim_0*x_dim_1"}}


def test_an_output_dim_named_like_an_input_dim_of_another_size_warns():
    with pytest.warns(UserWarning, match="'batch', a name that already stands for a size"):
        program = assert_exports_equivalent(
            lambda x: torch.cat([x, x]),
            (torch.randn(2, 3),),
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
            resized=[(torch.randn(5, 3),)],
        )
    assert dims(program.model.graph.outputs[0]) == ["batch", 3]
    assert json.loads(program.model.metadata_props[OUTPUT_DIMS_KEY]) == {"y": {"0": "2*batch"}}


def test_a_static_output_dim_keeps_its_size_with_a_warning():
    static = "dim 1 of the output 'y' dynamic \\('classes'\\), but the model always gives it size 3"
    with pytest.warns(UserWarning, match=static):
        program = assert_exports_equivalent(
            lambda x: x * 2,
            (torch.randn(2, 3),),
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch", 1: "classes"}},
            resized=[(torch.randn(5, 3),)],
        )
    assert dims(program.model.graph.outputs[0]) == ["batch", 3]


class Masked(torch.nn.Module):
    def forward(self, x, mask=None):
        return x * 2 if mask is None else x * mask


@pytest.mark.parametrize("args", [(torch.randn(2, 3),), (torch.randn(2, 3), None)], ids=["omitted", "none"])
def test_an_input_name_for_an_argument_left_none_warns(args):
    with pytest.warns(UserWarning, match="input_names names 'mask', which is (None|left at its default)"):
        program = assert_exports_equivalent(
            Masked(),
            args,
            input_names=["x", "mask"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "mask": {0: "batch"}, "y": {0: "batch"}},
            resized=[(torch.randn(5, 3), *args[1:])],
        )
    assert [v.name for v in program.model.graph.inputs] == ["x"]
    assert dims(program.model.graph.outputs[0]) == ["batch", 3]


def test_dynamic_axes_of_an_argument_left_none_warn():
    with pytest.warns(UserWarning, match="dynamic_axes names the argument 'mask', which is left at its default"):
        assert_exports_equivalent(
            Masked(), (torch.randn(2, 3),), dynamic_axes={"x": {0: "batch"}, "mask": {0: "batch"}},
            resized=[(torch.randn(5, 3),)],
        )


def test_output_names_for_none_and_constant_outputs_warn():
    with pytest.warns(UserWarning) as record:
        program = assert_exports_equivalent(
            lambda x: (x * 2, None, torch.ones(3), 4.0),
            (torch.randn(2, 3),),
            output_names=["y", "aux", "ones", "four"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}, "aux": {0: "a"}, "ones": {0: "n"}, "four": {0: "f"}},
            resized=[(torch.randn(5, 3),)],
        )
    messages = [str(w.message) for w in record]
    assert any("'aux' an output the model returns as None" in m for m in messages)
    assert any("output 'ones' dynamic ('n'), but the model always gives it size 3" in m for m in messages)
    assert any("output 'four', which the model returns as the constant 4.0" in m for m in messages)
    outputs = [(v.name, dims(v)) for v in program.model.graph.outputs]
    assert outputs == [("y", ["batch", 3]), ("ones", [3]), ("four", [])]


@pytest.mark.parametrize(
    ("names", "listed"),
    [
        ({}, "Inputs: ['x', 'mask']; outputs: none named"),
        ({"input_names": ["x", "mask"], "output_names": ["y"]}, "Inputs: ['x', 'mask']; outputs: ['y']"),
        ({"input_names": ["features"]}, "Inputs: ['features', 'x', 'mask']"),
    ],
)
def test_a_dynamic_axes_name_that_is_nowhere_is_an_error_listing_the_names(names, listed):
    with pytest.raises(ValueError, match="'nope', which is neither an input nor an output") as error:
        dynexport.export(Masked(), (torch.randn(2, 3),), dynamic_axes={"nope": {0: "batch"}}, **names)
    assert listed in str(error.value)


def test_more_input_names_than_arguments_is_an_error():
    with pytest.raises(ValueError, match=r"input_names has 3 names, but the model takes 1 tensor input\(s\) .*at most 2 names fit"):
        dynexport.export(Masked(), (torch.randn(2, 3),), input_names=["x", "mask", "extra"])


def test_dynamic_axes_name_a_nested_input_by_its_flattened_name():
    program = assert_exports_equivalent(
        lambda x, pair: x + pair[0] * pair[1],
        (torch.randn(2, 3), [torch.randn(2, 3), torch.randn(1, 3)]),
        dynamic_axes={"x": {0: "batch"}, "pair_0": {0: "batch"}},
        resized=[(torch.randn(5, 3), [torch.randn(5, 3), torch.randn(1, 3)])],
    )
    assert [(v.name, dims(v)) for v in program.model.graph.inputs] == [
        ("x", ["batch", 3]), ("pair_0", ["batch", 3]), ("pair_1", [1, 3])
    ]


class Returns(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("offset", torch.randn(3))

    def forward(self, x):
        part = x[:, 1:]
        return part, part, x[:, 1:], x, x.view(-1), self.weight, self.offset, self.offset, 2, torch.zeros(2)


@pytest.mark.parametrize("optimize", [True, False])
def test_every_output_gets_a_name_of_its_own(optimize):
    program = assert_exports_equivalent(
        Returns().eval(),
        (torch.randn(2, 3),),
        dynamic_axes={"x": {0: "batch"}},
        resized=[(torch.randn(5, 3),)],
        optimize=optimize,
    )
    names = [v.name for v in program.model.graph.outputs]
    assert len(set(names)) == len(names) == 10


def test_output_names_may_take_the_name_of_an_inner_value():
    def doubled_plus_one(x):
        doubled = x * 2
        return doubled + 1

    for optimize in (True, False):
        program = assert_exports_equivalent(
            doubled_plus_one, (torch.randn(2, 3),), output_names=["mul"], optimize=optimize
        )
        assert [v.name for v in program.model.graph.outputs] == ["mul"]


class NamedLikeItsWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3))

    def forward(self, weight):
        return weight * self.weight


def test_default_names_step_aside_for_taken_ones():
    program = assert_exports_equivalent(NamedLikeItsWeight(), (torch.randn(2, 3),), resized=[(torch.randn(2, 3),)])
    assert [v.name for v in program.model.graph.inputs] == ["weight_1"]
    program = assert_exports_equivalent(lambda output: output * 2, (torch.randn(2, 3),))
    assert [v.name for v in program.model.graph.inputs] == ["output"]
    assert [v.name for v in program.model.graph.outputs] == ["output_1"]


@pytest.mark.parametrize(
    ("model", "names", "match"),
    [
        (NamedLikeItsWeight(), {"input_names": ["weight"]}, "input_names gives \\['weight'\\], already the name"),
        (Masked(), {"output_names": ["x"]}, "output_names gives \\['x'\\], already the name of an input"),
        (Masked(), {"input_names": ["y"], "output_names": ["y"]}, "input_names and output_names share \\['y'\\]"),
    ],
)
def test_a_name_the_user_gives_twice_is_an_error(model, names, match):
    with pytest.raises(ValueError, match=match):
        dynexport.export(model, (torch.randn(2, 3),), **names)


def test_dynamic_axes_on_a_function_of_star_args():
    def add(*t):
        return t[0] + t[1]

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    program = dynexport.export(add, (x, y), input_names=["a", "b"], dynamic_axes={"a": {0: "n"}, "b": {0: "n"}})
    assert [value.shape.dims[0] for value in program.model.graph.inputs] == ["n", "n"]
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    assert_close(program(x, y), x + y)


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, tokens, bias):
        return self.proj(tokens) + bias.mean()


@pytest.mark.parametrize(
    "dynamic_shapes",
    [
        ({0: "batch", 1: "seq"}, {0: "n"}),
        {"tokens": {0: "batch", 1: "seq"}, "bias": {0: "n"}},
        (("batch", "seq", None), ("n",)),
        ({0: torch.export.Dim("batch"), 1: "seq"}, {0: "n"}),
    ],
    ids=["tuple", "by-name", "per-axis-tuple", "with-a-Dim"],
)
def test_dim_names_as_strings_in_dynamic_shapes(dynamic_shapes):
    # torch.onnx's form: a string is a dynamic dim (a hint, as in dynamic_axes) named so.
    program = assert_exports_equivalent(
        Scorer().eval(), (torch.randn(2, 5, 4), torch.randn(3)), dynamic_shapes=dynamic_shapes,
        resized=[(torch.randn(3, 7, 4), torch.randn(6)), (torch.randn(1, 1, 4), torch.randn(1))],
    )
    assert [dims(value) for value in program.model.graph.inputs] == [["batch", "seq", 4], ["n"]]


def test_an_empty_string_dim_name_is_refused_before_capture():
    with pytest.raises(ValueError, match="axis 1 of input 'tokens' with an empty string"):
        dynexport.export(Scorer().eval(), (torch.randn(2, 5, 4), torch.randn(3)), dynamic_shapes=({0: "batch", 1: " "}, None))


@pytest.mark.parametrize("form", ["dynamic_axes", "strings"])
def test_a_name_given_to_several_input_axes_makes_them_one_dim(form):
    # BERT as torch.onnx's users export it: one name for the batch of both inputs. Captured as
    # two hints, the mask's batch stayed a symbol of its own (named batch_1, five nodes more);
    # one name is one size in ONNX, so the axes are declared equal.
    transformers = pytest.importorskip("transformers")
    from tests.models.families import VOCAB, text_inputs, tiny

    model = transformers.BertModel(tiny(
        transformers.BertConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64,
    )).eval()
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    options = (
        {"dynamic_axes": axes, "input_names": ["input_ids", "attention_mask"]} if form == "dynamic_axes"
        else {"dynamic_shapes": axes}
    )
    program = assert_exports_equivalent(
        model, (), text_inputs(2, 7), resized=[((), text_inputs(3, 11)), ((), text_inputs(1, 2))], **options
    )
    assert [dims(value) for value in program.model.graph.inputs] == [["batch", "seq"], ["batch", "seq"]]
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    declared = dynexport.export(
        model, (), kwargs=text_inputs(2, 7), dynamic_shapes={name: {0: batch, 1: seq} for name in axes}
    )
    assert len(program.model.graph) == len(declared.model.graph)


def test_a_name_reused_for_axes_of_unequal_examples_stays_a_hint_per_axis():
    # torch.onnx accepts one name reused loosely; the axes cannot be one size, so each stays a
    # hint of its own (the second named apart).
    program = assert_exports_equivalent(
        Scorer().eval(), (torch.randn(2, 5, 4), torch.randn(3)), input_names=["tokens", "bias"],
        dynamic_axes={"tokens": {1: "length"}, "bias": {0: "length"}},
        resized=[(torch.randn(2, 7, 4), torch.randn(2),)],
    )
    assert [dims(value) for value in program.model.graph.inputs] == [[2, "length", 4], ["length_1"]]


class StackedHalves(torch.nn.Module):
    def forward(self, a, b):
        first, second = torch.cat([a, b]).chunk(2)
        return first * 2 + second


def test_a_string_naming_a_declared_dim_is_that_dim():
    # {"a": {0: batch}, "b": {0: "batch"}}: the string names the user's Dim, so the axes are one
    # size (one symbol: cat-then-chunk stays dynamic, no batch_1). At another example size the
    # string stays a hint of its own.
    batch = torch.export.Dim("batch")
    program = assert_exports_equivalent(
        StackedHalves(), (torch.randn(2, 3), torch.randn(2, 3)), dynamic_shapes={"a": {0: batch}, "b": {0: "batch"}},
        resized=[(torch.randn(5, 3), torch.randn(5, 3)), (torch.randn(1, 3), torch.randn(1, 3))],
    )
    assert [dims(value) for value in program.model.graph.inputs] == [["batch", 3], ["batch", 3]]
    declared = dynexport.export(
        StackedHalves(), (torch.randn(2, 3), torch.randn(2, 3)), dynamic_shapes={"a": {0: batch}, "b": {0: batch}}
    )
    assert len(program.model.graph) == len(declared.model.graph)

    class Summed(torch.nn.Module):
        def forward(self, a, b):
            return a.sum(0) + b.sum(0)

    loose = assert_exports_equivalent(
        Summed(), (torch.randn(2, 3), torch.randn(4, 3)), dynamic_shapes={"a": {0: batch}, "b": {0: "batch"}},
        resized=[(torch.randn(5, 3), torch.randn(1, 3))],
    )
    assert [dims(value) for value in loose.model.graph.inputs] == [["batch", 3], ["batch_1", 3]]
