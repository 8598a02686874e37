"""ONNXProgram: the result of an export — the ONNX model, how to save it, run it and check it."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import io
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

import onnx
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree
from onnx_ir.tensor_adapters import TorchTensor

from dynexport.dtypes import to_torch_dtype
from dynexport.translate import BUFFER_UPDATES_KEY

if TYPE_CHECKING:
    from dynexport.verification import VerificationReport

__all__ = ["EXTERNAL_DATA_MIN_TENSOR_BYTES", "EXTERNAL_DATA_THRESHOLD", "ONNXProgram", "format_graph", "write_atomically"]

# Initializers above this many bytes in total go to an external data file: protobuf cannot hold
# a message of 2 GB or more. A module constant so that tests can lower it.
EXTERNAL_DATA_THRESHOLD = 2 * 1024**3

# Smaller tensors stay in the model file: runtimes read small constants (Split sizes, Reshape
# targets) while loading the graph, before any external data (onnx's own default is 1 KB).
EXTERNAL_DATA_MIN_TENSOR_BYTES = 1024

# Tensors of at least this size start at a multiple of _ALIGNMENT in the external data file, so
# that runtimes can memory-map them (onnx_ir and onnxruntime use the same figures).
_ALIGN_THRESHOLD = 1024 * 1024
_ALIGNMENT = 64 * 1024

ProgressCallback = Callable[[int, int], None]


class ONNXProgram:
    """An exported model.

    Attributes:
        model: the ONNX model as an ``onnx_ir.Model``.
        exported_program: the torch.export program it was translated from (None when the model
            was built another way).
        timings: seconds spent in each export phase.
        capture_strategy: the torch.export strategy that captured the model.
        verification: the :class:`~dynexport.verification.VerificationReport` of the last
            :meth:`verify`, if any.
        report_path: where ``export(report=...)`` wrote its markdown report, if anywhere.
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
        self.verification: VerificationReport | None = None
        self.report_path: str | None = None
        self._proto: onnx.ModelProto | None = None
        self._session = None
        # Training mode: the buffers each call updates, fed to the next call (as eager PyTorch
        # updates its module's buffers); empty until the first call.
        self.buffers: dict[str, torch.Tensor] = {}

    def __repr__(self) -> str:
        graph = self.model.graph
        inputs = ", ".join(_describe(v) for v in graph.inputs)
        outputs = ", ".join(_describe(v) for v in graph.outputs)
        return (
            f"ONNXProgram(opset={self.model.opset_imports.get('', '?')}, nodes={len(graph)}, "
            f"initializers={len(graph.initializers)}, inputs=[{inputs}], outputs=[{outputs}])"
        )

    def to_text(self, *, max_nodes: int | None = None) -> str:
        """The graph as text, one line per node, like torch.onnx's classic ``verbose=True``
        printout: inputs with types and shapes, then ``%out : type = Op[attrs](%inputs)`` and
        the module the node came from."""
        return format_graph(self.model, max_nodes=max_nodes)

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an ``onnx.ModelProto`` (initializers included)."""
        if self._proto is None:
            self._require_weights("build the ModelProto")
            self._proto = ir.serde.serialize_model(self.model)
        return self._proto

    @property
    def initializers(self) -> dict[str, torch.Tensor]:
        """The initializers by name, as torch tensors (no copy for tensors that came from the
        model; meta tensors for weights that were never materialised)."""
        return {
            name: _as_torch(value.const_value)
            for name, value in self.model.graph.initializers.items()
            if value.const_value is not None
        }

    def _changed(self) -> None:
        self._proto = None
        self._session = None

    # -- weights ----------------------------------------------------------------------------

    def missing_weights(self) -> list[str]:
        """Initializers without data: weights on the meta device or fake tensors."""
        return [
            name
            for name, value in self.model.graph.initializers.items()
            if value.const_value is None or not _has_data(value.const_value)
        ]

    def _require_weights(self, action: str) -> None:
        missing = self.missing_weights()
        if missing:
            raise ValueError(
                f"cannot {action}: {len(missing)} initializer(s) hold no data (the model was "
                f"exported on the meta device or under fake tensors), e.g. {missing[:3]}. Fill "
                "them with program.apply_weights(state_dict or 'weights.safetensors') first."
            )

    def apply_weights(self, weights: Mapping[str, torch.Tensor] | str | os.PathLike, *, strict: bool = True) -> list[str]:
        """Give the initializers new data, matched by name (the parameter path).

        Args:
            weights: a state dict, or the path of a ``.safetensors`` file (read lazily, one
                tensor at a time when saving) or of a ``torch.save`` checkpoint.
            strict: raise when an initializer that holds no data is not in ``weights``.

        Returns:
            The names of the initializers that were replaced. Keys matching no initializer
            (tied or unused parameters, buffers folded away) are ignored.

        Raises:
            ValueError: a shape or dtype differs from the exported one, nothing matched, or
                (with ``strict``) weights the model needs are missing.
        """
        tensors = _weight_source(weights)
        applied = []
        for name, value in self.model.graph.initializers.items():
            if name not in tensors:
                continue
            new = tensors.get_tensor(name)
            old = value.const_value
            expected_shape = tuple(old.shape) if old is not None else None
            if expected_shape is not None and tuple(new.shape) != expected_shape:
                raise ValueError(f"weight {name!r} has shape {list(new.shape)}, the model expects {list(expected_shape)}")
            if old is not None and new.dtype != old.dtype:
                raise ValueError(f"weight {name!r} is {new.dtype.name}, the model expects {old.dtype.name}")
            value.const_value = new
            applied.append(name)
        if not applied:
            raise ValueError(
                f"none of the {len(tensors)} weights matches an initializer name (initializers "
                f"are named by parameter path, e.g. {list(self.model.graph.initializers)[:3]})"
            )
        missing = self.missing_weights()
        if strict and missing:
            raise ValueError(f"weights for {len(missing)} initializer(s) are missing: {missing[:5]}")
        self._changed()
        return applied

    # -- passes -----------------------------------------------------------------------------

    def optimize(self) -> ONNXProgram:
        """Run dynexport's ONNX optimization passes on the model again (in place)."""
        from dynexport.passes.onnx import optimize_model

        optimize_model(self.model)
        self._changed()
        return self

    # -- files ------------------------------------------------------------------------------

    def save(
        self,
        destination: str | os.PathLike | IO[bytes],
        *,
        external_data: bool | str | None = None,
        include_initializers: bool = True,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Write the model to a path or a binary file object.

        Args:
            destination: a path (written through temporary files and renames: never a partial
                file) or a binary file object.
            external_data: store the initializers in a separate file next to the model: True
                (named ``<model file>.data``), a file name relative to the model's directory,
                False, or None to decide by size (above ``EXTERNAL_DATA_THRESHOLD`` bytes).
                Tensors are streamed to that file one at a time; tensors under
                ``EXTERNAL_DATA_MIN_TENSOR_BYTES`` stay in the model file.
            include_initializers: False leaves the initializers out of the file altogether.
            progress: called as ``progress(bytes_written, total_bytes)`` while writing weights.
        """
        initializers = list(self.model.graph.initializers.values()) if include_initializers else []
        if include_initializers:
            self._require_weights("save the weights")
        total = sum(_nbytes(v.const_value) for v in initializers)
        if external_data is None:
            external_data = total > EXTERNAL_DATA_THRESHOLD
        if not external_data:
            with self._initializers_left_out(not include_initializers):
                proto = ir.serde.serialize_model(self.model)
            write_atomically(proto.SerializeToString(), destination)
            if progress is not None:
                progress(total, total)
            return
        if not isinstance(destination, (str, os.PathLike)):
            raise ValueError("external_data needs a path to write the data file next to; got a file object")
        path = os.fspath(destination)
        location = external_data if isinstance(external_data, str) else os.path.basename(path) + ".data"
        if os.path.isabs(location) or os.path.normpath(location).startswith(".."):
            raise ValueError(f"external_data={location!r} must be a file name relative to the model's directory")
        directory = os.path.dirname(os.path.abspath(path))
        _check_directory(path)
        external = [v for v in initializers if _nbytes(v.const_value) >= EXTERNAL_DATA_MIN_TENSOR_BYTES]
        layout = _external_layout(external)
        with _temporary_file(directory) as (data_file, data_temp):
            _write_tensors(data_file, external, layout, progress, sum(length for _, length in layout))
            data_file.close()
            with self._external_references(external, layout, location, directory):
                proto = ir.serde.serialize_model(self.model)
            with _temporary_file(directory) as (model_file, model_temp):
                model_file.write(proto.SerializeToString())
                model_file.close()
                os.makedirs(os.path.dirname(os.path.join(directory, location)), exist_ok=True)
                os.replace(data_temp, os.path.join(directory, location))
                os.replace(model_temp, path)

    @contextlib.contextmanager
    def _initializers_left_out(self, leave_out: bool) -> Iterator[None]:
        if not leave_out:
            yield
            return
        graph = self.model.graph
        kept = list(graph.initializers.values())
        graph.initializers.clear()
        try:
            yield
        finally:
            for value in kept:
                graph.register_initializer(value)

    @contextlib.contextmanager
    def _external_references(self, values, layout, location, directory) -> Iterator[None]:
        """Point each initializer at its place in the data file for as long as it is serialized."""
        originals = [v.const_value for v in values]
        try:
            for value, (offset, length) in zip(values, layout):
                tensor = value.const_value
                value.const_value = ir.ExternalTensor(
                    location, offset, length, tensor.dtype, shape=tensor.shape, name=value.name, base_dir=directory
                )
            yield
        finally:
            for value, tensor in zip(values, originals):
                value.const_value = tensor

    # -- running ----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model in onnxruntime on torch inputs and return torch tensors.

        Arguments follow the same conventions as at export; Python numbers that were baked
        into the graph are ignored. The outputs have the model's own structure.
        """
        if self._session is None:
            self._session = _session(self.model_proto)
        feeds = self._feeds(args, kwargs)
        feeds.update({name: _numpy(value) for name, value in self.buffers.items()})
        if self._has_sequence_outputs:
            # An OrtValue holding a sequence does not hand its tensors over: numpy does.
            results = self._session.run(None, feeds)
            outputs = [[torch.from_numpy(a) for a in r] if isinstance(r, list) else torch.from_numpy(r) for r in results]
        else:
            results = self._session.run_with_ort_values(None, {name: _ort_value(a) for name, a in feeds.items()})
            outputs = ort_values_to_torch(results, [v.dtype for v in self.model.graph.outputs])
        if self.buffer_updates:
            by_name = dict(zip((v.name for v in self.model.graph.outputs), outputs))
            for buffer, output in self.buffer_updates.items():
                self.buffers[buffer] = by_name[output].clone()
        return self._structure(outputs)

    @functools.cached_property
    def _has_sequence_outputs(self) -> bool:
        return any(isinstance(value.type, ir.SequenceType) for value in self.model.graph.outputs)

    @functools.cached_property
    def buffer_updates(self) -> dict[str, str]:
        """``{buffer: output}``: the buffers a model exported with ``TrainingMode.TRAINING``
        updates (batch norm's running statistics), each also a graph input, and the outputs
        holding their new values."""
        return json.loads(self.model.metadata_props.get(BUFFER_UPDATES_KEY, "{}"))

    def verify(
        self,
        *args: Any,
        model: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        resized: Any = None,
        compare_intermediates: bool = False,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> VerificationReport:
        """Run PyTorch and onnxruntime on the same inputs and compare every output.

        See :func:`dynexport.verification.verify_program`; the report is also kept in
        ``self.verification``.
        """
        from dynexport.verification import verify_program

        self.verification = verify_program(
            self, args, kwargs, model=model, resized=resized,
            compare_intermediates=compare_intermediates, rtol=rtol, atol=atol,
        )
        return self.verification

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


# -- running helpers ----------------------------------------------------------------------------


def _session(proto: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_values_to_torch(results: list[Any], dtypes: list[ir.DataType]) -> list[torch.Tensor]:
    """onnxruntime OrtValues as torch tensors of ``dtypes``, without copies.

    DLPack hands every dtype over (numpy has no bfloat16); bool arrives as uint8 and is viewed
    back."""
    tensors = [torch.from_dlpack(r) for r in results]
    wanted = [to_torch_dtype(d) for d in dtypes]
    return [t.view(d) if t.dtype != d else t for t, d in zip(tensors, wanted)]


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


# -- weights ------------------------------------------------------------------------------------


def _has_data(tensor: ir.TensorProtocol) -> bool:
    if isinstance(tensor, TorchTensor):
        raw = tensor.raw
        return not (raw.is_meta or isinstance(raw, torch._subclasses.fake_tensor.FakeTensor))
    return True


def _as_torch(tensor: ir.TensorProtocol) -> torch.Tensor:
    if isinstance(tensor, TorchTensor):
        return tensor.raw
    array = tensor.numpy()
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view("uint16")).view(torch.bfloat16)
    return torch.from_numpy(array)


def _nbytes(tensor: ir.TensorProtocol | None) -> int:
    return 0 if tensor is None else int(tensor.nbytes)


class _WeightSource:
    """Weights by name from a state dict or a file; safetensors files are read lazily."""

    def __init__(self, names, get: Callable[[str], ir.TensorProtocol]):
        self._names = set(names)
        self.get_tensor = get

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __len__(self) -> int:
        return len(self._names)


def _weight_source(weights: Any) -> _WeightSource:
    if isinstance(weights, Mapping):
        def from_dict(name):
            tensor = weights[name]
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, not a tensor")
            return TorchTensor(tensor.detach(), name=name)

        return _WeightSource(weights.keys(), from_dict)
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(f"weights must be a state dict or a file path, got {type(weights).__name__}")
    path = os.fspath(weights)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file {path!r} does not exist")
    if path.endswith(".safetensors"):
        try:
            from safetensors import safe_open
        except ImportError:
            raise ImportError("reading .safetensors files needs the safetensors package (pip install safetensors)") from None
        with safe_open(path, framework="pt") as file:
            names = list(file.keys())
            headers = {n: file.get_slice(n) for n in names}
            meta = {n: (headers[n].get_dtype(), headers[n].get_shape()) for n in names}

        def lazy(name):
            def load():
                with safe_open(path, framework="pt") as file:
                    return TorchTensor(file.get_tensor(name), name=name)

            dtype_name, shape = meta[name]
            return ir.LazyTensor(load, dtype=_SAFETENSORS_DTYPES[dtype_name], shape=ir.Shape(shape), name=name)

        return _WeightSource(names, lazy)
    state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    if not isinstance(state, Mapping):
        raise TypeError(f"{path!r} holds a {type(state).__name__}, not a state dict")
    return _weight_source(state)


_SAFETENSORS_DTYPES = {
    "F64": ir.DataType.DOUBLE, "F32": ir.DataType.FLOAT, "F16": ir.DataType.FLOAT16,
    "BF16": ir.DataType.BFLOAT16, "I64": ir.DataType.INT64, "I32": ir.DataType.INT32,
    "I16": ir.DataType.INT16, "I8": ir.DataType.INT8, "U8": ir.DataType.UINT8, "BOOL": ir.DataType.BOOL,
}


# -- files --------------------------------------------------------------------------------------


def _external_layout(values: list[ir.Value]) -> list[tuple[int, int]]:
    """(offset, length) of each initializer in the external data file."""
    layout, offset = [], 0
    for value in values:
        length = _nbytes(value.const_value)
        if length >= _ALIGN_THRESHOLD and offset % _ALIGNMENT:
            offset += _ALIGNMENT - offset % _ALIGNMENT
        layout.append((offset, length))
        offset += length
    return layout


# Bytes of a strided tensor made contiguous at a time while saving.
_CHUNK_BYTES = 16 << 20


def _write_tensors(file, values, layout, progress: ProgressCallback | None, total: int) -> None:
    """Stream each initializer's bytes to ``file`` at its offset: one tensor in flight at a
    time, tensors that came from torch written from their own memory, and the next piece of a
    strided tensor made contiguous in a worker thread while the current one is written."""
    written = 0
    for offset, chunk, finished in _prefetched(_pieces(values, layout)):
        if file.tell() < offset:
            file.write(b"\0" * (offset - file.tell()))
        file.write(chunk)
        if finished is not None:
            written += finished
            if progress is not None:
                progress(written, total)


def _pieces(values, layout) -> Iterator[tuple[int, Any, int | None]]:
    """(offset where the tensor starts, bytes, the tensor's length on its last piece else None)."""
    # Reusable blocks for strided pieces: at most three are alive at once (one being written,
    # one held back to learn whether it is a tensor's last, one being filled). Allocating a
    # fresh block per piece would make the allocator's high-water mark climb.
    ring = itertools.cycle([torch.empty(_CHUNK_BYTES, dtype=torch.uint8) for _ in range(3)])
    for value, (offset, length) in zip(values, layout):
        chunks = _tensor_chunks(value.const_value, ring.__next__)
        chunk = next(chunks)
        for following in chunks:
            yield offset, chunk, None
            chunk = following
        yield offset, chunk, length


_END = object()


def _prefetched(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, each computed in a worker thread while the caller handles the previous one."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(next, items, _END)
        while (item := future.result()) is not _END:
            future = pool.submit(next, items, _END)
            yield item


def _tensor_chunks(tensor: ir.TensorProtocol, block: Callable[[], torch.Tensor]) -> Iterator[Any]:
    """A tensor's bytes in C order, in pieces: a contiguous torch tensor straight from its own
    memory, a strided one (a folded transpose) a block of rows at a time, copied into the
    ``_CHUNK_BYTES`` buffer ``block()`` returns, so that no second full copy of a weight is
    ever held."""
    if isinstance(tensor, ir.LazyTensor):
        tensor = tensor.raw()  # the thunk: one tensor read at a time, not cached
    if isinstance(tensor, TorchTensor):
        raw = tensor.raw.detach()
        if raw.device.type == "cpu" and raw.dtype not in (torch.complex64, torch.complex128):
            if raw.is_contiguous() or raw.dim() == 0:
                yield memoryview(raw.contiguous().reshape(-1).view(torch.uint8).numpy())
                return
            row_bytes = max(1, raw[0].numel() * raw.element_size())
            for rows in raw.split(max(1, _CHUNK_BYTES // row_bytes)):
                size = rows.numel() * rows.element_size()
                if size > _CHUNK_BYTES:  # a single row larger than the buffer
                    yield memoryview(rows.contiguous().reshape(-1).view(torch.uint8).numpy())
                    continue
                out = block()[:size].view(rows.dtype).view(rows.shape)
                out.copy_(rows)
                yield memoryview(out.reshape(-1).view(torch.uint8).numpy())
            return
    yield tensor.tobytes()


def _check_directory(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path!r}: directory {directory!r} does not exist")


@contextlib.contextmanager
def _temporary_file(directory: str) -> Iterator[tuple[IO[bytes], str]]:
    """A temporary file in ``directory``, removed unless it was renamed away."""
    fd, temp = tempfile.mkstemp(prefix=".dynexport-", suffix=".tmp", dir=directory)
    file = os.fdopen(fd, "wb")
    try:
        yield file, temp
    finally:
        file.close()
        if os.path.exists(temp):
            os.unlink(temp)


def write_atomically(data: bytes, destination: str | os.PathLike | IO[bytes]) -> None:
    """Write ``data`` to a path through a temporary file and a rename (never a partial file), or
    to a binary file object."""
    if isinstance(destination, (str, os.PathLike)):
        path = os.fspath(destination)
        _check_directory(path)
        with _temporary_file(os.path.dirname(os.path.abspath(path))) as (file, temp):
            file.write(data)
            file.close()
            os.replace(temp, path)
        return
    if isinstance(destination, io.TextIOBase) or not hasattr(destination, "write"):
        raise TypeError(
            f"f must be a path or a binary file object, got {type(destination).__name__}"
        )
    destination.write(data)


# -- text ---------------------------------------------------------------------------------------


def _describe(value: ir.Value) -> str:
    dtype = value.dtype.name.lower() if value.dtype is not None else "?"
    shape = "[" + ",".join(str(d) for d in value.shape) + "]" if value.shape is not None else "?"
    return f"{value.name}: {dtype}{shape}"


def _type_text(value: ir.Value | None) -> str:
    if value is None:
        return "None"
    dtype = value.dtype.name.lower() if value.dtype is not None else "?"
    if value.shape is None:
        return dtype
    return f"{dtype}[{', '.join(str(d) for d in value.shape)}]"


def _attribute_text(attr: ir.Attr) -> str:
    value = attr.value
    if isinstance(value, ir.TensorProtocol):
        if value.size <= 8:
            numbers = value.numpy().reshape(-1).tolist()
            return "{" + ", ".join(str(n) for n in numbers) + "}"
        return f"<{value.dtype.name.lower()}[{', '.join(str(d) for d in value.shape)}]>"
    if isinstance(value, ir.Graph):
        return f"<graph {value.name}>"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, ir.DataType):
        return value.name.lower()
    return repr(value) if isinstance(value, str) else str(value)


def _node_text(node: ir.Node) -> str:
    outputs = ", ".join(f"%{o.name} : {_type_text(o)}" for o in node.outputs)
    domain = f"{node.domain}::" if node.domain else ""
    attrs = ", ".join(f"{name}={_attribute_text(a)}" for name, a in node.attributes.items())
    inputs = ", ".join("%" + v.name if v is not None else "None" for v in node.inputs)
    line = f"  {outputs} = {domain}{node.op_type}{f'[{attrs}]' if attrs else ''}({inputs})"
    props = node.metadata_props
    module = props.get("pkg.dynexport.module")
    if module is not None and not module.startswith("_empty_nn_module_stack"):
        cls = props.get("pkg.dynexport.module_class", "").rsplit(".", 1)[-1]
        line += f", scope: {module or '<root>'} ({cls})" if cls else f", scope: {module}"
    return line


def format_graph(model: ir.Model, *, max_nodes: int | None = None) -> str:
    """The text form of ``model``'s main graph (see :meth:`ONNXProgram.to_text`)."""
    graph = model.graph
    opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in model.opset_imports.items())
    lines = [f"graph {graph.name or 'main_graph'} (opset {opsets}) ("]
    lines += [f"  %{v.name} : {_type_text(v)}" for v in graph.inputs]
    initializers = [v for v in graph.initializers.values() if not v.is_graph_input()]
    if initializers:
        lines.append(") initializers (")
        lines += [f"  %{v.name} : {_type_text(v)}" for v in initializers]
    lines.append(") {")
    nodes = list(graph)
    shown = nodes if max_nodes is None else nodes[:max_nodes]
    lines += [_node_text(n) for n in shown]
    if len(shown) < len(nodes):
        lines.append(f"  # ... {len(nodes) - len(shown)} more nodes")
    lines.append("  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines)
