"""Export every example model, verify it in onnxruntime at two sizes, and print a summary.

    python -m dynexport.examples [--out DIR]

Exits with status 1 when an exported model does not match PyTorch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

import dynexport
from dynexport.examples import EXAMPLES


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual - expected).abs().max().item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynexport.examples", description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory to write the .onnx files to (default: a temporary one)")
    options = parser.parse_args(argv)
    out_dir = options.out or tempfile.mkdtemp(prefix="dynexport-examples-")
    os.makedirs(out_dir, exist_ok=True)

    failures = 0
    print(f"{'model':<20} {'export s':>9} {'nodes':>6} {'inputs':<36} {'max error':>10} {'resized':>10}  result")
    for name, factory in EXAMPLES.items():
        model, args, dynamic_shapes, resized = factory()
        path = os.path.join(out_dir, f"{name}.onnx")
        start = time.perf_counter()
        program = dynexport.export(model, args, path, dynamic_shapes=dynamic_shapes)
        seconds = time.perf_counter() - start
        with torch.no_grad():
            errors = [_max_error(program(*call), model(*call)) for call in (args, resized)]
        ok = all(error < 1e-3 for error in errors)
        failures += not ok
        graph = program.model.graph
        inputs = ", ".join(f"{v.name}[{','.join(str(d) for d in v.shape)}]" for v in graph.inputs)
        print(
            f"{name:<20} {seconds:>9.2f} {len(graph):>6} {inputs:<36} {errors[0]:>10.2e} "
            f"{errors[1]:>10.2e}  {'ok' if ok else 'MISMATCH'}"
        )
    print(f"ONNX files in {out_dir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
