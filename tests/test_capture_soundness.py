"""Every capture strategy gives a graph that is right at other inputs than the example, or none.

One test per strategy: non-strict and strict results checked at inputs that take another path
or size; draft_export's graph refused when its report lists values fixed from the example; the
TorchScript front end taken for modules that call scripted code, and refused when the module
cannot be scripted (never traced, which would unroll the loop for the example).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import dynexport
from dynexport.capture import UnsoundCapture
from dynexport.errors import CaptureError
from dynexport import guard_audit
from dynexport.guard_audit import UncheckedGuards, check_guards_hold
from tests.equivalence import BATCH, assert_close, assert_exports_equivalent, op_histogram
from tests.seed_models import LoopModel2, loop


@torch.jit.script
def weighted_row_sum(x):
    total = torch.zeros_like(x[0])
    for i in range(x.size(0)):
        total = total + x[i] * i
    return total


class RowSum(torch.nn.Module):
    def forward(self, x):
        return weighted_row_sum(x) + 1


def tripled_loop(x, y):
    return loop(x, y) * 3


class HelperCallingScript(torch.nn.Module):
    def forward(self, x, y):
        return tripled_loop(x, y)


class ScriptedSubmodule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.jit.script(LoopModel2())

    def forward(self, x, y):
        return self.body(x, y) * 2


class UnscriptableForward(torch.nn.Module):
    def forward(self, x, y):
        return loop(x, y) + sum(map(lambda t: t.sum(), [x]))


class DataDependentBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


@torch.library.custom_op("dynexport_soundness::positives", mutates_args=())
def positives(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0]


class BoxesAboveThreshold(torch.nn.Module):
    """torchvision's NMS pattern: a branch on whether any box is left."""

    def forward(self, boxes, scores):
        kept = boxes[scores > 0.5]
        if kept.numel() == 0:
            return kept.new_zeros((0, 4))
        return kept * 2


class PythonLoop(torch.nn.Module):
    def forward(self, x, n):
        for _ in range(int(n)):
            x = x * 2
        return x


def test_non_strict_capture_keeps_data_dependent_branch_and_dynamic_batch():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))

    x = torch.ones(3, 4)
    program = assert_exports_equivalent(
        Model(), (x,), dynamic_shapes=({0: BATCH},), resized=[(-torch.ones(5, 4),), (torch.ones(1, 4),)]
    )
    assert program.capture_strategy == "torch.export(strict=False)"


def test_strict_capture_when_only_dynamo_traces_the_model():
    class NumpySine(torch.nn.Module):
        def forward(self, x):
            return torch.from_numpy(np.sin(x.numpy())) + 1

    program = assert_exports_equivalent(
        NumpySine(), (torch.randn(3, 4),), dynamic_shapes=({0: BATCH},), resized=[(torch.randn(6, 4),)]
    )
    assert program.capture_strategy == "torch.export(strict=True)"


@pytest.mark.parametrize(
    ("model", "args", "line"),
    [
        (DataDependentBranch(), (torch.ones(3),), "if x.sum() > 0:"),
        (PythonLoop(), (torch.ones(3), torch.tensor(4)), "for _ in range(int(n)):"),
        (BoxesAboveThreshold(), (torch.rand(6, 4), torch.zeros(6)), "if kept.numel() == 0:"),
    ],
)
def test_draft_graph_with_values_of_the_example_is_refused(model, args, line):
    with pytest.raises(CaptureError) as caught:
        dynexport.export(model, args)
    error = caught.value
    assert list(error.reasons) == [
        "torch.export(strict=False)",
        "torch.export(strict=True)",
        "torch.export.draft_export",
    ]
    unsound = error.reasons["torch.export.draft_export"]
    assert isinstance(unsound, UnsoundCapture) and len(unsound.problems) == 1
    message = str(error)
    assert line in message and __file__ in message
    assert "torch._check" in message and "torch.cond" in message and "dynamo=False" in message


