"""Running exported models in OpenVINO's CPU runtime, the second runtime the model suite checks.

OpenVINO reads the ONNX bytes itself (its ONNX front end) and compiles them for the CPU. On CPUs
with native bfloat16 (AVX512-BF16, AMX) its default inference precision is bfloat16: the runs
here ask for float32 (``INFERENCE_PRECISION_HINT``), as a user comparing with PyTorch must.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import dynexport
from tests.equivalence import assert_close

__all__ = ["FLOAT32_PRECISION", "assert_openvino_matches", "compile_in_openvino", "run_in_openvino"]

FLOAT32_PRECISION = {"INFERENCE_PRECISION_HINT": "f32"}


def compile_in_openvino(program: dynexport.ONNXProgram):
    """The program's ONNX model read by OpenVINO's ONNX front end and compiled for its CPU
    device in float32."""
    import openvino

    core = openvino.Core()
    model = core.read_model(program.model_proto.SerializeToString(), b"")
    return core.compile_model(model, "CPU", FLOAT32_PRECISION)


def run_in_openvino(program: dynexport.ONNXProgram, compiled: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``compiled`` (from :func:`compile_in_openvino`) as the program is called: torch
    inputs, torch outputs in the model's own structure."""
    results = compiled(program.input_feeds(*args, **kwargs))
    return program.output_structure([torch.from_numpy(np.array(results[port])) for port in compiled.outputs])


def assert_openvino_matches(
    program: dynexport.ONNXProgram,
    model: Any,
    calls: Sequence[tuple[tuple, dict]],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Run ``program`` in OpenVINO at every ``(args, kwargs)`` of ``calls`` and compare each
    output with eager PyTorch's (shape, dtype and values)."""
    compiled = compile_in_openvino(program)
    for index, (args, kwargs) in enumerate(calls):
        with torch.no_grad():
            expected = model(*args, **kwargs)
        actual = run_in_openvino(program, compiled, *args, **kwargs)
        where = "OpenVINO, " + ("example inputs" if index == 0 else f"call #{index} " + _sizes(args, kwargs))
        assert_close(actual, expected, rtol=rtol, atol=atol, where=where)


def _sizes(args: tuple, kwargs: dict) -> str:
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    return str([tuple(leaf.shape) for leaf in leaves if isinstance(leaf, torch.Tensor)])
