"""Captures stop at the first guard after the model requires a named dim to be a multiple, and the
refinement they lead to is the one the finished capture gave (dynexport/multiples.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.export import Dim

import dynexport
from dynexport.capture import capture
from dynexport.errors import CaptureError, DimSpecializedError
from dynexport.multiples import MultipleRequired
from tests.equivalence import assert_exports_equivalent


def padded_to_fours(x):
    """``x`` (rows of columns) padded to whole blocks of 4 columns in a Python branch."""
    if x.shape[1] % 4 != 0:
        x = torch.nn.functional.pad(x, (0, 4 - x.shape[1] % 4))
    return x


class Tail(torch.nn.Module):
    """Counts the calls that reach the model's rest."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.view(x.shape[0], -1, 4).sum(-1)


class PadsToBlocks(torch.nn.Module):
    # Swin's patch embedding: the width padded to whole blocks in a Python branch.
    def __init__(self):
        super().__init__()
        self.tail = Tail()

    def forward(self, x):
        if x.shape[1] % 4 != 0:
            x = torch.nn.functional.pad(x, (0, 0, 0, 4 - x.shape[1] % 4))
        if x.shape[2] % 4 != 0:
            x = torch.nn.functional.pad(x, (0, 4 - x.shape[2] % 4))
        return self.tail(x.transpose(1, 2).reshape(x.shape[0], -1)) + 1


def test_capture_stops_at_the_guard_after_the_required_multiples():
    model = PadsToBlocks()
    sides = ({1: Dim("w", max=400), 2: Dim("h")},)
    with pytest.raises(CaptureError) as error:
        capture(model, (torch.randn(2, 16, 8),), {}, sides)
    (reason,) = error.value.reasons.values()
    assert isinstance(reason, MultipleRequired)
    assert reason.factors == {"w": 4, "h": 4}  # both branches, then the transpose's guard stopped it
    assert model.tail.calls == 0


def test_required_multiples_refine_the_dims_as_torchs_fix_did():
    model = PadsToBlocks()
    x = torch.randn(2, 16, 8)
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: w = 4\*_w"):
        program = assert_exports_equivalent(
            model, (x,), dynamic_shapes=({1: Dim("w", min=6, max=401), 2: Dim("h")},),
            resized=[(torch.randn(2, 8, 12),), (torch.randn(2, 400, 4),)],
        )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["2", "4*_w", "4*_h"]
    with pytest.raises(ValueError, match=r"no value of 4\*_w"):
        program(torch.randn(2, 18, 8))
    with pytest.raises(ValueError, match=r"dim 1 is 404"):  # _w's range is the multiples in w's: 2..100
        program(torch.randn(2, 404, 8))


class PadsTheGridToEven(torch.nn.Module):
    # FocalNet's downsampling: every fourth column, padded to an even count, pairs merged.
    def forward(self, x):
        grid = x[..., ::4]
        pad = (2 - grid.shape[-1] % 2) % 2
        if pad > 0:
            grid = torch.nn.functional.pad(grid, (0, pad))
        return grid.reshape(grid.shape[0], -1, 2).sum(-1)


def test_an_audited_remainder_of_a_derived_root_stops_the_capture_too():
    # torch leaves `(2 - _w % 2) % 2 > 0` unchecked on the root of 4*_w; the guard audit would
    # narrow _w to even sizes after the capture, and the capture stops there instead.
    with pytest.raises(CaptureError) as error:
        capture(PadsTheGridToEven(), (torch.randn(2, 32),), {}, ({1: 4 * Dim("_w")},))
    (reason,) = error.value.reasons.values()
    assert isinstance(reason, MultipleRequired) and reason.factors == {"_w": 2}
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: _w = 2\*__w"):
        program = assert_exports_equivalent(
            PadsTheGridToEven(), (torch.randn(2, 32),), dynamic_shapes=({1: 4 * Dim("_w")},),
            resized=[(torch.randn(2, 16),), (torch.randn(2, 64),)],
        )
    with pytest.raises(ValueError, match=r"no value of 8\*__w"):
        program(torch.randn(2, 36))


class CatchesEverything(torch.nn.Module):
    # A model that swallows any error of a size test takes its fallback path in the trace.
    def forward(self, x):
        x = padded_to_fours(x)
        try:
            scale = 2.0 if x.shape[1] > 8 else 1.0
        except Exception:
            scale = 100.0
        return x.view(x.shape[0], -1, 4).sum(-1) * scale


def test_a_stop_the_model_catches_still_ends_the_capture():
    with pytest.raises(CaptureError) as error:
        capture(CatchesEverything(), (torch.randn(2, 16),), {}, ({1: Dim("w")},))
    assert isinstance(next(iter(error.value.reasons.values())), MultipleRequired)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_exports_equivalent(
            CatchesEverything(), (torch.randn(2, 16),), dynamic_shapes=({1: Dim("w", min=12)},),
            resized=[(torch.randn(2, 24),), (torch.randn(2, 12),)],
        )


class OddWidths(torch.nn.Module):
    def forward(self, x):
        if x.shape[1] % 2 == 1:
            return x[:, 1:] * 2
        return x


