"""torch.compile backends side by side: eager, inductor and dynexport (ONNX in onnxruntime).

    python benchmarks/compile_backend.py [--models mlp,tiny_gpt,...] [--iterations 50] [--threads 1]

For every model the steady-state latency of one inference call (median over ``--iterations``
calls, after warm-up calls that compile) is printed for eager PyTorch, ``backend="inductor"`` and
``backend="dynexport"``, with dynexport's subgraph count and how many of them fell back to eager.
Inductor needs a C++ compiler; when it cannot compile a model its column says "n/a" and why.
Last, dynexport's per-call overhead: a model that adds 1 to a 1-element tensor, compiled, minus
the same call eager. Numbers are informational: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import dynexport
from dynexport.examples import EXAMPLES

BACKENDS = ("eager", "inductor", "dynexport")


def latency(fn: Callable[..., Any], args: tuple, iterations: int, warmup: int = 3) -> float:
    """Median seconds of one call of ``fn(*args)`` under torch.no_grad."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def compiled(model: torch.nn.Module, backend: str) -> tuple[Callable[..., Any], Any]:
    torch._dynamo.reset()
    if backend == "eager":
        return model, None
    if backend == "inductor":
        return torch.compile(model, backend="inductor"), None
    onnx_backend = dynexport.backend()
    return torch.compile(model, backend=onnx_backend), onnx_backend


def measure(factory: Callable[[], tuple], iterations: int) -> dict[str, Any]:
    model, args, _, _ = factory()
    result: dict[str, Any] = {}
    for backend in BACKENDS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn, onnx_backend = compiled(model, backend)
                result[backend] = latency(fn, args, iterations)
        except Exception as error:  # a backend that cannot run a model is a result, not a crash
            result[backend] = f"n/a ({type(error).__name__}: {str(error).strip().splitlines()[0][:60]})"
            continue
        if onnx_backend is not None:
            subgraphs = onnx_backend.subgraphs
            result["subgraphs"] = f"{len(subgraphs)} ({sum(s.fallback_reason is not None for s in subgraphs)} eager)"
    return result


def per_call_overhead(iterations: int) -> tuple[float, float]:
    """(seconds per call of a trivial compiled model, seconds per call of it eager)."""

    def add_one(x):
        return x + 1

    x = torch.zeros(1)
    eager = latency(add_one, (x,), iterations * 20)
    fn, _ = compiled(add_one, "dynexport")
    return latency(fn, (x,), iterations * 20), eager


def _cell(value: Any) -> str:
    return f"{value * 1e3:>14.3f}" if isinstance(value, float) else f"{value:>14}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(EXAMPLES))
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    names = options.models.split(",") if options.models else list(EXAMPLES)
    unknown = set(names) - set(EXAMPLES)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {sorted(EXAMPLES)}")

    print(f"{'model':<20}" + "".join(f"{b + ' ms':>14}" for b in BACKENDS) + f"{'vs eager':>10}  subgraphs")
    notes = []
    for name in names:
        result = measure(EXAMPLES[name], options.iterations)
        cells = []
        for backend in BACKENDS:
            value = result[backend]
            if isinstance(value, str):
                notes.append(f"{name} {backend}: {value}")
                value = "n/a"
            cells.append(_cell(value))
        ours, eager = result["dynexport"], result["eager"]
        ratio = f"{eager / ours:>9.2f}x" if isinstance(ours, float) and isinstance(eager, float) else f"{'-':>10}"
        print(f"{name:<20}" + "".join(cells) + f"{ratio}  {result.get('subgraphs', '-')}", flush=True)
    for note in notes:
        print(note)
    compiled_call, eager_call = per_call_overhead(options.iterations)
    print(
        f"per-call overhead on a tiny model (x + 1, 1 element): {compiled_call * 1e6:.1f} us compiled with "
        f"dynexport, {eager_call * 1e6:.1f} us eager, overhead {(compiled_call - eager_call) * 1e6:.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
