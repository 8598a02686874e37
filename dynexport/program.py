"""ONNXProgram: the result of an export — the ONNX model, how to save it and how to run it."""

from __future__ import annotations

import io
import os
import tempfile
from typing import IO, Any

import onnx
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from dynexport.dtypes import to_torch_dtype

__all__ = ["ONNXProgram", "write_atomically"]


class ONNXProgram:
    """An exported model.

    Attributes:
        model: the ONNX model as an ``onnx_ir.Model``.
        exported_program: the torch.export program it was translated from (None when the model
            was built another way).
        timings: seconds spent in each export phase.
    """

    def __init__(
        self,
        model: ir.Model,
        exported_program: torch.export.ExportedProgram | None,
        *,
        timings: dict[str, float] | None = None,
        capture_strategy: str | None = None,
    ):
        self.model = model
        self.exported_program = exported_program
        self.timings = dict(timings or {})
        self.capture_strategy = capture_strategy
        self._proto: onnx.ModelProto | None = None
        self._session = None

    def __repr__(self) -> str:
        graph = self.model.graph
        inputs = ", ".join(_describe(v) for v in graph.inputs)
        outputs = ", ".join(_describe(v) for v in graph.outputs)
        return (
            f"ONNXProgram(opset={self.model.opset_imports.get('', '?')}, nodes={len(graph)}, "
            f"initializers={len(graph.initializers)}, inputs=[{inputs}], outputs=[{outputs}])"
        )

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an ``onnx.ModelProto`` (initializers included)."""
        if self._proto is None:
            self._proto = ir.serde.serialize_model(self.model)
        return self._proto

    def save(self, destination: str | os.PathLike | IO[bytes]) -> None:
        """Write the model to a path (atomically) or to a binary file object."""
        write_atomically(self.model_proto.SerializeToString(), destination)

    # -- running ----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model in onnxruntime on torch inputs and return torch tensors.

        Arguments follow the same conventions as at export; Python numbers that were baked
        into the graph are ignored. The outputs have the model's own structure.
        """
        import onnxruntime as ort

        if self._session is None:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            self._session = ort.InferenceSession(
                self.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        feeds = {name: _ort_value(array) for name, array in self._feeds(args, kwargs).items()}
        results = self._session.run_with_ort_values(None, feeds)
        # DLPack hands every dtype over without a copy (numpy has no bfloat16); bool arrives as
        # uint8 and is viewed back.
        tensors = [torch.from_dlpack(r) for r in results]
        dtypes = [to_torch_dtype(v.dtype) for v in self.model.graph.outputs]
        return self._structure([t.view(d) if t.dtype != d else t for t, d in zip(tensors, dtypes)])

    def _feeds(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        from dynexport.signature import split_legacy_args

        args, kwargs = split_legacy_args(args, kwargs)
        leaves = self._flat_user_inputs(args, kwargs)
        names = [v.name for v in self.model.graph.inputs if not v.is_initializer()]
        if len(leaves) != len(names):
            raise ValueError(
                f"the model takes {len(names)} tensor inputs ({names}) but {len(leaves)} were given"
            )
        feeds = {}
        for name, value, leaf in zip(names, self.model.graph.inputs, leaves):
            if isinstance(leaf, torch.Tensor):
                expected = to_torch_dtype(value.dtype)
                if leaf.dtype != expected:
                    raise TypeError(f"input {name!r} must be {expected}, got {leaf.dtype}")
                feeds[name] = _numpy(leaf)
            else:
                feeds[name] = torch.tensor(leaf).numpy()
        return feeds

    def _flat_user_inputs(self, args: tuple, kwargs: dict) -> list[Any]:
        if self.exported_program is None:
            return [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        in_spec = self.exported_program.call_spec.in_spec
        kwarg_names = in_spec.child(1).context if in_spec is not None else list(kwargs)
        missing = set(kwarg_names) - set(kwargs)
        unexpected = set(kwargs) - set(kwarg_names)
        if missing or unexpected:
            raise TypeError(
                f"keyword arguments must be {sorted(kwarg_names)} as at export "
                f"(missing {sorted(missing)}, unexpected {sorted(unexpected)})"
            )
        ordered = {k: kwargs[k] for k in kwarg_names}
        leaves = pytree.tree_leaves((args, ordered))
        specs = self.exported_program.graph_signature.input_specs
        user_args = [s.arg for s in specs if s.kind.name == "USER_INPUT"]
        if len(leaves) != len(user_args):
            raise ValueError(
                f"the inputs have {len(leaves)} leaves but the model was exported with {len(user_args)}"
            )
        return [
            leaf
            for leaf, arg in zip(leaves, user_args)
            if type(arg).__name__ in ("TensorArgument", "SymIntArgument", "SymFloatArgument", "SymBoolArgument")
        ]

    def _structure(self, tensors: list[Any]) -> Any:
        if self.exported_program is None:
            return tensors[0] if len(tensors) == 1 else tensors
        spec = self.exported_program.call_spec.out_spec
        outputs = [
            s for s in self.exported_program.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"
        ]
        it = iter(tensors)
        leaves = []
        for output in outputs:
            arg = output.arg
            if type(arg).__name__ == "ConstantArgument" and arg.value is None:
                leaves.append(None)
            else:
                leaves.append(next(it))
        return pytree.tree_unflatten(leaves, spec) if spec is not None else leaves


def _numpy(tensor: torch.Tensor):
    """A numpy array of ``tensor``'s data; bfloat16 as ml_dtypes.bfloat16."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _ort_value(array):
    import onnxruntime as ort

    if array.dtype.name == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view("uint16"), 16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _describe(value: ir.Value) -> str:
    dtype = value.dtype.name.lower() if value.dtype is not None else "?"
    shape = "[" + ",".join(str(d) for d in value.shape) + "]" if value.shape is not None else "?"
    return f"{value.name}: {dtype}{shape}"


def write_atomically(data: bytes, destination: str | os.PathLike | IO[bytes]) -> None:
    """Write ``data`` to a path through a temporary file and a rename (never a partial file), or
    to a binary file object."""
    if isinstance(destination, (str, os.PathLike)):
        path = os.fspath(destination)
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"cannot write {path!r}: directory {directory!r} does not exist")
        fd, temp = tempfile.mkstemp(prefix=".dynexport-", suffix=".onnx.tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
        return
    if isinstance(destination, io.TextIOBase) or not hasattr(destination, "write"):
        raise TypeError(
            f"f must be a path or a binary file object, got {type(destination).__name__}"
        )
    destination.write(data)