def test_other_remainder_guards_are_left_to_torch():
    # An odd example records `w % 2 == 1`: no multiple, so torch's own answer (no fix it can
    # express) stands, as before.
    with pytest.raises(CaptureError) as error:
        dynexport.export(OddWidths(), (torch.randn(2, 7),), dynamic_shapes=({1: Dim("w")},))
    assert not any(isinstance(reason, MultipleRequired) for reason in error.value.reasons.values())


class PadsTwoStages(torch.nn.Module):
    # A hierarchical model's stages: the width padded to whole patches, then the patch grid to
    # an even count, then pairs merged.
    def forward(self, x):
        x = padded_to_fours(x)
        grid = x[:, ::4]
        pad = (2 - grid.shape[1] % 2) % 2
        if pad > 0:
            grid = torch.nn.functional.pad(grid, (0, pad))
        return grid.reshape(grid.shape[0], -1, 2).sum(-1)


def test_a_root_made_for_a_plain_dim_keeps_its_name_stage_after_stage():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = assert_exports_equivalent(
            PadsTwoStages(), (torch.randn(2, 32),), dynamic_shapes=({1: Dim("w")},),
            resized=[(torch.randn(2, 16),), (torch.randn(2, 48),)],
        )
    refined = [str(w.message) for w in caught if "dynamic_shapes refined" in str(w.message)]
    assert refined == ["dynamic_shapes refined: w = 8*_w (from the model)"]  # w = 4*_w first, superseded
    assert str(program.model.graph.inputs[0].shape[1]) == "8*_w"
    with pytest.raises(ValueError, match=r"dim 1 is 36, which is no value of 8\*_w"):
        program(torch.randn(2, 36))


class PadsToFour(torch.nn.Module):
    def forward(self, x):
        x = padded_to_fours(x)
        return x.view(x.shape[0], -1, 4).sum(-1) + 1


def test_a_range_holding_one_multiple_is_refused_as_a_fixed_dim():
    # 8 is the one multiple of 4 in [6, 10]: torch's own suggestion (a root in [2, 2]) crashed
    # its solver with "Cannot create Dim with inconsistent min=2, max=2".
    with pytest.raises(DimSpecializedError, match=r"w = 8\n  at .*test_multiples.py.*if x.shape\[1\] % 4 != 0"):
        dynexport.export(PadsToFour(), (torch.randn(2, 8),), dynamic_shapes=({1: Dim("w", min=6, max=10)},))
    with pytest.warns(UserWarning, match=r"w = 4\*_w"):
        assert_exports_equivalent(
            PadsToFour(), (torch.randn(2, 8),), dynamic_shapes=({1: Dim("w", min=6, max=12)},),
            resized=[(torch.randn(2, 12),)],
        )


def test_a_dim_declared_by_a_hint_stops_the_capture_too():
    # torch.onnx's dynamic_axes declare dims by Dim.DYNAMIC hints, named by position: torch.export
    # accepts the guards there, and the audit of the finished capture would have narrowed them.
    model = PadsToBlocks()
    with pytest.raises(CaptureError) as error:
        capture(model, (torch.randn(2, 16, 8),), {}, {"x": {1: Dim.DYNAMIC, 2: Dim.DYNAMIC(max=64)}})
    (reason,) = error.value.reasons.values()
    assert isinstance(reason, MultipleRequired)
    assert reason.factors == {"x.shape[1]": 4, "x.shape[2]": 4}
    assert model.tail.calls == 0


def test_dynamic_axes_refined_stage_by_stage_keep_their_names():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = assert_exports_equivalent(
            PadsTwoStages(), (torch.randn(2, 32),), input_names=["tokens"], dynamic_axes={"tokens": {0: "batch", 1: "width"}},
            resized=[(torch.randn(3, 16),), (torch.randn(1, 48),)],
        )
    refined = [str(w.message) for w in caught if "dynamic_shapes refined" in str(w.message)]
    assert refined == ["dynamic_shapes refined: width = 8*_width (from the model)"]  # width = 4*_width first
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "8*_width"]
    with pytest.raises(ValueError, match=r"dim 1 is 36, which is no value of 8\*_width"):
        program(torch.randn(2, 36))


@pytest.mark.parametrize("hint", ["width", Dim.DYNAMIC], ids=["string", "Dim.DYNAMIC"])
def test_a_hinted_dim_in_a_positional_dynamic_shapes_is_refined_too(hint):
    # torch.onnx's form `dynamic_shapes=({1: "width"},)`: the tuple is keyed by argument for
    # refinement (before, the audit's fixes at hints applied to dict forms only: refused).
    with pytest.warns(UserWarning, match=r"dynamic_shapes refined: (width|x_dim_1) = 8\*_(width|x_dim_1)"):
        program = assert_exports_equivalent(
            PadsTwoStages(), (torch.randn(2, 32),), dynamic_shapes=({1: hint},),
            resized=[(torch.randn(2, 16),), (torch.randn(2, 48),)],
        )
    assert str(program.model.graph.inputs[0].shape[1]).startswith("8*_")
