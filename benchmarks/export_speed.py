"""Export speed: dynexport vs torch.onnx.export(dynamo=True), side by side in one process.

    python benchmarks/export_speed.py [--repeats 3] [--models mlp,hf_llama,...] [--threads 1]
                                      [--depths 64,256,1024] [--compare-depth 256]

The suite is the shipped examples, the encoder and decoder families of the model tests (tiny
transformers configs), torchvision's Swin with dynamic sides (the zoo tests' tiny config, and
swin_t from 256 pixels), and transformers' tiny Swin and FocalNet with plain ``Dim("h")``,
``Dim("w")`` (refined to multiples while capturing). Every model is exported and saved by both exporters, alternating, after
one warm-up export each; the median of ``--repeats`` runs is reported. For dynexport the
per-phase breakdown (capture, decompose, translate, optimize, serialize) is printed, with any
phase that cost more than capture flagged. Then a stack of N identical residual blocks is
exported for each N of ``--depths`` and the time per block printed: cost must grow linearly
with depth. Last, issue 18's LLaMA-shaped decoder (benchmarks/llm.py's config, ``--llm-layers``
layers, its past keys and values as inputs) is exported with its stages timed: plain
``torch.export.export`` of the same call, dynexport's phases (capture, of which torch.export;
decompose; translate; optimize; save with external data) and torch.onnx's export and save at
opset 23, the three alternating, medians of ``--llm-repeats``. Ratios are informational: the
machine is shared and noisy, so no threshold is enforced anywhere.
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


def _windowed_vision_models() -> dict[str, Callable[[], Case]]:
    """torchvision's Swin with dynamic sides (multiples of 32): its windows are views over sizes
    computed by floor division. The tiny config of the zoo tests (from 160 pixels, as they declare
    it), and swin_t from 256 pixels (at 224 its last map is one window, where the model skips the
    shift: the graph of a 224 example holds up to 224 only)."""
    from tests.torchvision_ops import load_torchvision_if_installed

    torchvision = load_torchvision_if_installed()
    if torchvision is None:
        return {}
    swin = torchvision.models.swin_transformer

    def case(build: Callable[[], torch.nn.Module], side: int) -> Callable[[], Case]:
        def make() -> Case:
            torch.manual_seed(0)
            height, width = (32 * torch.export.Dim(f"{name}_32", min=side // 32, max=32) for name in ("height", "width"))
            return Case(build().eval(), (torch.randn(2, 3, side, side),), {}, ({0: torch.export.Dim("batch"), 2: height, 3: width},))

        return make

    def tiny() -> torch.nn.Module:
        return swin.SwinTransformer(
            patch_size=[4, 4], embed_dim=24, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=[4, 4],
            stochastic_depth_prob=0.0, num_classes=10,
        )

    return {"tv_swin_tiny": case(tiny, 160), "tv_swin_t": case(lambda: swin.swin_t(weights=None), 256)}


def _plain_dim_vision_models() -> dict[str, Callable[[], Case]]:
    """transformers' hierarchical vision models that pad by blocks in Python, with the sides
    declared as torch.onnx's docs write them (plain ``Dim("h")``, ``Dim("w")``): every capture
    round but the last ends in a multiple the model requires (dynexport/multiples.py). A tiny
    two-stage Swin (window 4) and FocalNet, from 64 and 96 pixels."""
    from tests.torchvision_ops import load_torchvision_if_installed

    load_torchvision_if_installed()  # transformers' vision models import torchvision when installed
    try:
        import transformers
    except ImportError:
        return {}

    def case(build: Callable[[], torch.nn.Module], side: int) -> Callable[[], Case]:
        def make() -> Case:
            torch.manual_seed(0)
            sides = {0: torch.export.Dim("batch"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")}
            return Case(build().eval(), (torch.randn(2, 3, side, side),), {}, {"pixel_values": sides})

        return make

    def swin() -> torch.nn.Module:
        return transformers.SwinModel(transformers.SwinConfig(
            image_size=64, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4,
        ))

    def focalnet() -> torch.nn.Module:
        return transformers.FocalNetModel(transformers.FocalNetConfig(
            image_size=64, embed_dim=16, depths=[1, 1], hidden_sizes=[16, 32],
        ))

    return {"hf_swin_plain_dims": case(swin, 64), "hf_focalnet_plain_dims": case(focalnet, 96)}


def suite() -> dict[str, Callable[[], Case]]:
    return {
        **{name: _example(factory) for name, factory in EXAMPLES.items()},
        **_transformers_models(),
        **_windowed_vision_models(),
        **_plain_dim_vision_models(),
    }


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
    parser.add_argument("--llm-layers", type=int, default=30, help="layers of the LLaMA-shaped decoder (0 skips it)")
    parser.add_argument("--llm-repeats", type=int, default=1)
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
        if options.llm_layers:
            print_llm_stages(measure_llm(options.llm_layers, options.llm_repeats, workdir), options.llm_layers)
    return 0


LLM_STAGES = ("torch.export", "capture", *PHASES[1:])


def measure_llm(layers: int, repeats: int, workdir: str) -> dict[str, float]:
    """Median seconds of each stage of exporting benchmarks/llm.py's decoder with ``layers``
    layers: plain torch.export, dynexport's phases (``serialize``: saved with external data) and
    torch.onnx's total (export and save), the three alternating; one warm-up export of
    dynexport first."""
    from benchmarks import llm  # the decoder of issue 18 and its call

    model = llm.llama_135m(layers)
    wrapped = llm.WithPlainCache(model)

    def call() -> dict[str, Any]:
        return {"kwargs": llm.cached_call(model.config, 2, 8, 4), "dynamic_shapes": llm.dynamic_shapes(layers)}

    def plain_export() -> float:
        start = time.perf_counter()
        torch.export.export(wrapped, (), **call(), strict=False)
        return time.perf_counter() - start

    def ours(path: str) -> dict[str, float]:
        program = dynexport.export(wrapped, (), **call(), opset_version=23)
        start = time.perf_counter()
        program.save(path, external_data=True)
        return {**program.timings, "serialize": time.perf_counter() - start}

    def theirs(path: str) -> float:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(wrapped, (), **call(), dynamo=True, opset_version=23, verbose=False).save(
                path, external_data=True
            )
        return time.perf_counter() - start

    stages: dict[str, list[float]] = {stage: [] for stage in (*LLM_STAGES, "torch.onnx")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours(os.path.join(workdir, "llm_warmup.onnx"))
        for repeat in range(repeats):
            stages["torch.export"].append(plain_export())
            for phase, seconds in ours(os.path.join(workdir, f"llm_{repeat}.dynexport.onnx")).items():
                if phase in stages:
                    stages[phase].append(seconds)
            stages["torch.onnx"].append(theirs(os.path.join(workdir, f"llm_{repeat}.torch_onnx.onnx")))
    return {stage: statistics.median(seconds) for stage, seconds in stages.items() if seconds}


def print_llm_stages(stages: dict[str, float], layers: int) -> None:
    ours = sum(stages[phase] for phase in PHASES)
    print(f"\nLLaMA-shaped decoder, {layers} layers (benchmarks/llm.py): stages in seconds")
    print(f"  torch.export alone {stages['torch.export']:.2f}")
    print(
        f"  dynexport {ours:.2f}: capture {stages['capture']:.2f} "
        f"(beyond torch.export alone {stages['capture'] - stages['torch.export']:+.2f}), "
        + ", ".join(f"{phase} {stages[phase]:.2f}" for phase in PHASES[1:])
    )
    print(f"  torch.onnx.export(dynamo=True, opset 23) + save {stages['torch.onnx']:.2f}: {stages['torch.onnx'] / ours:.2f}x dynexport's")


if __name__ == "__main__":
    sys.exit(main())
