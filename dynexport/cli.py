"""The ``dynexport`` command line.

    dynexport export MODULE:FACTORY -o model.onnx [--dynamic SPEC]... [--opset N] [--verify] [--report [PATH]]
    dynexport inspect model.onnx

``FACTORY`` is a function of ``MODULE`` that takes no arguments and returns the model and its
example inputs: ``(model, args)``, ``(model, args, dynamic_shapes)``, ``(model, args,
dynamic_shapes, resized_args)`` (the form of the factories in ``dynexport.examples``) or a
dict with the keys ``model``, ``args`` and optionally ``kwargs``, ``dynamic_shapes``,
``resized``. Errors print one paragraph; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any

from dynexport.graph_text import type_proto_text, value_text

__all__ = ["main"]

_BAR_MIN_BYTES = 16 * 1024 * 1024


class CommandError(Exception):
    """A problem with what was asked on the command line."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynexport", description="Export PyTorch models to ONNX and inspect ONNX files.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser("export", help="export a model returned by a factory function")
    export.add_argument("factory", metavar="MODULE:FACTORY",
                        help="a function returning (model, args[, dynamic_shapes[, resized_args]]), "
                             "e.g. dynexport.examples:tiny_gpt")
    export.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    export.add_argument("--dynamic", action="append", metavar="INPUT:AXIS[=NAME][,AXIS[=NAME]]",
                        help="make these axes of an input dynamic (repeatable), e.g. input_ids:0=batch,1=seq; "
                             "'none' exports static shapes; default: the factory's dynamic_shapes")
    export.add_argument("--opset", type=int, default=None, help="ONNX opset (13-23, default 20)")
    export.add_argument("--verify", action="store_true",
                        help="compare onnxruntime with PyTorch on the example (and resized) inputs")
    export.add_argument("--report", nargs="?", const=True, default=False, metavar="PATH",
                        help="write a markdown report (default: next to the output, .report.md)")
    export.add_argument("--external-data", action="store_true",
                        help="store the weights in <output>.data (automatic above 2 GB)")
    export.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    inspect = commands.add_parser("inspect", help="summarize an ONNX file")
    inspect.add_argument("path", help="the .onnx file")
    inspect.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    try:
        if options.command == "export":
            return _export(options)
        return _inspect(options.path)
    except KeyboardInterrupt:
        print("dynexport: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # one paragraph, not a traceback, unless --debug
        if options.debug:
            traceback.print_exc()
        else:
            message = str(error).strip() or type(error).__name__
            kind = "" if isinstance(error, CommandError) else f"{type(error).__name__}: "
            print(f"dynexport: error: {kind}{message}", file=sys.stderr)
            for note in getattr(error, "__notes__", []):
                print(note, file=sys.stderr)
            print("(run with --debug to see the traceback)", file=sys.stderr)
        return 1


# -- export -------------------------------------------------------------------------------------


def _load_factory(spec: str) -> dict[str, Any]:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CommandError(f"{spec!r} is not MODULE:FACTORY (e.g. dynexport.examples:tiny_gpt)")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CommandError(f"cannot import module {module_name!r}: {error}") from error
    finally:
        sys.path.pop(0)
    factory = getattr(module, attribute, None)
    if factory is None:
        raise CommandError(f"module {module_name!r} has no attribute {attribute!r}")
    if not (inspect.isfunction(factory) or inspect.isclass(factory)):
        raise CommandError(f"{spec} is a {type(factory).__name__}; a factory is a function or a class")
    result = factory()
    if isinstance(result, dict):
        if "model" not in result or "args" not in result:
            raise CommandError(f"{spec}() returned a dict without 'model' and 'args'")
        return {"kwargs": None, "dynamic_shapes": None, "resized": None, **result}
    if isinstance(result, (tuple, list)) and 2 <= len(result) <= 4:
        names = ["model", "args", "dynamic_shapes", "resized"]
        return {"kwargs": None, "dynamic_shapes": None, "resized": None, **dict(zip(names, result))}
    raise CommandError(
        f"{spec}() returned a {type(result).__name__}; a factory returns (model, args), "
        "(model, args, dynamic_shapes), (model, args, dynamic_shapes, resized_args) or a dict"
    )


def _dynamic_axes(specs: list[str]) -> dict[str, dict[int, str]] | None:
    if specs == ["none"]:
        return None
    axes: dict[str, dict[int, str]] = {}
    for spec in specs:
        name, sep, rest = spec.partition(":")
        if not sep or not name or not rest:
            raise CommandError(f"--dynamic {spec!r} is not INPUT:AXIS[=NAME][,AXIS[=NAME]] (e.g. input_ids:0=batch,1=seq)")
        for item in rest.split(","):
            axis, _, dim = item.partition("=")
            try:
                axis_number = int(axis)
            except ValueError:
                raise CommandError(f"--dynamic {spec!r}: axis {axis!r} is not an integer") from None
            axes.setdefault(name, {})[axis_number] = dim or f"{name}_dim_{axis_number}"
    return axes


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _ProgressBar:
    """A progress bar for writing weights, on stderr; silent for small models."""

    def __init__(self, width: int = 30):
        self.width = width
        self.shown = -1

    def __call__(self, done: int, total: int) -> None:
        if total < _BAR_MIN_BYTES:
            return
        filled = self.width * done // total
        if filled == self.shown:
            return
        self.shown = filled
        end = "\n" if done >= total else ""
        bar = "#" * filled + "." * (self.width - filled)
        print(f"\r  weights [{bar}] {done / 1e9:.2f}/{total / 1e9:.2f} GB", end=end, file=sys.stderr, flush=True)


def _export(options: argparse.Namespace) -> int:
    import dynexport
    from dynexport.api import phase_listener
    from dynexport.verification import VerificationError

    output = options.output
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise CommandError(f"cannot write {output!r}: directory {directory!r} does not exist")
    dynamic_axes = _dynamic_axes(options.dynamic) if options.dynamic else None
    start = time.perf_counter()
    _log(f"loading {options.factory}")
    spec = _load_factory(options.factory)
    _log(f"  loaded in {time.perf_counter() - start:.2f} s")
    dynamic_shapes = None if options.dynamic else spec["dynamic_shapes"]

    def on_phase(name: str, seconds: float) -> None:
        _log(f"  {name:<10} {seconds:8.2f} s")

    report: Any = options.report
    if report is True:
        report = os.path.splitext(output)[0] + ".report.md"
    verification = None
    # With resized inputs the one verification runs after the export, at both sizes.
    verify_in_export = options.verify and spec["resized"] is None
    with phase_listener(on_phase):
        try:
            program = dynexport.export(
                spec["model"], spec["args"], kwargs=spec["kwargs"], opset_version=options.opset,
                dynamic_shapes=dynamic_shapes, dynamic_axes=dynamic_axes, report=report or False,
                verify=verify_in_export,
            )
        except VerificationError as error:
            program, verification = error.report.program, error.report
    if options.verify and spec["resized"] is not None:
        verification = program.verify(*_as_args(spec["args"]), model=spec["model"], kwargs=spec["kwargs"],
                                      resized=[spec["resized"]])
    elif options.verify:
        verification = verification or program.verification
    save_start = time.perf_counter()
    program.save(output, external_data=True if options.external_data else None, progress=_ProgressBar())
    _log(f"  {'save':<10} {time.perf_counter() - save_start:8.2f} s")
    graph = program.model.graph
    weights = sum(v.const_value.nbytes for v in graph.initializers.values() if v.const_value is not None)
    print(f"wrote {output}: {len(graph)} nodes, {len(graph.initializers)} initializers ({weights / 1e6:.1f} MB)")
    print("inputs:  " + ", ".join(value_text(v) for v in graph.inputs))
    print("outputs: " + ", ".join(value_text(v) for v in graph.outputs))
    if report:
        print(f"report:  {report}")
    if verification is not None:
        print(verification.summary())
        if not verification.passed:
            print("dynexport: error: the ONNX model does not match PyTorch (see the table above)", file=sys.stderr)
            return 1
    return 0


def _as_args(args: Any) -> tuple:
    return args if isinstance(args, tuple) else (args,)


# -- inspect ------------------------------------------------------------------------------------


def _tensor_bytes(tensor) -> int:
    import onnx

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        entries = {e.key: e.value for e in tensor.external_data}
        if "length" in entries:
            return int(entries["length"])
    if tensor.raw_data:
        return len(tensor.raw_data)
    count = 1
    for d in tensor.dims:
        count *= d
    try:
        return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return 0


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs]:
                yield from _all_nodes(sub)


