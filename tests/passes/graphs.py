"""Hand-built graphs for the ONNX pass tests: parse ONNX text, run, list ops."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort


def model(text: str, opset: int = 20) -> ir.Model:
    """An onnx_ir model from the body of ONNX's text format (the header is added)."""
    header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
    return ir.serde.deserialize_model(onnx.parser.parse_model(header + text))


def ops(m: ir.Model) -> list[str]:
    return [node.op_type for node in m.graph]


def run(m: ir.Model, **feeds: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = ir.serde.serialize_model(m)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_same_results(before: list[np.ndarray], after: list[np.ndarray], rtol: float = 1e-5, atol: float = 1e-5) -> None:
    assert len(before) == len(after)
    for b, a in zip(before, after):
        assert b.shape == a.shape and b.dtype == a.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
