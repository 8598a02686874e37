"""Export speed: dynexport vs torch.onnx.export(dynamo=True), side by side in one process.

    python benchmarks/export_speed.py [--repeats 3] [--models mlp,hf_llama,...] [--threads 1]
                                      [--depths 64,256,1024] [--compare-depth 256]

The suite is the shipped examples and the encoder and decoder families of the model tests (tiny
transformers configs). Every model is exported and saved by both exporters, alternating, after
one warm-up export each; the median of ``--repeats`` runs is reported. For dynexport the
per-phase breakdown (capture, decompose, translate, optimize, serialize) is printed, with any
phase that cost more than capture flagged. Then a stack of N identical residual blocks is
exported for each N of ``--depths`` and the time per block printed: cost must grow linearly
with depth. Ratios are informational: the machine is shared and noisy, so no threshold is
enforced anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import dynexport
from dynexport.examples import EXAMPLES

# The model tests' tiny transformers families are the suite's too (tests/models/families.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PHASES = ("capture", "decompose", "translate", "optimize", "serialize")


@dataclasses.dataclass
class Case:
    """One model of the suite: what both exporters are called with."""

    model: Any
    args: tuple
    kwargs: dict[str, Any]
    dynamic_shapes: Any


def _example(factory: Callable[[], tuple]) -> Callable[[], Case]:
    def case() -> Case:
        model, args, dynamic_shapes, _ = factory()
        return Case(model, args, {}, dynamic_shapes)

    return case


def _transformers_models() -> dict[str, Callable[[], Case]]:
    """The encoder and decoder families of the model tests (tests/models/families.py)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {}
    from tests.models.families import DECODERS, ENCODERS, text_dims, text_inputs

    def text_model(build: Callable[[], Any]) -> Callable[[], Case]:
        def case() -> Case:
            torch.manual_seed(0)
            inputs = text_inputs(2, 7)
            return Case(build().eval(), (), inputs, text_dims(list(inputs)))

        return case

    models = {f"hf_{name}": text_model(build) for name, build in ENCODERS.items()}
    models.update({f"hf_{name}": text_model(lambda build=build: build(False)) for name, build in DECODERS.items()})
    return models


def suite() -> dict[str, Callable[[], Case]]:
    return {**{name: _example(factory) for name, factory in EXAMPLES.items()}, **_transformers_models()}


def selected_models(parser: argparse.ArgumentParser, names: str | None) -> dict[str, Callable[[], Case]]:
    """The suite, or the comma-separated subset ``names`` of it (an unknown name is an error)."""
    models = suite()
    if not names:
        return models
    unknown = set(names.split(",")) - set(models)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {sorted(models)}")
    return {name: models[name] for name in names.split(",")}


def _time_dynexport(case: Case, path: str) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    program = dynexport.export(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)
    return time.perf_counter() - start, program.timings


def _time_torch_onnx(case: Case, path: str) -> float:
    start = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            case.model, case.args, path, kwargs=case.kwargs, dynamo=True, dynamic_shapes=case.dynamic_shapes,
            verbose=False,
        )
    return time.perf_counter() - start


def measure(name: str, factory: Callable[[], Case], repeats: int, workdir: str, *, compare: bool = True) -> dict[str, Any]:
    case = factory()
    ours_path = os.path.join(workdir, f"{name}.dynexport.onnx")
    theirs_path = os.path.join(workdir, f"{name}.torch_onnx.onnx")
    result: dict[str, Any] = {"model": name}
    try:
        _time_dynexport(case, ours_path)
    except Exception as error:  # a failure is a result: print it and go on with the suite
        result["error"] = f"dynexport: {type(error).__name__}: {str(error).splitlines()[0]}"
        return result
    theirs_ok = compare
    if compare:
        try:
            _time_torch_onnx(case, theirs_path)
        except Exception as error:
            result["theirs_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
            theirs_ok = False
    ours, theirs, phases = [], [], {p: [] for p in PHASES}
    for _ in range(repeats):
        seconds, timings = _time_dynexport(case, ours_path)
        ours.append(seconds)
        for phase in PHASES:
            phases[phase].append(timings.get(phase, 0.0))
        if theirs_ok:
            theirs.append(_time_torch_onnx(case, theirs_path))
    result["ours"] = statistics.median(ours)
    result["phases"] = {p: statistics.median(v) for p, v in phases.items()}
    if theirs:
        result["theirs"] = statistics.median(theirs)
        result["ratio"] = result["theirs"] / result["ours"]
    return result


class Block(torch.nn.Module):
    """One residual MLP block: the unit of the depth-scaling stack."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _stack(depth: int) -> Callable[[], Case]:
    def case() -> Case:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(16) for _ in range(depth)]).eval()
        return Case(model, (torch.randn(2, 16),), {}, ({0: torch.export.Dim("batch")},))

    return case


def _phase_check(result: dict[str, Any]) -> str:
    """Which phases other than capture cost more than capture (the target: none)."""
    capture = result["phases"]["capture"]
    slower = [p for p in PHASES[1:] if result["phases"][p] > capture]
    return "" if not slower else "  (slower than capture: " + ", ".join(slower) + ")"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(suite()))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--depths", default="64,256,1024",
        help="block counts of the depth-scaling stack ('' to skip it); torch.onnx runs up to --compare-depth",
    )
    parser.add_argument("--compare-depth", type=int, default=256)
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    models = selected_models(parser, options.models)

    header = f"{'model':<20} {'ours s':>8} " + " ".join(f"{p[:9]:>9}" for p in PHASES) + f" {'torch.onnx s':>12} {'speedup':>8}"
    print(header)
    ratios = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, factory in models.items():
            r = measure(name, factory, options.repeats, workdir)
            if "error" in r:
                print(f"{name:<20} FAILED {r['error']}")
                continue
            phases = " ".join(f"{r['phases'][p]:>9.3f}" for p in PHASES)
            theirs = f"{r['theirs']:>12.3f} {r['ratio']:>7.2f}x" if "theirs" in r else f"{'failed':>12} {'-':>8}  ({r['theirs_error']})"
            print(f"{name:<20} {r['ours']:>8.3f} {phases} {theirs}{_phase_check(r)}", flush=True)
            if "ratio" in r:
                ratios.append(r["ratio"])
        if ratios:
            geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            print(f"geometric mean speedup over torch.onnx.export(dynamo=True): {geomean:.2f}x on {len(ratios)} models")

        depths = [int(d) for d in options.depths.split(",") if d]
        if depths:
            print("\ndepth scaling: a stack of N residual blocks (LayerNorm, Linear, GELU, Linear)")
            print(f"{'blocks':>7} {'ours s':>8} {'ms/block':>9} {'torch.onnx s':>12} {'ms/block':>9}")
        for depth in depths:
            r = measure(f"stack_{depth}", _stack(depth), 1, workdir, compare=depth <= options.compare_depth)
            theirs = f"{r['theirs']:>12.3f} {1000 * r['theirs'] / depth:>9.2f}" if "theirs" in r else f"{'-':>12} {'-':>9}"
            print(f"{depth:>7} {r['ours']:>8.3f} {1000 * r['ours'] / depth:>9.2f} {theirs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
