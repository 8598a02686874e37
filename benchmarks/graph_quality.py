"""Graph quality: dynexport vs torch.onnx.export (dynamo=True and TorchScript), side by side.

    python benchmarks/graph_quality.py [--repeats 50] [--models mlp,tiny_gpt,...]

Every model of ``benchmarks/export_speed.py``'s suite is exported by the three exporters. Per
model and exporter it prints the main graph's node count, the initializer bytes, the file size
(external data included) and the onnxruntime latency (median over ``--repeats`` runs on the
example inputs, one thread), then our/their ratios and their geometric means. Latency is noisy on a shared machine: nothing
here is a test threshold.
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
from collections.abc import Callable, Iterator
from typing import Any

import onnx
import onnxruntime as ort
import torch

import dynexport

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_speed import Case, selected_models, suite  # noqa: E402  (the same models, defined once)

EXPORTERS = ("dynexport", "dynamo", "torchscript")


def _export_dynexport(case: Case, path: str) -> None:
    dynexport.export(case.model, case.args, path, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes)


def _export_dynamo(case: Case, path: str) -> None:
    torch.onnx.export(
        case.model, case.args, path, kwargs=case.kwargs, dynamo=True, dynamic_shapes=case.dynamic_shapes, verbose=False
    )


def _export_torchscript(case: Case, path: str) -> None:
    names = [f"input_{i}" for i in range(len(case.args))] + list(case.kwargs)
    specs = list(case.dynamic_shapes.values()) if isinstance(case.dynamic_shapes, dict) else list(case.dynamic_shapes or ())
    dynamic_axes = {
        name: {axis: str(dim.__name__) for axis, dim in spec.items()} for name, spec in zip(names, specs) if spec
    }
    # The legacy convention: a trailing dict in args holds the keyword arguments.
    args = (*case.args, case.kwargs) if case.kwargs else case.args
    torch.onnx.export(
        case.model, args, path, dynamo=False, input_names=names, dynamic_axes=dynamic_axes, opset_version=20
    )


_EXPORT: dict[str, Callable[..., None]] = {
    "dynexport": _export_dynexport,
    "dynamo": _export_dynamo,
    "torchscript": _export_torchscript,
}


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Silence stdout and stderr at the file-descriptor level: the TorchScript exporter prints
    whole graphs from C++ when it fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def _latency(path: str, inputs: list[torch.Tensor], repeats: int) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), inputs)}
    for _ in range(5):
        session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def measure(name: str, factory: Callable[[], Case], repeats: int, workdir: str) -> dict[str, Any]:
    case = factory()
    inputs = [*case.args, *case.kwargs.values()]
    results: dict[str, Any] = {}
    for exporter in EXPORTERS:
        directory = os.path.join(workdir, f"{name}.{exporter}")
        os.makedirs(directory)
        path = os.path.join(directory, "model.onnx")
        try:
            with warnings.catch_warnings(), _silenced():
                warnings.simplefilter("ignore")
                _EXPORT[exporter](case, path)
            proto = onnx.load(path)
            results[exporter] = {
                "nodes": len(proto.graph.node),
                "bytes": _initializer_bytes(proto),
                "file": sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)),
                "latency": _latency(path, inputs, repeats),
            }
        except Exception as error:  # a failure is a result: print it and go on with the suite
            results[exporter] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:70]}"}
    return results


def _cell(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"{'failed':>30}"
    return f"{result['nodes']:>6} {result['bytes'] / 1024:>8.1f}K {result['file'] / 1024:>8.1f}K {result['latency'] * 1e3:>7.3f}ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(suite()))
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = selected_models(parser, options.models)

    columns = f"{'nodes':>6} {'init':>9} {'file':>9} {'latency':>9}"
    print(f"{'model':<20} " + " | ".join(f"{e:^36}" for e in EXPORTERS) + " | ratios ours/dynamo, ours/torchscript")
    print(f"{'':<20} " + " | ".join(f"{columns:>36}" for _ in EXPORTERS) + " | nodes, latency")
    ratios: dict[str, list[float]] = {f"{k} {e}": [] for k in ("nodes", "latency") for e in EXPORTERS[1:]}
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, factory in models.items():
            r = measure(name, factory, options.repeats, workdir)
            cells = " | ".join(f"{_cell(r[e]):>36}" for e in EXPORTERS)
            ratio_text = []
            for theirs in EXPORTERS[1:]:
                if "error" in r["dynexport"] or "error" in r[theirs]:
                    ratio_text.append("-")
                    continue
                for key in ("nodes", "latency"):
                    ratios[f"{key} {theirs}"].append(r["dynexport"][key] / r[theirs][key])
                ratio_text.append(
                    f"{r['dynexport']['nodes'] / r[theirs]['nodes']:.2f}, "
                    f"{r['dynexport']['latency'] / r[theirs]['latency']:.2f}"
                )
            print(f"{name:<20} {cells} | {' ; '.join(ratio_text)}", flush=True)
            failures += [f"{name} {e}: {r[e]['error']}" for e in EXPORTERS if "error" in r[e]]
    for key, values in ratios.items():
        if values:
            geomean = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"geometric mean ours/{key.split()[1]} {key.split()[0]}: {geomean:.3f} on {len(values)} models")
    for failure in failures:
        print("failed:", failure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
