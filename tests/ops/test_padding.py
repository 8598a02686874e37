"""Padding rules (constant, reflect, replicate, circular) against onnxruntime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.equivalence import (
    assert_exports_equivalent,
    assert_spatial_dynamic_equivalent,
    op_histogram,
)

aten = torch.ops.aten
B = torch.export.Dim("batch")
DTYPES = [torch.float32, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8]
# Pads per spatial rank: growing, mixed, and cropping (negative) pads.
PADS = {
    1: {"grow": (2, 1), "crop": (-1, 2), "crop_right": (3, -2)},
    2: {"grow": (1, 2, 2, 0), "crop": (-1, 2, 1, -2), "one_dim": (0, 0, 2, 1)},
    3: {"grow": (1, 1, 2, 0, 0, 2), "crop": (1, -1, -2, 1, 2, 0)},
}


def _cases(modes):
    return [
        pytest.param(mode, n, pad, id=f"{mode}-{n}d-{name}")
        for mode in modes
        for n, pads in PADS.items()
        for name, pad in pads.items()
    ]


def _data(dtype, *shape):
    return (torch.randn(shape) * 20).to(dtype)


@pytest.mark.parametrize(("mode", "n", "pad"), _cases(["constant", "reflect", "replicate", "circular"]))
def test_pad_modes(mode, n, pad):
    x = torch.randn(2, 3, *[6, 7, 8][:n])
    # torch.export keeps reflect's and circular's spatial dims static (their size checks branch).
    program = assert_spatial_dynamic_equivalent(
        lambda x: F.pad(x, pad, mode=mode), x, spatial=mode in ("constant", "replicate")
    )
    histogram = op_histogram(program)
    if mode == "circular":
        assert "Pad" not in histogram and histogram["Concat"] == sum(1 for p in zip(pad[0::2], pad[1::2]) if max(p) > 0)
    elif mode == "replicate" and min(pad) < 0:
        # Each padded dim gathers clamped positions (a crop may leave nothing to replicate).
        assert "Pad" not in histogram and histogram["Gather"] == sum(1 for p in zip(pad[0::2], pad[1::2]) if any(p))
    else:
        assert histogram["Pad"] == 1
        # Negative pads outside constant mode are cropped by a Slice before the Pad.
        assert histogram["Slice"] == (mode != "constant" and min(pad) < 0)


@pytest.mark.parametrize("opset", [18, 19, 23])
@pytest.mark.parametrize("pad", [(2, 1, 1, 3), (-1, 2, 3, -2), (0, 0, 2, 0)], ids=["grow", "crop", "one_dim"])
def test_circular_pad_by_opset(pad, opset):
    program = assert_spatial_dynamic_equivalent(
        lambda x: F.pad(x, pad, mode="circular"), torch.randn(2, 3, 6, 7), spatial=False, opset_version=opset
    )
    # onnxruntime's CPU Pad has no 'wrap' kernel for most dtypes: static circular pads are
    # slices and a concat at every opset.
    assert "Pad" not in op_histogram(program)


def test_constant_pad_of_int16_in_onnxruntime():
    # onnxruntime has no int16 Pad: it pads in int32.
    x = (torch.randn(2, 3, 5) * 100).to(torch.int16)
    assert_spatial_dynamic_equivalent(lambda x: F.pad(x, (1, 2, -1, 3), value=-7), x, spatial=False, runtime="onnxruntime")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_dtypes(mode, dtype):
    x = _data(dtype, 2, 3, 5, 6)
    assert_spatial_dynamic_equivalent(lambda x: F.pad(x, (1, 2, -1, 3), mode=mode), x, spatial=False)


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(1.5, torch.float32), (-2.0, torch.float16), (float("-inf"), torch.float64), (7, torch.int64), (2.7, torch.int32), (1.0, torch.bool)],
)
def test_constant_pad_value(value, dtype):
    x = _data(dtype, 2, 3, 6, 7)
    assert_spatial_dynamic_equivalent(lambda x: F.pad(x, (2, -1, 0, 1), value=value), x)


@pytest.mark.parametrize("pad", [(-4, 5, 0, 0), (5, -4, -4, 3), (-5, 7, 1, -2)], ids=["left", "both", "beyond"])
def test_replicate_pads_that_crop_a_dim_away(pad):
    # PyTorch clamps each output position into the input: a dim cropped to nothing still
    # replicates its last remaining element.
    assert_spatial_dynamic_equivalent(lambda x: F.pad(x, pad, mode="replicate"), torch.randn(2, 3, 4, 4), spatial=False)


def test_constant_pad_with_symbolic_pads():
    def model(x, y):
        return F.pad(x, (0, y.shape[1] - x.shape[1]))

    x, y = torch.randn(3, 4), torch.randn(3, 9)
    assert_exports_equivalent(
        model, (x, y), dynamic_shapes=({0: B, 1: torch.export.Dim("n", max=8)}, {0: B, 1: torch.export.Dim("m", min=9)}),
        resized=[(torch.randn(5, 2), torch.randn(5, 12))],
    )


def test_pad_unbatched_and_high_rank():
    assert_exports_equivalent(
        lambda x, y, z: (F.pad(x, (1, 2), mode="reflect"), F.pad(y, (1, 1, 0, 2), value=3.0), F.pad(z, (1, 1, 2, 2, 0, 1), mode="replicate")),
        (torch.randn(3, 6), torch.randn(2, 2, 2, 3, 4), torch.randn(2, 2, 3, 4)),
    )


ATEN_PADS = {
    "constant_pad_nd": lambda x: aten.constant_pad_nd(x, [1, -1, 2, 0], 2.5),
    "reflection_pad1d": lambda x: aten.reflection_pad1d(x.flatten(1, 2), [2, 1]),
    "reflection_pad2d": lambda x: aten.reflection_pad2d(x, [2, 1, 0, 3]),
    "reflection_pad3d": lambda x: aten.reflection_pad3d(x[None], [1, 1, 2, 0, 0, 1]),
    "replication_pad1d": lambda x: aten.replication_pad1d(x.flatten(1, 2), [2, 1]),
    "replication_pad2d": lambda x: aten.replication_pad2d(x, [2, 1, 0, 3]),
    "replication_pad3d": lambda x: aten.replication_pad3d(x[None], [1, 1, 2, 0, 0, 1]),
    "_pad_circular": lambda x: aten._pad_circular(x, [2, 1, -1, 3]),
    "_pad_enum_reflect": lambda x: aten._pad_enum(x, [2, 1, 0, 3], 0),
    "_pad_enum_replicate": lambda x: aten._pad_enum(x, [2, 1, 0, 3], 1),
    "_pad_enum_circular": lambda x: aten._pad_enum(x, [2, 1, 0, 3], 2),
    "_pad_enum_constant": lambda x: aten._pad_enum(x, [2, 1, 0, 3], 3, -1.0),
}


@pytest.mark.parametrize("name", ATEN_PADS)
def test_aten_pad_overloads(name):
    program = assert_spatial_dynamic_equivalent(ATEN_PADS[name], torch.randn(2, 3, 5, 6), spatial=False)
    assert op_histogram(program)["Pad"] == (0 if "circular" in name else 1)
