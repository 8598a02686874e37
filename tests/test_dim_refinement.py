"""dynamic_shapes refined from torch.export's suggested fixes (dynexport/dim_refinement.py): each
model constrains a plain ``Dim``; the export applies the fix, says so (warning, metadata, report)
and the ONNX model matches eager PyTorch at sizes other than the example's."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.utils._sympy.numbers import int_oo

import dynexport
from dynexport.dim_refinement import DIM_REFINEMENTS_KEY, capture_refining_dims
from dynexport.errors import CaptureError, DimSpecializedError, ExampleTooSmallError
from tests.equivalence import assert_close, assert_exports_equivalent

Dim = torch.export.Dim


def _refinements(program: dynexport.ONNXProgram) -> dict[str, str]:
    return json.loads(program.model.metadata_props[DIM_REFINEMENTS_KEY])


def _input_dims(program: dynexport.ONNXProgram) -> dict[str, list]:
    return {v.name: [str(d) for d in v.shape] for v in program.model.graph.inputs}


class _ReflectPad(torch.nn.Module):
    def forward(self, x):
        return F.pad(x, (3, 3), mode="reflect")


def test_reflect_pad_bounds_the_padded_dim(tmp_path):
    x = torch.randn(2, 3, 8)
    report = tmp_path / "pad.report.md"
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: h: min=4 \(from the model\)"):
        program = assert_exports_equivalent(
            _ReflectPad(), (x,), dynamic_shapes={"x": {0: Dim("batch"), 2: Dim("h")}},
            resized=[(torch.randn(3, 3, 4),), (torch.randn(1, 3, 19),)], report=report,
        )
    assert _refinements(program) == {"h": "min=4"}
    assert _input_dims(program)["x"] == ["batch", "3", "h"]
    assert "- h: min=4 (from the model)" in report.read_text()


class _PositionEmbedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.positions = torch.nn.Parameter(torch.randn(16, 4))

    def forward(self, x):
        return x.unsqueeze(-1) * self.positions[: x.shape[1]]


def test_table_length_bounds_the_sequence():
    with pytest.warns(UserWarning, match=r"seq: max=16 \(from the model\)"):
        program = assert_exports_equivalent(
            _PositionEmbedding(), (torch.randn(2, 5),), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq")},),
            resized=[(torch.randn(3, 16),), (torch.randn(1, 2),)],
        )
    assert _refinements(program) == {"seq": "max=16"}
    assert _input_dims(program)["x"] == ["batch", "seq"]


class _PositionsAndScale(_PositionEmbedding):
    def forward(self, x, y):
        return super().forward(x), y * 2


def test_refined_dim_beside_dynamic_and_auto_hints():
    with pytest.warns(UserWarning, match=r"seq: max=16"):
        program = assert_exports_equivalent(
            _PositionsAndScale(), (torch.randn(2, 5), torch.randn(3)),
            dynamic_shapes={"x": {0: Dim.DYNAMIC, 1: Dim("seq")}, "y": {0: Dim.AUTO}},
            resized=[(torch.randn(4, 16), torch.randn(7))],
        )
    assert _input_dims(program) == {"x": ["x_dim_0", "seq"], "y": ["y_dim_0"]}


class _DownUp(torch.nn.Module):
    """A ResNet-style skip around a stride-2 conv and a 2x upsample: the sizes must be even."""

    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(3, 3, 3, stride=2, padding=1)

    def forward(self, x):
        return x + F.interpolate(self.down(x), scale_factor=2.0)


def test_skip_connection_makes_sizes_multiples_of_two():
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"h = 2\*_h \(from the model\)"):
        program = assert_exports_equivalent(
            _DownUp().eval(), (torch.randn(2, 3, 8, 6),),
            dynamic_shapes={"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}},
            resized=[(torch.randn(3, 3, 12, 4),), (torch.randn(1, 3, 2, 10),)],
        )
    assert _refinements(program) == {"h": "= 2*_h", "w": "= 2*_w"}
    assert _input_dims(program)["x"] == ["batch", "3", "2*_h", "2*_w"]


def test_a_declared_minimum_holds_for_the_multiple_the_model_makes_of_its_dim():
    torch.manual_seed(0)
    program = assert_exports_equivalent(
        _DownUp().eval(), (torch.randn(2, 3, 8, 6),),
        dynamic_shapes={"x": {0: Dim("batch"), 2: Dim("h", min=6), 3: Dim("w")}},
        resized=[(torch.randn(3, 3, 12, 4),)],
    )
    assert _refinements(program)["h"] == "= 2*_h"
    assert json.loads(program.model.metadata_props["pkg.dynexport.dim_ranges"])["2*_h"][0] == 6
    with pytest.raises(ValueError, match=r"dim 2 is 4, outside the range 2\*_h >= 6"):
        program(torch.randn(2, 3, 4, 6))


class _FrameCount(torch.nn.Module):
    # HuBERT's feature extractor (strides 5, 2, 2) leaves samples // 20 - 1 frames, and a guard
    # on their square: torch's solver suggests samples = 20*_samples.
    def forward(self, x):
        frames = x.shape[1] // 20 - 1
        return x * 2 if frames * frames > 1 else x


def test_a_guard_torch_bounds_by_a_multiple_gives_the_proven_minimum_instead():
    x = torch.randn(2, 400)
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: samples: min=60 \(from the model\)"):
        program = assert_exports_equivalent(
            _FrameCount(), (x,), dynamic_shapes=({1: Dim("samples")},),
            resized=[(torch.randn(2, 333),), (torch.randn(2, 60),), (torch.randn(2, 4321),)],
        )
    assert _refinements(program) == {"samples": "min=60"}
    assert _input_dims(program)["x"] == ["2", "samples"]
    with pytest.raises(ValueError, match="59"):
        program(torch.randn(2, 59))


def _shifted_sum(x, y):
    return x + y[1:]


def test_guards_without_a_suggested_fix_give_the_dim_a_minimum(torchvision):
    # torchvision's resnet18 with plain Dims: torch names guards such as (h - 1) // 32 + 1 != 1
    # (the last feature map is not 1x1) and suggests no fix; the smallest size from which they
    # hold becomes the minimum, and torch checks the refined range again.
    model = torchvision.models.resnet18(weights=None).eval()
    dims = ({0: torch.export.Dim("batch"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")},)
    with pytest.warns(UserWarning, match=r"h: min=33"):
        program = dynexport.export(model, (torch.randn(2, 3, 64, 64),), dynamic_shapes=dims)
    assert json.loads(program.model.metadata_props[DIM_REFINEMENTS_KEY]) == {"w": "min=33", "h": "min=33"}
    for shape in [(2, 3, 96, 80), (1, 3, 33, 200)]:
        x = torch.randn(shape)
        assert_close(program(x), model(x), atol=1e-4)
    with pytest.raises(ValueError, match=r"dim 2 is 32, outside the range h >= 33"):
        program(torch.randn(1, 3, 32, 64))


class _TFSamePadding(torch.nn.Module):
    """Two stride-2 convolutions padded as TensorFlow's "same" from the input's size (timm's
    ``tf_`` models): torch names guards such as ``h + max(0, 1 - h + 2*math.ceil(h / 2)) >= 3``."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, 4, 3, stride=2) for c in (3, 4))

    def forward(self, x):
        for conv in self.convs:
            pad_h, pad_w = (max((math.ceil(size / 2) - 1) * 2 + 3 - size, 0) for size in x.shape[2:])
            x = conv(F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2]))
        return x


