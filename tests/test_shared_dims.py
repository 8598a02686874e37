"""Inputs stacked on a shared dynamic dim and taken apart again (dynexport/shared_dims.py,
dynexport/even_chunks.py): ``torch.chunk(torch.cat([a, b]), 2)`` with one ``Dim`` for both
batches, as RAFT, siamese networks and classifier-free guidance write it. torch.export alone
fixes the batch to the example's size; dynexport exports it dynamic and right at other sizes."""

from __future__ import annotations

import collections
import re

import pytest
import torch
import torch.export._trace as export_trace

import dynexport
from dynexport.errors import CaptureError
from tests.equivalence import assert_exports_equivalent

Dim = torch.export.Dim


class Siamese(torch.nn.Module):
    """One encoder over two images stacked on the batch, its features taken apart again."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())

    def forward(self, first, second):
        features = self.encoder(torch.cat([first, second], dim=0))
        left, right = torch.chunk(features, chunks=2, dim=0)
        return (left * right).mean(dim=(2, 3)), left - right


class Guided(torch.nn.Module):
    """Classifier-free guidance: the latents twice through one network, then the two halves."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(6, 6)

    def forward(self, latents, scale: float = 7.5):
        noise = self.net(torch.cat([latents] * 2))
        uncond, text = noise.chunk(2)
        return uncond + scale * (text - uncond)


def _images(batch: int, side: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 3, side, side), torch.randn(batch, 3, side, side)


def _ops(program: dynexport.ONNXProgram) -> collections.Counter:
    return collections.Counter(node.op_type for node in program.model.graph)


def test_two_inputs_of_one_batch_dim_stacked_and_chunked_stay_dynamic():
    batch, side = Dim("batch"), Dim("side", min=2)
    shapes = ({0: batch, 2: side, 3: side}, {0: batch, 2: side, 3: side})
    program = assert_exports_equivalent(
        Siamese().eval(), _images(2), dynamic_shapes=shapes,
        resized=[_images(1, 5), _images(3, 9), _images(0, 4)],
    )
    ops = _ops(program)
    assert ops["Split"] == 1
    assert not ops["Where"]  # equal halves at every size: no run-time check of the piece count
    dims = {value.name: [str(d) for d in value.shape] for value in program.model.graph.inputs}
    assert dims["first"] == dims["second"] == ["batch", "3", "side", "side"]


def test_one_name_in_dynamic_axes_for_both_inputs_stays_dynamic():
    assert_exports_equivalent(
        Siamese().eval(), _images(2), input_names=["first", "second"],
        dynamic_axes={"first": {0: "batch"}, "second": {0: "batch"}},
        resized=[_images(1), _images(4)],
    )


def test_a_doubled_batch_chunked_in_halves_stays_dynamic():
    program = assert_exports_equivalent(
        Guided().eval(), (torch.randn(2, 6),), dynamic_shapes=({0: Dim("batch")},),
        resized=[(torch.randn(1, 6),), (torch.randn(5, 6),)],
    )
    assert not _ops(program)["Where"]


class Thirds(torch.nn.Module):
    def forward(self, x):
        a, b, c = torch.cat([x, x * 2, x + 1]).chunk(3)
        return a * b - c


def test_a_tripled_dim_chunked_in_thirds_stays_dynamic():
    assert_exports_equivalent(
        Thirds(), (torch.randn(2, 4),), dynamic_shapes=({0: Dim("n")},),
        resized=[(torch.randn(1, 4),), (torch.randn(7, 4),)],
    )


class Stacked(torch.nn.Module):
    def forward(self, first, second):
        left, right = torch.cat([first, second]).chunk(2)
        return left.sum(0), right.sum(0)


def test_batches_declared_apart_stay_apart():
    # Two Dims: the graph must be right when the batches differ (the halves are then
    # ceil(total / 2) and the rest, computed at run time).
    first, second = Dim("first_batch", min=1), Dim("second_batch", min=1)
    program = assert_exports_equivalent(
        Stacked(), (torch.randn(2, 3), torch.randn(2, 3)), dynamic_shapes=({0: first}, {0: second}),
        resized=[(torch.randn(3, 3), torch.randn(2, 3)), (torch.randn(4, 3), torch.randn(5, 3))],
    )
    assert _ops(program)["Where"] == 1


def test_a_shared_dim_with_unequal_examples_is_refused_as_torch_export_refuses_it():
    batch = Dim("batch")
    with pytest.raises(CaptureError, match=r"size\(\)\[0\] = 3 is not equal to .*size\(\)\[0\] = 2"):
        dynexport.export(Stacked(), (torch.randn(2, 3), torch.randn(3, 3)), dynamic_shapes=({0: batch}, {0: batch}))


def test_the_capture_patches_are_undone_after_an_export_and_a_failed_one():
    originals = torch.chunk, torch.Tensor.chunk, export_trace.make_fake_inputs
    batch = Dim("batch")
    dynexport.export(Siamese().eval(), _images(2), dynamic_shapes=({0: batch}, {0: batch}))
    with pytest.raises(CaptureError):
        dynexport.export(Stacked(), (torch.randn(2, 3), torch.randn(3, 3)), dynamic_shapes=({0: batch}, {0: batch}))
    assert (torch.chunk, torch.Tensor.chunk, export_trace.make_fake_inputs) == originals
    assert "chunk" not in vars(torch.Tensor)


class RecordsItsSizes(torch.nn.Module):
    """Records the sizes it is traced with (a list of the test's: capture keeps no attribute
    forward sets) and adds its window sums to the next input's."""

    def __init__(self, seen: list[tuple[str, str]]):
        super().__init__()
        self.seen = seen

    def forward(self, x, y):
        self.seen.append((str(x.shape[1]), str(y.shape[1])))
        windows = x.view(x.shape[0], x.shape[1] // 4, 4).sum(-1)
        return y[:, 1:] + windows


def test_a_derived_dim_is_traced_as_its_expression_of_the_root():
    # torch.export traces `4 * Dim("w")` and `Dim("w") + 1` as symbols of their own and relates
    # them to the root only when it checks the guards; traced as `4*w` and `w + 1`, a view in
    # windows of 4 is whole windows without a guard (Swin's windows: its capture took 101 s).
    seen: list[tuple[str, str]] = []
    windows = Dim("windows")
    assert_exports_equivalent(
        RecordsItsSizes(seen), (torch.randn(2, 12), torch.randn(2, 4)),
        dynamic_shapes=({0: Dim("batch"), 1: 4 * windows}, {0: Dim("batch"), 1: windows + 1}),
        resized=[(torch.randn(3, 20), torch.randn(3, 6)), (torch.randn(1, 4), torch.randn(1, 2))],
    )
    traced = [(x, y) for x, y in seen if not x.isdigit()]  # not the eager calls
    assert traced and all(re.fullmatch(r"4\*\w+", x) and y == f"{x[2:]} + 1" for x, y in traced), seen
