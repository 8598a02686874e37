"""onnxruntime plumbing: sessions, feeds, OrtValues, and the outputs back as torch tensors.

The one place dynexport talks to onnxruntime; :class:`~dynexport.ONNXProgram`, verification and
the ``torch.compile`` backend run their models through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from dynexport.dtypes import to_torch_dtype

__all__ = [
    "fed_inputs",
    "feeds",
    "from_numpy",
    "inference_session",
    "ort_values_to_torch",
    "run_session",
    "to_numpy",
    "to_ort_value",
]


def inference_session(model: bytes | str, options: Any = None, providers: Sequence[Any] = ("CPUExecutionProvider",)):
    """An ``onnxruntime.InferenceSession`` of a serialized model or a model file; without
    ``options``, one that logs errors only."""
    import onnxruntime as ort

    if options is None:
        options = ort.SessionOptions()
        options.log_severity_level = 3
    try:
        return ort.InferenceSession(model, options, providers=list(providers))
    except Exception as error:
        if "NOT_IMPLEMENTED" in str(error):
            error.add_note(
                f"onnxruntime ({', '.join(map(str, providers))}) has no kernel for that operator at the "
                "dtype the graph computes it in (its CPU provider has almost none for bfloat16); the "
                "ONNX model itself is valid. Run it where the kernels exist (CUDA), export the model in "
                "float32 (model.float()), or check it with program.call_reference(...) (onnx's "
                "reference evaluator)."
            )
        raise


def fed_inputs(graph: ir.Graph) -> list[ir.Value]:
    """The graph inputs a caller feeds: every input that is no initializer (an initializer
    listed as an input too, a training-mode buffer, has its own default)."""
    return [v for v in graph.inputs if not v.is_initializer()]


def feeds(graph: ir.Graph, values: Sequence[Any]) -> dict[str, Any]:
    """numpy arrays for the graph's fed inputs from ``values`` (tensors and Python numbers), in
    order; a tensor of another dtype than its input is a TypeError."""
    inputs = fed_inputs(graph)
    if len(values) != len(inputs):
        names = [v.name for v in inputs]
        raise ValueError(f"the model takes {len(inputs)} tensor inputs ({names}) but {len(values)} were given")
    arrays = {}
    for graph_input, value in zip(inputs, values):
        if isinstance(value, torch.Tensor):
            expected = to_torch_dtype(graph_input.dtype)
            if value.dtype != expected:
                raise TypeError(f"input {graph_input.name!r} must be {expected}, got {value.dtype}")
            if value.device.type == "meta":
                raise ValueError(f"input {graph_input.name!r} is on the meta device: it has no values to run on")
            arrays[graph_input.name] = to_numpy(value)
        elif isinstance(value, (bool, int, float)) and graph_input.shape is not None and graph_input.shape.rank() == 0:
            arrays[graph_input.name] = torch.tensor(value).numpy()
        else:
            raise TypeError(
                f"input {graph_input.name!r} must be a {to_torch_dtype(graph_input.dtype)} tensor of shape "
                f"{list(graph_input.shape.dims) if graph_input.shape is not None else '?'}, got the "
                f"{type(value).__name__} {value!r:.40}"
            )
    return arrays


def run_session(session: Any, arrays: dict[str, Any], outputs: Sequence[ir.Value]) -> list[Any]:
    """Run ``session`` on the numpy ``arrays``; the values of ``outputs`` (the session's
    outputs, in order) as torch tensors, a sequence output as a list of them."""
    if any(isinstance(value.type, ir.SequenceType) for value in outputs):
        # An OrtValue holding a sequence does not hand its tensors over: numpy does.
        results = session.run(None, arrays)
        return [[from_numpy(a) for a in r] if isinstance(r, list) else from_numpy(r) for r in results]
    results = session.run_with_ort_values(None, {name: to_ort_value(a) for name, a in arrays.items()})
    return ort_values_to_torch(results, [v.dtype for v in outputs])


def ort_values_to_torch(results: list[Any], dtypes: list[ir.DataType]) -> list[torch.Tensor]:
    """onnxruntime OrtValues as torch tensors of ``dtypes``, without copies.

    DLPack hands every dtype over (numpy has no bfloat16); bool arrives as uint8 and is viewed
    back."""
    tensors = [torch.from_dlpack(r) for r in results]
    wanted = [to_torch_dtype(d) for d in dtypes]
    return [t.view(d) if t.dtype != d else t for t, d in zip(tensors, wanted)]


def to_numpy(tensor: torch.Tensor):
    """A numpy array of ``tensor``'s data; bfloat16 as ml_dtypes.bfloat16."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def from_numpy(array) -> torch.Tensor:
    """A torch tensor of a numpy array's data (ml_dtypes.bfloat16 as bfloat16): to_numpy's inverse."""
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view("uint16")).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_ort_value(array):
    """An OrtValue of a numpy array (bfloat16 included)."""
    import onnxruntime as ort

    if array.dtype.name == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view("uint16"), 16)
    return ort.OrtValue.ortvalue_from_numpy(array)