def test_guards_in_math_ceil_give_the_dim_a_minimum():
    dims = ({0: Dim("batch"), 2: Dim("h"), 3: Dim("w")},)
    with pytest.warns(UserWarning, match=r"h: min=5"):
        program = assert_exports_equivalent(
            _TFSamePadding().eval(), torch.randn(2, 3, 32, 24), dynamic_shapes=dims,
            resized=[(torch.randn(1, 3, 5, 7),), (torch.randn(3, 3, 17, 30),)], atol=1e-5,
        )
    with pytest.raises(ValueError, match=r"dim 2 is 4, outside the range h \[5, 4096\]"):
        program(torch.randn(1, 3, 4, 8))


class _CeilModePools(torch.nn.Module):
    """A stride-4 stem and ceil-mode max pools (vovnet's, GoogLeNet's): with plain Dims, torch's
    constraint solver fails describing the guards ("Expected op to be '=='")."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, stride=4, padding=1)
        self.pools = torch.nn.Sequential(*(torch.nn.MaxPool2d(3, 2, ceil_mode=True) for _ in range(2)))

    def forward(self, x):
        return self.pools(self.stem(x)).mean((2, 3))


def test_dims_torchs_solver_fails_on_are_captured_as_hints_and_checked():
    dims = ({0: Dim("batch"), 2: Dim("h"), 3: Dim("w")},)
    with pytest.raises(AssertionError, match="Expected op to be"):
        torch.export.export(_CeilModePools().eval(), (torch.randn(2, 3, 64, 48),), dynamic_shapes=dims, strict=False)
    calls = [(torch.randn(b, 3, h, w),) for b, h, w in [(2, 64, 48), (1, 21, 37), (3, 97, 130)]]
    program = assert_exports_equivalent(_CeilModePools().eval(), calls[0], dynamic_shapes=dims, resized=calls[1:], atol=1e-6)
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "3", "h", "w"]
    with pytest.raises(ValueError, match=r"dim 2 is 12, outside the range h >= 13"):
        program(torch.randn(1, 3, 12, 48))


def test_equality_between_two_dims():
    with pytest.warns(UserWarning, match=r"b = a \+ 1 \(from the model\)"):
        program = assert_exports_equivalent(
            _shifted_sum, (torch.randn(4), torch.randn(5)), dynamic_shapes={"x": {0: Dim("a")}, "y": {0: Dim("b")}},
            resized=[(torch.randn(9), torch.randn(10))],
        )
    assert _refinements(program) == {"b": "= a + 1"}
    assert _input_dims(program) == {"x": ["a"], "y": ["a + 1"]}


class _Doubles(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_fixes_asked_for_again_stop_the_retries():
    from torch._dynamo.exc import UserError, UserErrorType

    captured_with = []

    def capture(module, args, kwargs, dynamic_shapes):
        captured_with.append(dynamic_shapes)
        message = "Constraints violated (seq)!\nSuggested fixes:\n  seq = Dim('seq', max=8)"
        violation = UserError(UserErrorType.CONSTRAINT_VIOLATION, message)
        raise CaptureError({"torch.export(strict=False)": violation})

    with pytest.raises(CaptureError), pytest.warns(UserWarning, match="seq: max=8"):
        capture_refining_dims(capture, _Doubles(), (torch.randn(4),), {}, {"x": {0: Dim("seq")}})
    assert [shapes["x"][0].max for shapes in captured_with] == [int_oo, 8]


def test_no_refinement_no_metadata():
    program = dynexport.export(_ReflectPad(), (torch.randn(2, 3, 8),), dynamic_shapes=({0: Dim("batch")},))
    assert DIM_REFINEMENTS_KEY not in program.model.metadata_props


class _FixedRows(torch.nn.Module):
    def forward(self, x):
        return (x * 2).view(3, -1)


def test_dim_the_model_makes_static_is_refused_with_the_model_line():
    with pytest.raises(DimSpecializedError, match=r"batch = 3") as error:
        dynexport.export(_FixedRows(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim("batch")},))
    assert error.value.dims == {"batch": 3}
    assert "view(3, -1)" in error.value.source and "test_dim_refinement.py" in error.value.source
    assert "Dim.AUTO" in str(error.value)


def test_dim_the_model_makes_static_is_refused_with_the_model_line_under_dynamic_axes():
    # dynamic_axes declares hints (Dim.DYNAMIC), which torch.export reports fixed without a fix.
    with pytest.raises(DimSpecializedError, match=r"batch \(x.shape\[0\]\) = 3") as error:
        dynexport.export(_FixedRows(), (torch.randn(3, 4),), input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    assert "view(3, -1)" in error.value.source
    assert "leave it out of dynamic_axes" in str(error.value)


class _SingleRowBranch(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 1:
            return x * 2
        return x * 3


def test_dim_a_size_test_fixes_at_an_example_of_one_is_refused():
    with pytest.raises(DimSpecializedError, match=r"batch = 1[\s\S]*example size of 2 or more") as error:
        dynexport.export(_SingleRowBranch(), (torch.randn(1, 4),), dynamic_shapes=({0: Dim("batch")},))
    assert "x.shape[0] == 1" in error.value.source


class _LoopOverChunks(torch.nn.Module):
    """A Python loop over ``seq`` in chunks of 4 (Qwen3-Next's gated delta rule, in 64s): torch
    fixes the count of chunks, and with it ``seq``, through a guard on a computed size."""

    def forward(self, x):
        padded = torch.nn.functional.pad(x, (0, 0, 0, (4 - x.shape[1] % 4) % 4))
        chunks = padded.reshape(x.shape[0], -1, 4, x.shape[-1])
        total = chunks[:, 0]
        for i in range(1, chunks.shape[1]):
            total = total + chunks[:, i]
        return total


@pytest.mark.parametrize(("seq", "fixing_code"), [(9, "for i in range("), (3, "padded.reshape(")])
def test_dim_fixed_through_a_computed_size_is_refused_with_the_model_line(seq, fixing_code):
    # at 3 the single chunk's contiguity question fixes the count first, in the reshape
    with pytest.raises(DimSpecializedError, match=rf"seq = {seq}") as error:
        dynexport.export(_LoopOverChunks(), (torch.randn(2, seq, 3),), dynamic_shapes=({1: Dim("seq")},))
    assert fixing_code in error.value.source and "test_dim_refinement.py" in error.value.source


def test_static_dim_of_one_does_not_blame_the_example_size():
    # A static size-1 dim is no reason for the "example size of 2 or more" hint, nor for
    # size-oblivious capture.
    with pytest.raises(DimSpecializedError, match=r"batch = 3") as error:
        dynexport.export(_FixedRows(), (torch.randn(3, 4, 1),), dynamic_shapes=({0: Dim("batch")},))
    assert "example size of 2 or more" not in str(error.value)


def test_static_dim_opted_in_with_auto():
    program = assert_exports_equivalent(_FixedRows(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim.AUTO},))
    assert _input_dims(program)["x"] == ["3", "4"]


class _TakeAlongDim(torch.nn.Module):
    def forward(self, x, indices):
        return torch.take_along_dim(x, indices, dim=1)


def test_take_along_dim():
    """torch's take_along_dim fixes the rows and the gathered-from length; the number of values
    taken stays dynamic once the user lets the others be static."""
    x, indices = torch.randn(3, 5), torch.randint(0, 5, (3, 4))
    with pytest.raises(DimSpecializedError, match=r"rows = 3, n = 5") as error:
        dynexport.export(
            _TakeAlongDim(), (x, indices),
            dynamic_shapes={"x": {0: Dim("rows"), 1: Dim("n")}, "indices": {0: Dim("rows"), 1: Dim("k")}},
        )
    assert "take_along_dim" in error.value.source
    program = assert_exports_equivalent(
        _TakeAlongDim(), (x, indices),
        dynamic_shapes={"x": {0: Dim.AUTO, 1: Dim.AUTO}, "indices": {0: Dim.AUTO, 1: Dim("k")}},
        resized=[(x, torch.randint(0, 5, (3, 9))), (x, torch.randint(0, 5, (3, 1)))],
    )
    assert _input_dims(program)["indices"] == ["3", "k"]


# -- transformers ---------------------------------------------------------------------------------


def test_bert_sequence_bounded_by_position_embeddings():
    transformers = pytest.importorskip("transformers")
    from tests.models.families import VOCAB, text_inputs, tiny

    model = transformers.BertModel(tiny(
        transformers.BertConfig, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128,
    )).eval()
    batch, seq = Dim("batch"), Dim("seq")
    with pytest.warns(UserWarning, match=r"seq: max=128 \(from the model\)"):
        program = assert_exports_equivalent(
            model, (), text_inputs(2, 7),
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
            resized=[((), text_inputs(3, 128)), ((), text_inputs(1, 3))],
        )
    assert _refinements(program) == {"seq": "max=128"}
    assert _input_dims(program)["input_ids"] == ["batch", "seq"]


def _decoder_call(model, batch: int, past: int, seq: int) -> dict:
    """New tokens, a mask over past and new positions (the last row left-padded) and the cache
    the model filled with ``past`` tokens."""
    from tests.models.families import VOCAB

    generator = torch.Generator().manual_seed(batch * 100 + past * 10 + seq)
    with torch.no_grad():
        prompt = torch.randint(1, VOCAB, (batch, past), generator=generator)
        cache = model(input_ids=prompt, use_cache=True).past_key_values
    attention_mask = torch.ones(batch, past + seq, dtype=torch.int64)
    attention_mask[-1, : past // 2] = 0
    return {
        "input_ids": torch.randint(1, VOCAB, (batch, seq), generator=generator),
        "attention_mask": attention_mask,
        "cache": cache,
    }


@pytest.mark.parametrize(
    ("family", "mask_length", "refinement"),
    [
        ("gpt2", "total", "min=4"),
        ("llama", "total", "min=4"),
        ("opt", "past + seq", "= past + seq"),  # OPT's positions come from the mask: torch ties it
    ],
)
def test_decoder_with_a_populated_dynamic_cache(family, mask_length, refinement):
    transformers = pytest.importorskip("transformers")
    from tests.models.families import DECODERS

    model = DECODERS[family](True).eval()
    batch, seq, past, total = Dim("batch"), Dim("seq"), Dim("past"), Dim("total")
    layers = model.config.num_hidden_layers
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: total},
        "cache": [[{0: batch, 2: past}] * layers] * 2,  # keys, values
    }
    registered = transformers.DynamicCache in pytree.SUPPORTED_NODES
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: total"):
        program = dynexport.export(model, (), kwargs=_decoder_call(model, 2, 5, 3), dynamic_shapes=dynamic_shapes)
    assert (transformers.DynamicCache in pytree.SUPPORTED_NODES) == registered  # a pytree node for the export only
    assert _refinements(program) == {"total": refinement}
    dims = _input_dims(program)
    assert dims["attention_mask"] == ["batch", mask_length] and dims["past_key_values.0.key"][2] == "past"
    assert str(program.model.graph.outputs[1].shape[2]) == "past + seq"
    for sizes in [(2, 5, 3), (3, 9, 1), (1, 2, 6)]:
        with torch.no_grad():
            expected = model(**_decoder_call(model, *sizes))
        actual = program(**_decoder_call(model, *sizes))  # takes and returns DynamicCache objects
        assert_close(actual.logits, expected.logits, atol=1e-4, where=f"logits at {sizes}")
        for got, want in zip(actual.past_key_values.layers, expected.past_key_values.layers):
            assert_close((got.keys, got.values), (want.keys, want.values), atol=1e-4, where=f"cache at {sizes}")


def test_a_decoder_returning_its_cache_with_the_defaults():
    # GPT-2 called with input ids only, as torch.onnx's legacy users export it: use_cache=True
    # returns a DynamicCache, which the export and the program's calls flatten.
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    program = dynexport.export(
        model, (torch.randint(0, 100, (2, 8)),), input_names=["input_ids"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}},
    )
    ids = torch.randint(0, 100, (3, 20))
    with torch.no_grad():
        expected = model(ids)
    actual = program(ids)
    assert_close(actual.logits, expected.logits, atol=1e-4)
    assert isinstance(actual.past_key_values, transformers.DynamicCache)
    assert_close(actual.past_key_values.layers[1].values, expected.past_key_values.layers[1].values, atol=1e-4)


class CeilsThroughFloats(torch.nn.Module):
    # MobileViT's unfolding: the side rounded up to whole patches through floats.
    def forward(self, x):
        height = int(math.ceil(x.shape[2] / 4) * 4)
        return F.interpolate(x, size=(height, x.shape[3]), mode="bilinear")


class CeilsInIntegers(torch.nn.Module):
    def forward(self, x):
        height = -(-x.shape[2] // 4) * 4
        return F.interpolate(x, size=(height, x.shape[3]), mode="bilinear")


def test_a_size_computed_through_floats_is_refused_naming_the_integer_form():
    spec = ({2: torch.export.Dim("h")},)
    with pytest.raises(CaptureError, match=r"float arithmetic[\s\S]*-\(-h // 32\) \* 32"):
        dynexport.export(CeilsThroughFloats(), (torch.randn(1, 2, 10, 8),), dynamic_shapes=spec)
    assert_exports_equivalent(  # the hint's form
        CeilsInIntegers(), (torch.randn(1, 2, 10, 8),), dynamic_shapes=spec,
        resized=[(torch.randn(1, 2, 13, 8),), (torch.randn(1, 2, 4, 8),)],
    )


def test_a_dim_fixed_at_a_float_size_line_names_the_integer_form():
    error = DimSpecializedError({"h": 96}, 'File "m.py", line 3, in f: int(math.ceil(h / 2) * 2)', {})
    assert "-(-h // 32) * 32" in str(error)
    assert "-(-h // 32)" not in str(DimSpecializedError({"h": 96}, 'File "m.py", line 3, in f: x.view(96, -1)', {}))


class PairsThenRow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.view(-1, 2).view(1, -1) * 2


def test_a_root_of_1_at_the_example_is_refused_naming_the_size_to_use():
    # n must be even (the view into pairs): refined n = 2*_n, whose root is 1 at n = 2, which
    # torch.export fixes ("specialized it to be a constant (2)"; shared dims crashed on it).
    with pytest.warns(UserWarning, match=r"n = 2\*_n"), pytest.raises(ExampleTooSmallError) as error:
        dynexport.export(PairsThenRow(), (torch.randn(2),), dynamic_shapes=({0: Dim("n")},))
    message = str(error.value)
    assert message.startswith("The example is too small for the dims' roots: n = 2*_n is 2 at the example")
    assert "in forward: return x.view(-1, 2).view(1, -1) * 2" in message and "n of 4 or more" in message
    assert error.value.dims == {"n": ("2*_n", 2, 4)}
    with pytest.warns(UserWarning, match=r"n = 2\*_n"):
        assert_exports_equivalent(
            PairsThenRow(), (torch.randn(4),), dynamic_shapes=({0: Dim("n")},),
            resized=[(torch.randn(2),), (torch.randn(10),)],
        )


def test_a_declared_root_of_1_is_refused_before_any_capture():
    model = PairsThenRow()
    with pytest.raises(ExampleTooSmallError, match=r"2\*_n is 2 at the example.*\n.*2\*_n of 4 or more\.$"):
        dynexport.export(model, (torch.randn(2),), dynamic_shapes=({0: 2 * Dim("_n")},))
    assert model.calls == 0


class SlicedPositionTable(torch.nn.Module):
    # MPT's ALiBi bias: a table for the longest sequence, its last `seq` positions taken with a
    # start of `max(0, 16 - seq)`, a guard torch's solver cannot prove (it holds below 16).
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(16.0)[None, :].repeat(3, 1))

    def forward(self, x):
        start = max(0, self.table.size(1) - x.shape[1])
        return x + self.table[:, start:]


def test_guards_holding_up_to_a_size_bound_the_dim_there():
    with pytest.warns(UserWarning, match=r"seq: min=2, max=15, guards torch cannot prove checked at each size"):
        program = assert_exports_equivalent(
            SlicedPositionTable(), (torch.randn(3, 8),), dynamic_shapes=({1: Dim("seq")},),
            resized=[(torch.randn(3, 2),), (torch.randn(3, 15),)],
        )
    with pytest.raises(ValueError, match=r"dim 1 is 16, outside the range seq \[2, 15\]"):
        program(torch.randn(3, 16))


_H = "L['x'].size()[2]"


def _unsatisfied(guard: str) -> str:
    return f"  - Not all values of h = {_H} in the specified range satisfy the generated guard {guard}"


def _h_after_one_violation(message: str) -> Dim:
    """The ``h`` a second capture gets after the first raised torch's constraint violation
    ``message`` for ``Dim("h")`` (axis 2 of an input ``x`` of 64)."""
    from torch._dynamo.exc import UserError, UserErrorType

    captured_with = []

    def capture(module, args, kwargs, dynamic_shapes):
        captured_with.append(dynamic_shapes["x"][2])
        if len(captured_with) == 1:
            raise CaptureError({"torch.export(strict=False)": UserError(UserErrorType.CONSTRAINT_VIOLATION, message)})
        return "program", "strategy"

    capture_refining_dims(capture, _Doubles(), (torch.randn(2, 3, 64),), {}, {"x": {2: Dim("h")}})
    return captured_with[1]


def test_guards_run_into_the_specializations_section_are_read_whole():
    # transformers' EfficientNet: torch's solver gives up on its guards and fixes both sides,
    # and starts that section on the last guard's line, without its period.
    message = "\n".join([
        "Constraints violated (h)! For more information, run with TORCH_LOGS=\"+dynamic\".",
        _unsatisfied(f"2560*(((-1) + ({_H} // 32)) // 2560) < ({_H} // 32)."),
        _unsatisfied(f"64 <= {_H} and {_H} <= IntInfinity()Specializations unexpectedly required (h)! For more "
                     "information, run with TORCH_LOGS=\"+dynamic\"."),
        f"  - solving the guards generated for h = {_H} resulted in a specialized value of 64.\n",
        "Suggested fixes:\n  h = 64",
    ])
    with pytest.warns(UserWarning, match=r"h: min=64, max=4096, guards torch cannot prove checked"):
        hint = _h_after_one_violation(message)
    assert (hint.min, hint.max) == (64, 4096)


def test_suggested_minimums_are_raised_to_where_every_named_guard_holds():
    # transformers' CvT: torch suggests h: min=19 from its bound guard, though the floor-division
    # guard it names too holds from 35 on; the next capture would ask for that, one round later.
    message = "\n".join([
        "Constraints violated (h)! For more information, run with TORCH_LOGS=\"+dynamic\".",
        _unsatisfied(f"(1 + (((-3) + {_H}) // 32)) != 1."),
        _unsatisfied(f"19 <= {_H} and {_H} <= IntInfinity()"),
        "Suggested fixes:\n  h = Dim('h', min=19)",
    ])
    with pytest.warns(UserWarning, match=r"h: min=35"):
        assert _h_after_one_violation(message).min == 35