def test_every_problem_of_a_draft_graph_is_listed():
    class FiveBranches(torch.nn.Module):
        def forward(self, x):
            x = x + 1 if x[0] > 0 else x
            x = x + 2 if x[1] > 0 else x
            x = x + 3 if x[2] > 0 else x
            x = x + 4 if x[3] > 0 else x
            return x + 5 if x[4] > 0 else x

    with pytest.raises(CaptureError) as caught:
        dynexport.export(FiveBranches(), (torch.ones(5),))
    problems = caught.value.reasons["torch.export.draft_export"].problems
    assert [f"x[{i}] > 0" in problem for i, problem in enumerate(problems)] == [True] * 5
    assert "and 2 more" in str(caught.value)


def test_draft_graph_of_an_operator_without_fake_kernel_is_refused():
    class Model(torch.nn.Module):
        def forward(self, x):
            return positives(x) * 2

    with pytest.raises(CaptureError) as caught:
        dynexport.export(Model(), (torch.tensor([1.0, -1.0, 2.0]),))
    (problem,) = caught.value.reasons["torch.export.draft_export"].problems
    assert "dynexport_soundness.positives" in problem and "register_fake" in problem


def test_module_calling_a_scripted_loop_is_captured_through_torchscript():
    x = torch.ones(2, 3, dtype=torch.long)
    with pytest.warns(UserWarning, match=r"LoopModel2 was captured through torch\.jit\.script"):
        program = dynexport.export(LoopModel2(), (x, torch.tensor(5)), input_names=["input_data", "loop_range"])
    assert program.capture_strategy.startswith("torch.jit.script")
    assert op_histogram(program)["Loop"] == 1
    assert [value.name for value in program.model.graph.inputs] == ["input_data", "loop_range"]
    assert torch.equal(program(x, torch.tensor(9)), torch.full((2, 3), 37))
    for trip_count in (0, 1, 5, 12):
        assert_close(program(x, torch.tensor(trip_count)), loop(x, torch.tensor(trip_count)))


def test_scripted_submodule_captured_through_torchscript_with_a_dynamic_batch():
    model = ScriptedSubmodule()
    x = torch.randn(2, 3)
    with pytest.warns(UserWarning, match="torch.jit.script"):
        program = assert_exports_equivalent(
            model,
            (x, torch.tensor(3)),
            dynamic_shapes=({0: BATCH}, None),
            resized=[(torch.randn(5, 3), torch.tensor(0)), (torch.randn(1, 3), torch.tensor(7))],
        )
    assert op_histogram(program)["Loop"] == 1


def test_scripted_loop_over_a_dynamic_dim_is_captured_through_torchscript():
    # torch.export runs the scripted function with the example's size: a dim fixed to 4.
    with pytest.warns(UserWarning, match="Constraints violated"):
        program = assert_exports_equivalent(
            RowSum(),
            (torch.randn(4, 3),),
            dynamic_shapes=({0: torch.export.Dim("rows")},),
            resized=[(torch.randn(1, 3),), (torch.randn(7, 3),)],
        )
    assert op_histogram(program)["Loop"] == 1


def test_module_calling_scripted_code_through_a_helper_function_is_captured_through_torchscript():
    x = torch.ones(2, 3)
    with pytest.warns(UserWarning, match="torch.jit.script"):
        program = assert_exports_equivalent(
            HelperCallingScript(), (x, torch.tensor(2)), resized=[(x, torch.tensor(0)), (-x, torch.tensor(6))]
        )
    assert op_histogram(program)["Loop"] == 1


def test_unscriptable_module_calling_scripted_code_is_refused_not_traced():
    with pytest.raises(CaptureError) as caught:
        dynexport.export(UnscriptableForward(), (torch.ones(2, 3), torch.tensor(5)))
    error = caught.value
    assert list(error.reasons)[-2:] == ["torch.export.draft_export", "torch.jit.script"]
    assert isinstance(error.reasons["torch.export.draft_export"], UnsoundCapture)
    assert "for i in range(int(y)):" in str(error)


def test_given_draft_program_with_problems_is_refused_and_a_clean_one_exported():
    unsound = torch.export.draft_export(DataDependentBranch(), (torch.ones(3),))
    with pytest.raises(CaptureError) as caught:
        dynexport.export(unsound, ())
    assert "if x.sum() > 0:" in str(caught.value)

    clean = torch.export.draft_export(torch.nn.ReLU(), (torch.randn(3),))
    program = dynexport.export(clean, ())
    x = torch.randn(3)
    assert_close(program(x), torch.relu(x))


