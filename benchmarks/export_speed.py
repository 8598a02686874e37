"""Export speed: dynexport vs torch.onnx.export(dynamo=True), side by side in one process.

    python benchmarks/export_speed.py [--repeats 3] [--models mlp,tiny_gpt,...] [--threads 1]

Every model is exported and saved by both exporters, alternating, after one warm-up export each;
the median of ``--repeats`` runs is reported. For dynexport the per-phase breakdown (capture,
decompose, translate, optimize, serialize) is printed too. Ratios are informational: the machine
is shared and noisy, so no threshold is enforced anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
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

PHASES = ("capture", "decompose", "translate", "optimize", "serialize")


def _transformers_models() -> dict[str, Callable[[], tuple]]:
    try:
        import transformers
    except ImportError:
        return {}
    Dim = torch.export.Dim

    def gpt2():
        config = transformers.GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4, use_cache=False)
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).eval()
        return model, (torch.randint(0, 1000, (2, 16)),), ({0: Dim("batch"), 1: Dim("seq", max=128)},), None

    def bert():
        config = transformers.BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
        )
        torch.manual_seed(0)
        model = transformers.BertModel(config).eval()
        return model, (torch.randint(0, 1000, (2, 16)),), ({0: Dim("batch"), 1: Dim("seq", max=512)},), None

    def llama():
        config = transformers.LlamaConfig(
            vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, use_cache=False,
        )
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        return model, (torch.randint(0, 1000, (2, 16)),), ({0: Dim("batch"), 1: Dim("seq", max=2048)},), None

    return {"hf_gpt2": gpt2, "hf_bert": bert, "hf_llama": llama}


def suite() -> dict[str, Callable[[], tuple]]:
    return {**EXAMPLES, **_transformers_models()}


def selected_models(parser: argparse.ArgumentParser, names: str | None) -> dict[str, Callable[[], tuple]]:
    """The suite, or the comma-separated subset ``names`` of it (an unknown name is an error)."""
    models = suite()
    if not names:
        return models
    unknown = set(names.split(",")) - set(models)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {sorted(models)}")
    return {name: models[name] for name in names.split(",")}


def _time_dynexport(model, args, dynamic_shapes, path) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    program = dynexport.export(model, args, path, dynamic_shapes=dynamic_shapes)
    return time.perf_counter() - start, program.timings


def _time_torch_onnx(model, args, dynamic_shapes, path) -> float:
    start = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False)
    return time.perf_counter() - start


def measure(name: str, factory: Callable[[], tuple], repeats: int, workdir: str) -> dict[str, Any]:
    model, args, dynamic_shapes, _ = factory()
    ours_path = os.path.join(workdir, f"{name}.dynexport.onnx")
    theirs_path = os.path.join(workdir, f"{name}.torch_onnx.onnx")
    result: dict[str, Any] = {"model": name}
    try:
        _time_dynexport(model, args, dynamic_shapes, ours_path)
    except Exception as error:  # a failure is a result: print it and go on with the suite
        result["error"] = f"dynexport: {type(error).__name__}: {str(error).splitlines()[0]}"
        return result
    try:
        _time_torch_onnx(model, args, dynamic_shapes, theirs_path)
        theirs_ok = True
    except Exception as error:
        result["theirs_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
        theirs_ok = False
    ours, theirs, phases = [], [], {p: [] for p in PHASES}
    for _ in range(repeats):
        seconds, timings = _time_dynexport(model, args, dynamic_shapes, ours_path)
        ours.append(seconds)
        for phase in PHASES:
            phases[phase].append(timings.get(phase, 0.0))
        if theirs_ok:
            theirs.append(_time_torch_onnx(model, args, dynamic_shapes, theirs_path))
    result["ours"] = statistics.median(ours)
    result["phases"] = {p: statistics.median(v) for p, v in phases.items()}
    if theirs:
        result["theirs"] = statistics.median(theirs)
        result["ratio"] = result["theirs"] / result["ours"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(suite()))
    parser.add_argument("--threads", type=int, default=1)
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
            print(f"{name:<20} {r['ours']:>8.3f} {phases} {theirs}", flush=True)
            if "ratio" in r:
                ratios.append(r["ratio"])
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"geometric mean speedup over torch.onnx.export(dynamo=True): {geomean:.2f}x on {len(ratios)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
