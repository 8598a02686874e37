"""Threads: a model compiled with the dynexport backend called from several threads at once while
sessions are still being built, and exports run from several threads."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import dynexport
from tests.equivalence import assert_close


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(12, 32)
        self.second = torch.nn.Linear(32, 5)

    def forward(self, x):
        return torch.softmax(self.second(torch.relu(self.first(x))), dim=-1)


def _hammer(call, workers: int, seconds: float, calls_per_worker: int) -> list[BaseException]:
    """Run ``call(worker, i)`` from ``workers`` threads started together, each until it made
    ``calls_per_worker`` calls or ``seconds`` passed; the exceptions raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(workers)
    deadline = time.monotonic() + seconds

    def work(worker: int) -> None:
        start.wait()
        for i in range(calls_per_worker):
            if time.monotonic() > deadline:
                return
            try:
                call(worker, i)
            except BaseException as error:  # noqa: BLE001 - every failure is the test's finding
                errors.append(error)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _hammer_compiled_model(seconds: float, calls_per_worker: int) -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    backend = dynexport.backend(fallback="raise")
    compiled = torch.compile(model, backend=backend)
    inputs = {batch: torch.randn(batch, 12) for batch in range(1, 32)}
    with torch.no_grad():
        expected = {batch: model(x) for batch, x in inputs.items()}
        for batch in (1, 3, 5, 7):  # warm-up: batch 1 is its own graph, then the batch turns dynamic
            compiled(inputs[batch])

    def call(worker: int, i: int) -> None:
        batch = 1 + (worker * 7 + i * 5) % 31
        with torch.no_grad():
            assert_close(compiled(inputs[batch]), expected[batch])

    errors = _hammer(call, workers=4, seconds=seconds, calls_per_worker=calls_per_worker)
    assert not errors, f"{len(errors)} calls failed, first: {errors[0]!r}"
    # One build per signature: threads that asked for the same session waited for it.
    assert all(s.sessions_built == len(s._sessions) for s in backend.subgraphs)


def test_compiled_model_called_from_four_threads_at_varying_batch_sizes():
    _hammer_compiled_model(seconds=4.0, calls_per_worker=60)


@pytest.mark.slow
def test_compiled_model_called_from_four_threads_long():
    _hammer_compiled_model(seconds=60.0, calls_per_worker=400)


def test_one_session_per_signature_when_threads_ask_together(monkeypatch):
    """Threads that reach a subgraph's first call together build its session once."""
    torch.manual_seed(0)
    model = Mlp().eval()
    backend = dynexport.backend(fallback="raise")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(4, 12)
    with torch.no_grad():
        expected = model(x)

    def call(worker: int, i: int) -> None:
        with torch.no_grad():
            assert_close(compiled(x), expected)

    errors = _hammer(call, workers=4, seconds=30.0, calls_per_worker=3)
    assert not errors, f"{len(errors)} calls failed, first: {errors[0]!r}"
    # Dynamo may compile the frame once per thread; each subgraph builds its session once.
    assert {s.sessions_built for s in backend.subgraphs} == {1}


class Scaled(torch.nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.proj = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.proj(x) * self.scale


def test_exports_from_several_threads_are_serialized_and_each_matches_eager():
    torch.manual_seed(0)
    models = [Scaled(float(k + 1)).eval() for k in range(4)]
    x = torch.randn(2, 6)
    programs: dict[int, dynexport.ONNXProgram] = {}

    def call(worker: int, i: int) -> None:
        programs[worker] = dynexport.export(
            models[worker], (x,), dynamic_shapes=({0: torch.export.Dim("batch")},)
        )

    errors = _hammer(call, workers=4, seconds=60.0, calls_per_worker=1)
    assert not errors, f"{len(errors)} exports failed, first: {errors[0]!r}"
    for worker, model in enumerate(models):
        for batch in (2, 5):
            inputs = torch.randn(batch, 6)
            with torch.no_grad():
                assert_close(programs[worker](inputs), model(inputs))