class _Pairs(torch.nn.Module):
    def forward(self, x, y):
        return x.view(x.shape[0], -1, 2) + y.view(y.shape[0], -1, 2)


def test_guards_that_admit_other_sizes_keep_the_dims_dynamic():
    # torch.export guards x.size(1) % 2 == 0, x.size(0) == y.size(0), ...: other sizes satisfy
    # them, so no dim is pinned and nothing is said (a pinned dim warns: tests/ops/test_shape.py).
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch.export's guards admit no other size")
        assert_exports_equivalent(
            _Pairs(), (x, y), input_names=["x", "y"], dynamic_axes={"x": [0, 1], "y": [0, 1]},
            resized=[(torch.randn(3, 12), torch.randn(3, 12)), (torch.randn(5, 4), torch.randn(5, 4))],
        )


class CachesOnFirstCall(torch.nn.Module):
    # ultralytics' Detect head: anchors computed for the first input's size, kept in attributes
    # that the class declares (``shape = None``) and forward sets on the instance.
    shape = None

    def forward(self, x):
        if self.shape != x.shape:
            self.offsets = torch.arange(x.shape[-1], dtype=x.dtype)
            self.shape = x.shape
        return x[..., ::2] + x[..., 1::2] + self.offsets[::2]


def test_attributes_set_by_forward_during_capture_are_removed():
    # The even width is a dim refinement, captured twice: the second capture must not read the
    # first one's cache (fake tensors), and the module is left as it was for eager calls.
    model = CachesOnFirstCall()
    with pytest.warns(UserWarning, match="width = 2\\*_width"):
        assert_exports_equivalent(
            model, (torch.randn(2, 6),), dynamic_shapes=({1: torch.export.Dim("width")},), resized=[(torch.randn(2, 10),)]
        )
    assert "offsets" in vars(model)  # set by the eager calls of the comparison, after the export
    model = CachesOnFirstCall()
    dynexport.export(model, (torch.randn(2, 6),), dynamic_shapes=({1: torch.export.Dim("width")},))
    assert "offsets" not in vars(model) and "shape" not in vars(model)


class CachesInADict(torch.nn.Module):
    # timm's LeViT in eval mode: a bias computed once per device, kept in a dict the module owns.
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(4))
        self.cache = {}

    def forward(self, x):
        if "cpu" not in self.cache:
            self.cache["cpu"] = self.bias * 2
        return x + self.cache["cpu"]


