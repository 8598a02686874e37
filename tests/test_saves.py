"""Saves: a model and its data file stay a pair under a kill at any instant; bad data locations are
refused; file modes follow the umask or the replaced file; orphans of killed saves are cleaned;
weights are applied all or nothing."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import onnx
import onnxruntime
import pytest
import torch

import dynexport
import dynexport.files as files_module
from tests.equivalence import assert_close

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def program():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    return model, dynexport.export(model, (torch.randn(3, 16),), dynamic_shapes=({0: torch.export.Dim("b")},))


@pytest.fixture
def small_tensors_external(monkeypatch):
    monkeypatch.setattr(files_module, "EXTERNAL_DATA_MIN_TENSOR_BYTES", 0)


def _run_killer(tmp_path, stride: int, tail: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "tests.save_killer", str(tmp_path), str(stride), str(tail)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_save_killed_at_many_instants_leaves_the_old_pair_or_the_new_one(tmp_path):
    summary = _run_killer(tmp_path, stride=60, tail=40)
    assert summary["killed"] == summary["points"] >= 40
    assert summary["mixed"] == [], summary


@pytest.mark.slow
def test_a_save_killed_at_every_line_leaves_the_old_pair_or_the_new_one(tmp_path):
    summary = _run_killer(tmp_path, stride=1, tail=0)
    assert summary["killed"] == summary["points"] == summary["lines"]
    assert summary["mixed"] == [], summary


def _locations(path) -> set[str]:
    proto = onnx.load(str(path), load_external_data=False)
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}


def test_saving_over_a_pair_writes_the_data_under_a_fresh_name_and_removes_the_old(
    program, small_tensors_external, tmp_path
):
    model, exported = program
    path = tmp_path / "m.onnx"
    exported.save(path, external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    exported.save(path, external_data=True)
    (data,) = _locations(path)
    assert data != "m.onnx.data" and data.startswith("m.onnx.") and data.endswith(".data")
    assert sorted(os.listdir(tmp_path)) == sorted(["m.onnx", data])
    exported.save(path)  # no external data: the old data file goes too
    assert os.listdir(tmp_path) == ["m.onnx"]
    import onnxruntime as ort

    x = torch.randn(5, 16)
    (out,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})
    assert_close(torch.from_numpy(out), model(x))


@pytest.mark.parametrize("location", ["m.onnx", "./m.onnx", "../m.data", "sub/../../m.data", "/tmp/m.data", "."])
def test_a_data_location_that_is_the_model_or_outside_its_folder_is_refused(program, tmp_path, location):
    _, exported = program
    with pytest.raises(ValueError, match="external_data="):
        exported.save(tmp_path / "m.onnx", external_data=location)
    assert os.listdir(tmp_path) == []


def test_saving_to_an_existing_directory_leaves_nothing_behind(program, tmp_path):
    _, exported = program
    target = tmp_path / "model"
    target.mkdir()
    for external_data in (True, False):
        with pytest.raises(IsADirectoryError, match="is a directory"):
            exported.save(target, external_data=external_data)
    assert os.listdir(tmp_path) == ["model"] and os.listdir(target) == []


def test_new_files_follow_the_umask_and_a_replaced_file_keeps_its_mode(program, small_tensors_external, tmp_path):
    _, exported = program
    previous = os.umask(0o027)
    try:
        exported.save(tmp_path / "m.onnx", external_data=True)
        assert (tmp_path / "m.onnx").stat().st_mode & 0o777 == 0o640
        assert (tmp_path / "m.onnx.data").stat().st_mode & 0o777 == 0o640
        os.chmod(tmp_path / "m.onnx", 0o604)
        exported.save(tmp_path / "m.onnx")
        assert (tmp_path / "m.onnx").stat().st_mode & 0o777 == 0o604
    finally:
        os.umask(previous)


def test_old_orphans_of_killed_saves_are_removed_on_the_next_save(program, tmp_path):
    _, exported = program
    old = time.time() - files_module.ORPHAN_AGE_SECONDS - 60
    names = {
        "ours_old": ".dynexport-0123abcd4567ef89.tmp",
        "ours_young": ".dynexport-89abcdef01234567.tmp",
        "not_ours": ".other-0123.tmp",
    }
    for key, name in names.items():
        (tmp_path / name).write_bytes(b"partial")
        if key != "ours_young":
            os.utime(tmp_path / name, (old, old))
    os.symlink(tmp_path / names["not_ours"], tmp_path / ".dynexport-feedfacefeedface.tmp")
    os.utime(tmp_path / ".dynexport-feedfacefeedface.tmp", (old, old), follow_symlinks=False)
    exported.save(tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == sorted(
        [names["ours_young"], names["not_ours"], ".dynexport-feedfacefeedface.tmp", "m.onnx"]
    )


def test_apply_weights_checks_everything_first_and_drops_the_session(program):
    model, exported = program
    x = torch.randn(2, 16)
    before = exported(x)
    state = {k: v + 1 for k, v in model.state_dict().items()}
    bad = dict(state, **{"2.weight": torch.zeros(3)})  # the second layer's weight: a wrong shape
    with pytest.raises(ValueError, match="shape"):
        exported.apply_weights(bad)
    assert torch.equal(exported.initializers["0.weight"], model.state_dict()["0.weight"])
    assert_close(exported(x), before)
    with pytest.raises(ValueError, match="missing"):
        exported.apply_weights({"0.weight": torch.zeros(32, 16, device="meta")})
    assert torch.equal(exported.initializers["0.weight"], model.state_dict()["0.weight"])
    exported.apply_weights(state)
    shifted = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    shifted.load_state_dict(state)
    with torch.no_grad():
        for batch in (2, 7):
            inputs = torch.randn(batch, 16)
            assert_close(exported(inputs), shifted(inputs))



def test_a_folder_that_cannot_be_listed_still_takes_the_save(program, tmp_path, monkeypatch):
    _, exported = program

    def unlistable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", unlistable)  # a write-only folder (root can list any)
    exported.save(tmp_path / "m.onnx")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["m.onnx"]


class Projection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(256, 512))  # 512 KiB: over the threshold for its own data

    def forward(self, x):
        return x @ self.weight


@pytest.mark.parametrize(("external_data", "data_file"), [(True, "m.onnx.data"), ("weights.bin", "weights.bin"), (False, None), (None, None)])
def test_export_writes_f_with_external_data_as_torch_onnx_does(tmp_path, external_data, data_file):
    # torch.onnx.export(..., external_data=True) is its default and a common call to copy.
    model, x = Projection().eval(), torch.randn(3, 256)
    path = tmp_path / "m.onnx"
    dynexport.export(model, (x,), str(path), external_data=external_data)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.onnx", *([data_file] if data_file else [])])
    assert _locations(path) == ({data_file} if data_file else set())
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (result,) = session.run(None, {"x": x.numpy()})
    assert_close(torch.from_numpy(result), model(x))


class CountingProjection(Projection):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


@pytest.mark.parametrize(
    ("f", "external_data", "error", "match"),
    [
        (lambda tmp: open(tmp / "m.onnx", "wb"), True, ValueError, "needs f to be a path"),
        (lambda tmp: str(tmp / "m.onnx"), "../elsewhere.data", ValueError, "relative to the model's directory"),
        (lambda tmp: str(tmp / "m.onnx"), "m.onnx", ValueError, "names the model file itself"),
        (lambda tmp: str(tmp / "m.onnx"), 1, TypeError, "external_data must be"),
    ],
    ids=["file-object", "outside", "the-model-itself", "not-a-name"],
)
def test_bad_external_data_is_refused_before_capture(tmp_path, f, external_data, error, match):
    model = CountingProjection()
    destination = f(tmp_path)
    try:
        with pytest.raises(error, match=match):
            dynexport.export(model, (torch.randn(3, 256),), destination, external_data=external_data)
    finally:
        if not isinstance(destination, str):
            destination.close()
    assert model.calls == 0
    assert not (tmp_path / "m.onnx").exists() or (tmp_path / "m.onnx").stat().st_size == 0
