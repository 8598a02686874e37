"""The model suite's graphs run in a second runtime, OpenVINO's CPU plugin, and match eager
PyTorch at the export size and at resized inputs (tests/openvino_runner.py); each graph holds
only ONNX operators and types, with shapes onnx's inference agrees with (tests/portability.py)."""

from __future__ import annotations

import pytest

import dynexport
from tests.models.cases import CASES, HEAVY_CASES
from tests.openvino_runner import assert_openvino_matches
from tests.portability import assert_portable

openvino = pytest.importorskip("openvino")


@pytest.mark.parametrize("name", list(CASES) + [pytest.param(name, marks=pytest.mark.slow) for name in HEAVY_CASES])
def test_model_in_openvino(name):
    case = {**CASES, **HEAVY_CASES}[name]()
    args, kwargs = case.calls[0]
    program = dynexport.export(case.model, args, kwargs=kwargs, dynamic_shapes=case.dynamic_shapes)
    assert_portable(program, {})
    assert_openvino_matches(program, case.model, case.calls, atol=case.atol)