def test_containers_forward_fills_during_capture_are_left_as_they_were():
    model = CachesInADict().eval()
    program = dynexport.export(model, (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    assert model.cache == {}  # not the capture's fake tensor
    x = torch.randn(5, 4)
    torch.testing.assert_close(program(x), model(x))


_RECORDED: list[list[torch.Tensor]] = []


class RecordsEveryLayer(torch.nn.Module):
    # transformers' output recording (Segformer's decode head reads every stage's output): forward
    # hooks registered on the first call, which then marks the model as hooked.
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

    def forward(self, x):
        if not getattr(self, "hooked", False):
            for layer in self.layers:
                layer.register_forward_hook(lambda module, args, output: _RECORDED[-1].append(output))
            self.hooked = True
        _RECORDED.append([])
        for layer in self.layers:
            x = layer(x)
        return torch.cat(_RECORDED.pop(), dim=-1)


def test_hooks_forward_registers_during_capture_are_removed_with_the_mark():
    model = RecordsEveryLayer().eval()
    program = dynexport.export(model, (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    assert not any(layer._forward_hooks for layer in model.layers)
    x = torch.randn(5, 4)
    with torch.no_grad():
        expected = model(x)  # each layer recorded once: the hooks and the mark come back together
    torch.testing.assert_close(program(x), expected)


class PadsToEven(torch.nn.Module):
    # FocalNet's downsampling patch embedding: every fourth column, padded to an even count in
    # Python, then pairs of columns merged.
    def forward(self, x):
        x = x[..., ::4]
        if x.shape[-1] % 2 != 0:
            x = torch.nn.functional.pad(x, (0, 1))
        return x.reshape(x.shape[0], -1, 2).sum(-1)


def test_divisibility_guard_on_the_root_of_a_derived_dim_is_checked():
    # torch.export takes width = 4*_w without checking the model's _w % 2 == 0 (only its
    # ExportedProgram's module checks it at run time): the graph would be wrong at width 36.
    # The root is narrowed to even sizes.
    x = torch.randn(2, 32)
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: _w = 2\*__w"):
        program = assert_exports_equivalent(
            PadsToEven(), (x,), dynamic_shapes=({1: 4 * torch.export.Dim("_w", min=4)},), resized=[(torch.randn(2, 48),)]
        )
    with pytest.raises(ValueError, match=r"dim 1 is 36, which is no value of 8\*__w"):
        program(torch.randn(2, 36))
    with pytest.warns(UserWarning, match=r"width = 8\*_w"):  # torch's own fix for a plain Dim
        assert_exports_equivalent(
            PadsToEven(), (x,), dynamic_shapes=({1: torch.export.Dim("width")},), resized=[(torch.randn(2, 48),)]
        )


class AspectPreservingResize(torch.nn.Module):
    # torchvision's detection transform: scale by the smaller of two ratios of sizes. Non-strict
    # torch.export answers Python's ``min`` for the example (is the image wider than 2:1?) and
    # records a guard its solver drops.
    def forward(self, x):
        h, w = x.shape[-2:]
        scale = min(64 / min(h, w), 128 / max(h, w))
        return torch.nn.functional.interpolate(x, scale_factor=scale, mode="bilinear", recompute_scale_factor=True)


class AspectBranch(torch.nn.Module):
    def forward(self, x):
        h, w = x.shape[-2:]
        if h / w > 1.5:
            return x.transpose(-1, -2)
        return x * 2


SIDES = {"x": {2: torch.export.Dim("h", min=16, max=512), 3: torch.export.Dim("w", min=16, max=512)}}


def test_unchecked_guard_of_non_strict_capture_is_found_and_strict_capture_taken():
    model, x = AspectPreservingResize(), torch.rand(1, 3, 100, 70)
    non_strict = torch.export.export(model, (x,), dynamic_shapes=SIDES, strict=False)
    with pytest.raises(UncheckedGuards, match=r"max\(x.shape\[2\], x.shape\[3\]\).*is false at"):
        check_guards_hold(non_strict)
    # Images on the other side of 2:1 than the example's, and square ones, resize as in eager.
    assert_exports_equivalent(
        model, (x,), dynamic_shapes=SIDES,
        resized=[(torch.rand(1, 3, 300, 70),), (torch.rand(1, 3, 64, 64),), (torch.rand(1, 3, 40, 200),)],
    )


def test_branch_on_sizes_that_no_strategy_checks_is_refused():
    with pytest.raises(CaptureError, match=r"x.shape\[2\] / x.shape\[3\]\) <= 1.5") as refused:
        dynexport.export(AspectBranch(), (torch.rand(1, 3, 100, 70),), dynamic_shapes=SIDES)
    assert "if h / w > 1.5" in str(refused.value) and "torch.cond" in str(refused.value)
    # draft_export, which traces as non-strict capture does, is not run for the same guards.
    assert list(refused.value.reasons) == ["torch.export(strict=False)", "torch.export(strict=True)"]
    assert all(isinstance(reason, UncheckedGuards) for reason in refused.value.reasons.values())
    # Within a range where the branch is the example's everywhere, the graph is right.
    narrow = {"x": {2: torch.export.Dim("h", min=16, max=96), 3: torch.export.Dim("w", min=70, max=512)}}
    assert_exports_equivalent(
        AspectBranch(), (torch.rand(1, 3, 90, 70),), dynamic_shapes=narrow, resized=[(torch.rand(1, 3, 96, 70),), (torch.rand(1, 3, 16, 300),)],
    )



class TallerOrWider(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[1] > x.shape[0] else x + 1


def test_branch_relating_two_dynamic_axes_is_refused():
    # torch.export keeps a guard between two hints (dynamic_axes) for the ExportedProgram's own
    # run-time check, which an ONNX graph lacks: the graph answered a 5x3 input with the 3x5
    # example's branch (as torch.onnx's does).
    with pytest.raises(CaptureError, match=r"`x.shape\[1\] > x.shape\[0\]` \(.*\) is false at"):
        dynexport.export(
            TallerOrWider(), (torch.randn(3, 5),), input_names=["x"], dynamic_axes={"x": {0: "rows", 1: "columns"}}
        )



class WindowShrinks(torch.nn.Module):
    # Swin's stage: a window as large as the smaller side when that side is at most the window.
    # Non-strict capture answers Python's ``min`` of sizes for the example and torch's solver
    # drops the guard; strict capture leaves the same guard unchecked.
    window = 8

    def forward(self, x):
        if min(x.shape[-2:]) <= self.window:
            return x.mean(dim=(-2, -1), keepdim=True) + x
        return x * 2


def test_unchecked_guard_true_from_some_size_on_raises_the_minimums():
    sides = {"x": {2: torch.export.Dim("h"), 3: torch.export.Dim("w")}}
    x = torch.rand(1, 2, 16, 24)
    with pytest.warns(UserWarning) as warned:
        program = assert_exports_equivalent(
            WindowShrinks(), (x,), dynamic_shapes=sides,
            resized=[(torch.rand(1, 2, 9, 9),), (torch.rand(1, 2, 9, 100),), (torch.rand(1, 2, 70, 13),)],
        )
    refined = sorted(str(w.message) for w in warned if "refined" in str(w.message))
    assert refined == ["dynamic_shapes refined: h: min=9 (from the model)", "dynamic_shapes refined: w: min=9 (from the model)"]
    # A size the other branch takes is refused by the program, not computed wrong.
    with pytest.raises(ValueError, match=r"x.*dim 2.*8.*9"):
        program(torch.rand(1, 2, 8, 30))


class PatchesThenWindow(torch.nn.Module):
    # Swin's patch embedding pads the sides to whole patches (a branch: h becomes 4*_h), then a
    # stage's window shrinks on the patch grid.
    def forward(self, x):
        if x.shape[-1] % 4 != 0:
            x = torch.nn.functional.pad(x, (0, 4 - x.shape[-1] % 4))
        if x.shape[-2] % 4 != 0:
            x = torch.nn.functional.pad(x, (0, 0, 0, 4 - x.shape[-2] % 4))
        patches = torch.nn.functional.avg_pool2d(x, 4)
        if min(patches.shape[-2:]) <= 4:
            return patches.mean(dim=(-2, -1), keepdim=True) + patches
        return patches * 2


def test_unchecked_guard_on_the_root_of_a_derived_dim_raises_that_roots_minimum():
    sides = {"x": {2: torch.export.Dim("h"), 3: torch.export.Dim("w")}}
    with pytest.warns(UserWarning) as warned:
        assert_exports_equivalent(
            PatchesThenWindow(), (torch.rand(1, 2, 32, 48),), dynamic_shapes=sides,
            resized=[(torch.rand(1, 2, 20, 20),), (torch.rand(1, 2, 20, 64),)],
        )
    refined = {str(w.message) for w in warned if "refined" in str(w.message)}
    assert {"dynamic_shapes refined: _h: min=5 (from the model)", "dynamic_shapes refined: _w: min=5 (from the model)"} <= refined


class WindowShrinksOnTheAspect(torch.nn.Module):
    def forward(self, x):
        if min(x.shape[-2:]) * 2 <= max(x.shape[-2:]):
            return x.mean(dim=(-2, -1), keepdim=True) + x
        return x * 2


def test_unchecked_guard_that_no_minimum_makes_hold_is_refused_naming_the_dims():
    # The guard fails for a large h at the example's w whatever h's minimum: refused as before,
    # the dims named as declared.
    sides = {"x": {2: torch.export.Dim("h"), 3: torch.export.Dim("w")}}
    with pytest.raises(CaptureError, match=r"x.shape\[2\].*is false at x.shape\[2\] = \d+, x.shape\[3\] = \d+"):
        dynexport.export(WindowShrinksOnTheAspect(), (torch.rand(1, 2, 16, 24),), dynamic_shapes=sides)


class CropsWindowPadding(torch.nn.Module):
    # Swin's layer: the patch grid padded to whole windows, cropped back only when it was padded.
    def forward(self, x):
        patches = torch.nn.functional.avg_pool2d(x, 4)
        width = patches.shape[-1]
        pad = (4 - width % 4) % 4
        windows = torch.nn.functional.pad(patches, (0, pad)) * 2
        if pad > 0:
            windows = windows[..., :width]
        return windows


def test_unchecked_remainder_guard_on_a_derived_root_narrows_it_to_a_lattice():
    # torch.export took the example's "no padding" without checking it over 4*_w: the graph
    # returned 12 columns for 9 at width 36. The root is narrowed to multiples of the window.
    x = torch.rand(1, 2, 8, 64)
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: _w = 4\*__w"):
        program = assert_exports_equivalent(
            CropsWindowPadding(), (x,), dynamic_shapes=({3: 4 * torch.export.Dim("_w")},),
            resized=[(torch.rand(1, 2, 8, 16),), (torch.rand(1, 2, 8, 112),)],
        )
    with pytest.raises(ValueError, match=r"dim 3 is 36, which is no value of 16\*__w"):
        program(torch.rand(1, 2, 8, 36))


def test_remainder_guard_on_a_plain_dim_takes_torchs_own_lattice():
    # The same call with a plain Dim: torch's solver checks the guard and suggests the multiple.
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: w = 16\*_w"):
        program = assert_exports_equivalent(
            CropsWindowPadding(), (torch.rand(1, 2, 8, 64),), dynamic_shapes=({3: torch.export.Dim("w")},),
            resized=[(torch.rand(1, 2, 8, 16),), (torch.rand(1, 2, 8, 112),)],
        )
    with pytest.raises(ValueError, match=r"dim 3 is 36"):
        program(torch.rand(1, 2, 8, 36))


class ShiftsOnlyAcrossWindows(torch.nn.Module):
    # swin_t's last stage at 224 px: a map of 7 patches pads to one window of 7, where the model
    # skips the shift; from 256 px it pads to two windows and shifts.
    def forward(self, x):
        patches = x.shape[-1] // 32
        if patches + (7 - patches % 7) % 7 <= 7:
            return x * 2
        return x.roll(3, -1)


def test_unchecked_guard_true_only_up_to_the_example_is_refused_not_narrowed_to_one_size():
    # It holds from the range's least size to the example's, not from a minimum on nor on a
    # lattice with a second size: it once became the "lattice" 26*k + 7 over the range 5..32,
    # whose new root had no size (an AssertionError from torch.export.Dim).
    sides = ({1: 32 * torch.export.Dim("w_32", min=5, max=32)},)
    with pytest.raises(CaptureError, match=r"<= 7.*is false at w_32 = 8"):
        dynexport.export(ShiftsOnlyAcrossWindows(), (torch.rand(2, 224),), dynamic_shapes=sides)
    # declared where it holds, as the refusal's hint says
    assert_exports_equivalent(
        ShiftsOnlyAcrossWindows(), (torch.rand(2, 224),),
        dynamic_shapes=({1: 32 * torch.export.Dim("w_32", min=5, max=7)},), resized=[(torch.rand(2, 160),)],
    )


def test_torch_onnx_form_dynamic_axes_get_the_same_narrowing():
    # dynamic_axes declare hints, not named Dims: the narrowing is reported under the axis' name.
    with pytest.warns(UserWarning) as warned:
        program = assert_exports_equivalent(
            WindowShrinks(), (torch.rand(1, 2, 16, 24),), input_names=["x"],
            dynamic_axes={"x": {2: "h", 3: "w"}}, resized=[(torch.rand(1, 2, 9, 40),), (torch.rand(1, 2, 30, 9),)],
        )
    refined = sorted(str(w.message) for w in warned if "refined" in str(w.message))
    assert refined == ["dynamic_shapes refined: h: min=9 (from the model)", "dynamic_shapes refined: w: min=9 (from the model)"]
    with pytest.raises(ValueError, match=r"dim 2 is 8"):
        program(torch.rand(1, 2, 8, 30))
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: w = 16\*_w"):
        program = assert_exports_equivalent(
            CropsWindowPadding(), (torch.rand(1, 2, 8, 64),), input_names=["x"], dynamic_axes={"x": {3: "w"}},
            resized=[(torch.rand(1, 2, 8, 16),), (torch.rand(1, 2, 8, 112),)],
        )
    with pytest.raises(ValueError, match=r"dim 3 is 36"):
        program(torch.rand(1, 2, 8, 36))


class AnchorRows(torch.nn.Module):
    """RetinaNet's anchor grid in small: a number of rows computed from the sides with
    ``torch.sym_min`` (which torch.export's solver does not reason about), 1 at a 6x7 example,
    times a 0-d stride. Broadcasting it, torch's kernel asks whether the rows are 1 and takes the
    stride's missing dim, a literal 1, for their size; the meshgrid after it is traced from that."""

    def forward(self, x):
        rows = (torch.sym_min(x.shape[0], x.shape[1]) + 7) // 8
        ys = torch.arange(rows) * torch.tensor(8)
        grid_y, grid_x = torch.meshgrid(ys, torch.arange(x.shape[1]), indexing="ij")
        return grid_y.reshape(-1) + grid_x.reshape(-1)


ROWS_AND_COLUMNS = ({0: torch.export.Dim("h", min=2, max=64), 1: torch.export.Dim("w", min=2, max=64)},)


def test_size_a_kernel_wrote_as_the_example_number_is_refused():
    # Before: accepted, and onnxruntime failed at 12x14 (the Mul typed [1] computes 2 rows).
    non_strict = torch.export.export(AnchorRows(), (torch.rand(6, 7),), dynamic_shapes=ROWS_AND_COLUMNS, strict=False)
    false_at = r"== 1` \(.*infer_size.*\) is false at x.shape\[0\] = 12, x.shape\[1\] = 14"
    with pytest.raises(UncheckedGuards, match=false_at) as refused:
        check_guards_hold(non_strict)
    problem = refused.value.problems[0]
    assert "wrote 1 for the size 0 of mul" in problem and "ys = torch.arange(rows) * torch.tensor(8)" in problem
    assert "computes as 2 there" in problem and "such as x.shape[0] = 12, x.shape[1] = 14" in problem
    assert refused.value.fixes == {}
    with pytest.raises(CaptureError, match="wrote 1 for the size 0 of mul"):
        dynexport.export(AnchorRows(), (torch.rand(6, 7),), dynamic_shapes=ROWS_AND_COLUMNS)


def test_size_exported_where_it_is_not_one_stays_computed():
    # At the suggested example the rows are 2: the graph computes them, one row high included.
    assert_exports_equivalent(
        AnchorRows(), (torch.rand(12, 14),), dynamic_shapes=ROWS_AND_COLUMNS,
        resized=[(torch.rand(6, 7),), (torch.rand(40, 30),), (torch.rand(3, 64),)],
    )


def test_size_a_kernel_only_asked_about_is_not_refused(monkeypatch):
    # The rows are 1 at 6x7 and reshape's contiguity check asks whether they are, but the graph
    # computes them: the shapes propagated at other sizes agree with those recorded.
    propagated = []
    size_changed = guard_audit._size_changed
    monkeypatch.setattr(guard_audit, "_size_changed", lambda *args: propagated.append(args[2]) or size_changed(*args))
    program = torch.export.export(StridedRows(), (torch.rand(6, 7),), dynamic_shapes=ROWS_AND_COLUMNS, strict=False)
    check_guards_hold(program)
    assert propagated
    assert_exports_equivalent(
        StridedRows(), (torch.rand(6, 7),), dynamic_shapes=ROWS_AND_COLUMNS,
        resized=[(torch.rand(12, 14),), (torch.rand(40, 30),), (torch.rand(3, 64),)],
    )


class StridedRows(torch.nn.Module):
    def forward(self, x):
        side = torch.sym_min(x.shape[0], x.shape[1])
        return x[:side:8, :side].t().reshape(-1) * 2


def test_size_that_differs_on_an_output_alone_is_not_refused(caplog):
    # Halved from 2x2, the output is one pixel at the example and its recorded sizes say 1; no
    # node's sizes were traced from it, and onnxruntime computes every size (only the type is off).
    halved = lambda x: torch.nn.functional.interpolate(x, scale_factor=0.5)  # noqa: E731
    with caplog.at_level("DEBUG", logger="dynexport.guard_audit"):
        assert_exports_equivalent(
            halved, (torch.rand(1, 1, 2, 2),), input_names=["x"], dynamic_axes={"x": {2: "h", 3: "w"}},
            resized=[(torch.rand(1, 1, 4, 6),), (torch.rand(1, 1, 9, 2),)],
        )
    assert "upsample_nearest2d's sizes differ" in caplog.text