def _inspect(path: str) -> int:
    import onnx

    if not os.path.isfile(path):
        raise CommandError(f"{path!r} does not exist")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as error:
        raise CommandError(f"{path!r} is not an ONNX model: {error}") from error
    if model.ir_version == 0 or not model.opset_import:
        # protobuf reads an empty file (or many a non-model file) as an empty message
        empty = "it is empty" if os.path.getsize(path) == 0 else "it has no IR version or opset"
        raise CommandError(f"{path!r} is not an ONNX model: {empty}")
    graph = model.graph
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    producer = f"{model.producer_name} {model.producer_version}".strip() or "unknown"
    print(f"{path}: ir_version {model.ir_version}, producer {producer}, opsets: {opsets}")
    initializer_names = {t.name for t in graph.initializer}
    print("inputs:")
    for value in graph.input:
        if value.name not in initializer_names:
            print(f"  {value.name}: {type_proto_text(value.type)}")
    print("outputs:")
    for value in graph.output:
        print(f"  {value.name}: {type_proto_text(value.type)}")
    _print_input_guards({p.key: p.value for p in model.metadata_props})
    total = sum(_tensor_bytes(t) for t in graph.initializer)
    files = sorted({e.value for t in graph.initializer for e in t.external_data if e.key == "location"})
    external = f", external data in {', '.join(files)}" if files else ""
    print(f"initializers: {len(graph.initializer)} tensors, {total:,} bytes ({total / 1e6:.1f} MB){external}")
    histogram = Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in _all_nodes(graph))
    print(f"nodes: {sum(histogram.values())} ({len(histogram)} op types)")
    for op, count in histogram.most_common():
        print(f"  {op:<28} {count:>6}")
    if model.functions:
        print(f"functions: {', '.join(f'{f.domain}::{f.name}' for f in model.functions)}")
    return 0


def _print_input_guards(metadata: dict[str, str]) -> None:
    """The inputs the model was exported for, as dynexport wrote them in its metadata."""
    from dynexport.input_guards import BAKED_INPUTS_KEY, DIM_RANGES_KEY, INPUT_DIMS_KEY

    dims = json.loads(metadata.get(INPUT_DIMS_KEY, "{}"))
    ranges = json.loads(metadata.get(DIM_RANGES_KEY, "{}"))
    baked = json.loads(metadata.get(BAKED_INPUTS_KEY, "{}"))
    if not (dims or baked):
        return
    print("valid inputs (ONNXProgram refuses others):")
    for name, shape in dims.items():
        print(f"  {name}: [{', '.join(map(str, shape))}]")
    for dim, (low, high) in ranges.items():
        print(f"  {dim} in [{low}, {'inf' if high is None else high}]")
    for name, value in baked.items():
        print(f"  {name} = {value!r} (built into the graph)")


if __name__ == "__main__":
    sys.exit(main())
