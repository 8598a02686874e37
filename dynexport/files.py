"""Files: weights read from state dicts and checkpoints, the model written to disk (the external
data file streamed tensor by tensor) and atomic writes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import itertools
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor

from dynexport import runtime

__all__ = [
    "check_destination",
    "data_location",
    "EXTERNAL_DATA_MIN_TENSOR_BYTES",
    "EXTERNAL_DATA_THRESHOLD",
    "ProgressCallback",
    "apply_weights",
    "as_torch",
    "has_data",
    "ORPHAN_AGE_SECONDS",
    "missing_weights",
    "remove_orphans",
    "require_weights",
    "save_model",
    "write_atomically",
]

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


# -- weights ------------------------------------------------------------------------------------


def missing_weights(model: ir.Model) -> list[str]:
    """The initializers without data: weights on the meta device or fake tensors."""
    return [
        name
        for name, value in model.graph.initializers.items()
        if value.const_value is None or not has_data(value.const_value)
    ]


def require_weights(model: ir.Model, action: str) -> None:
    """Raise ValueError saying that ``action`` needs the weights some initializers lack."""
    missing = missing_weights(model)
    if missing:
        raise ValueError(
            f"cannot {action}: {len(missing)} initializer(s) hold no data (the model was "
            f"exported on the meta device or under fake tensors), e.g. {missing[:3]}. Fill "
            "them with program.apply_weights(state_dict or 'weights.safetensors') first."
        )


def apply_weights(
    model: ir.Model, weights: Mapping[str, torch.Tensor] | str | os.PathLike, *, strict: bool = True
) -> list[str]:
    """Give ``model``'s initializers new data, matched by name; see
    :meth:`dynexport.ONNXProgram.apply_weights`. Every weight is checked before any is applied:
    on an error the model is unchanged."""
    tensors = _weight_source(weights)
    updates: dict[str, ir.TensorProtocol] = {}
    for name, value in model.graph.initializers.items():
        if name not in tensors:
            continue
        new = tensors.get_tensor(name)
        old = value.const_value
        if old is not None and tuple(new.shape) != tuple(old.shape):
            raise ValueError(f"weight {name!r} has shape {list(new.shape)}, the model expects {list(old.shape)}")
        if old is not None and new.dtype != old.dtype:
            raise ValueError(f"weight {name!r} is {new.dtype.name}, the model expects {old.dtype.name}")
        updates[name] = new
    if not updates:
        raise ValueError(
            f"none of the {len(tensors)} weights matches an initializer name (initializers "
            f"are named by parameter path, e.g. {list(model.graph.initializers)[:3]})"
        )
    missing = [
        name for name in missing_weights(model) if name not in updates
    ] + [name for name, tensor in updates.items() if not has_data(tensor)]
    if strict and missing:
        raise ValueError(f"weights for {len(missing)} initializer(s) are missing: {missing[:5]}")
    for name, tensor in updates.items():
        model.graph.initializers[name].const_value = tensor
    return list(updates)


def has_data(tensor: ir.TensorProtocol | torch.Tensor) -> bool:
    """Whether a tensor holds data (not a meta or fake torch tensor)."""
    if isinstance(tensor, TorchTensor):
        tensor = tensor.raw
    if isinstance(tensor, torch.Tensor):
        return not (tensor.is_meta or isinstance(tensor, torch._subclasses.fake_tensor.FakeTensor))
    return True


def as_torch(tensor: ir.TensorProtocol) -> torch.Tensor:
    """A torch tensor of ``tensor`` (itself when it came from torch)."""
    if isinstance(tensor, TorchTensor):
        return tensor.raw
    return runtime.from_numpy(tensor.numpy())


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


def save_model(
    model: ir.Model,
    destination: str | os.PathLike | IO[bytes],
    *,
    external_data: bool | str | None = None,
    include_initializers: bool = True,
    keep_initializers_as_inputs: bool = False,
    progress: ProgressCallback | None = None,
) -> None:
    """Write ``model`` to a path or a binary file object; see :meth:`dynexport.ONNXProgram.save`."""
    if keep_initializers_as_inputs:
        with _initializers_listed_as_inputs(model):
            save_model(model, destination, external_data=external_data, include_initializers=include_initializers, progress=progress)
        return
    initializers = list(model.graph.initializers.values()) if include_initializers else []
    if include_initializers:
        require_weights(model, "save the weights")
    total = sum(_nbytes(v.const_value) for v in initializers)
    if external_data is None:
        external_data = total > EXTERNAL_DATA_THRESHOLD
    if not external_data:
        with _initializers_left_out(model, not include_initializers):
            proto = ir.serde.serialize_model(model)
        if isinstance(destination, (str, os.PathLike)):
            check_destination(destination)
            replaced = _external_locations(os.fspath(destination))
            write_atomically(proto.SerializeToString(), destination)
            _remove_data_files(os.path.dirname(os.path.abspath(destination)), replaced)
        else:
            write_atomically(proto.SerializeToString(), destination)
        if progress is not None:
            progress(total, total)
        return
    if not isinstance(destination, (str, os.PathLike)):
        raise ValueError("external_data needs a path to write the data file next to; got a file object")
    path = os.fspath(destination)
    check_destination(path)
    directory = os.path.dirname(os.path.abspath(path))
    location = data_location(path, external_data)
    remove_orphans(directory)
    replaced = _external_locations(path)
    if os.path.lexists(os.path.join(directory, location)):
        # The file may be the data of the model being replaced (or of another model): the new
        # data goes to a fresh name, so that a save killed at any instant leaves the old pair or
        # the new one, never the old model with the new data.
        root, extension = os.path.splitext(location)
        location = f"{root}.{secrets.token_hex(4)}{extension}"
    data_path = os.path.join(directory, location)
    external = [v for v in initializers if _nbytes(v.const_value) >= EXTERNAL_DATA_MIN_TENSOR_BYTES]
    layout = _external_layout(external)
    with _temporary_file(directory, data_path) as (data_file, data_temp):
        _write_tensors(data_file, external, layout, progress, sum(length for _, length in layout))
        data_file.close()
        with _external_references(external, layout, location, directory):
            proto = ir.serde.serialize_model(model)
        with _temporary_file(directory, path) as (model_file, model_temp):
            model_file.write(proto.SerializeToString())
            model_file.close()
            os.makedirs(os.path.dirname(data_path), exist_ok=True)
            os.replace(data_temp, data_path)
            try:
                os.replace(model_temp, path)
            except BaseException:
                os.unlink(data_path)
                raise
    _remove_data_files(directory, replaced - {location})


def data_location(path: str, external_data: bool | str) -> str:
    """The data file's name relative to the model's directory, checked to lie inside it and to
    be no other file of the save."""
    location = external_data if isinstance(external_data, str) else os.path.basename(path) + ".data"
    directory = os.path.dirname(os.path.abspath(path))
    target = os.path.normpath(os.path.join(directory, location))
    if os.path.isabs(location) or not target.startswith(directory + os.sep):
        raise ValueError(
            f"external_data={location!r} must be a file name relative to the model's directory, inside it"
        )
    if target == os.path.abspath(path) or os.path.isdir(target):
        raise ValueError(
            f"external_data={location!r} names the model file itself or a directory; give the data file its own name"
        )
    return os.path.relpath(target, directory)


def _external_locations(path: str) -> set[str]:
    """The external data files the model now at ``path`` references (none when there is no
    model there, or no readable one)."""
    import onnx

    if not os.path.isfile(path) or os.path.getsize(path) > _MAX_REFERENCING_MODEL_BYTES:
        return set()
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception:  # not a model: it references nothing
        return set()
    return {
        entry.value
        for tensor in _all_tensors(proto.graph)
        for entry in tensor.external_data
        if entry.key == "location"
    }


# A model file that keeps its weights outside is small; a larger one is not read to find them.
_MAX_REFERENCING_MODEL_BYTES = 256 << 20


def _all_tensors(graph) -> Iterator[Any]:
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sub in [attribute.g, *attribute.graphs] if attribute.HasField("g") else attribute.graphs:
                yield from _all_tensors(sub)


def _remove_data_files(directory: str, locations: set[str]) -> None:
    """Remove the data files of a replaced model: regular files inside ``directory`` only."""
    for location in locations:
        target = os.path.normpath(os.path.join(directory, location))
        if target.startswith(directory + os.sep) and os.path.isfile(target) and not os.path.islink(target):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)


@contextlib.contextmanager
def _initializers_left_out(model: ir.Model, leave_out: bool) -> Iterator[None]:
    if not leave_out:
        yield
        return
    graph = model.graph
    kept = list(graph.initializers.values())
    graph.initializers.clear()
    try:
        yield
    finally:
        for value in kept:
            graph.register_initializer(value)


@contextlib.contextmanager
def _initializers_listed_as_inputs(model: ir.Model) -> Iterator[None]:
    """Within the block the graph lists as inputs too the initializers it does not list yet (a
    runtime may then be fed other weights)."""
    listed = set(model.graph.inputs)
    added = [value for value in model.graph.initializers.values() if value not in listed]
    model.graph.inputs.extend(added)
    try:
        yield
    finally:
        for value in added:
            model.graph.inputs.remove(value)


@contextlib.contextmanager
def _external_references(values, layout, location, directory) -> Iterator[None]:
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


def check_destination(destination: str | os.PathLike | IO[bytes]) -> None:
    """Raise, saying why, unless ``destination`` can be written: a path (not a directory) in an
    existing directory we may write to, or a binary file object open for writing."""
    if isinstance(destination, (str, os.PathLike)):
        path = os.fspath(destination)
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"cannot write {path!r}: directory {directory!r} does not exist")
        if os.path.isdir(path):
            raise IsADirectoryError(f"cannot write {path!r}: it is a directory; give a file name")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot write {path!r}: directory {directory!r} is not writable")
        return
    if isinstance(destination, io.TextIOBase) or not hasattr(destination, "write"):
        raise TypeError(f"f must be a path or a binary file object, got {type(destination).__name__}")
    if getattr(destination, "closed", False):
        raise ValueError(f"cannot write to f: the file object {getattr(destination, 'name', '')!r} is closed")
    if hasattr(destination, "writable") and not destination.writable():
        mode = getattr(destination, "mode", None)
        raise ValueError(
            f"cannot write to f: the file object {getattr(destination, 'name', '')!r} is not open for writing"
            + (f" (mode {mode!r}); open it with 'wb'" if mode else "")
        )


# Our temporary files: ``.dynexport-<token>.tmp`` next to the file being written. One older than
# ORPHAN_AGE_SECONDS was left by a save that was killed, and the next save to its folder removes it.
_TEMPORARY_NAME = re.compile(r"\.dynexport-[A-Za-z0-9_]+\.tmp")
ORPHAN_AGE_SECONDS = 3600


@contextlib.contextmanager
def _temporary_file(directory: str, target: str) -> Iterator[tuple[IO[bytes], str]]:
    """A temporary file in ``directory`` with the mode ``target`` will have: the mode of the file
    it replaces, else what the umask gives a new file (as ``open(target, "wb")``). Removed unless
    it was renamed away."""
    while True:
        temp = os.path.join(directory, f".dynexport-{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    file = os.fdopen(fd, "wb")
    try:
        if os.path.exists(target):
            os.chmod(temp, stat.S_IMODE(os.stat(target).st_mode))
        yield file, temp
    finally:
        file.close()
        if os.path.exists(temp):
            os.unlink(temp)


def remove_orphans(directory: str) -> list[str]:
    """Remove the temporary files killed saves left in ``directory``: ours only (named
    ``.dynexport-*.tmp``, regular files) and older than ``ORPHAN_AGE_SECONDS`` (a younger one may
    belong to a save running now). Returns the names removed. Cleaning never fails a save: a
    folder that cannot be listed, or a file that cannot be removed, is left as it is."""
    removed = []
    cutoff = time.time() - ORPHAN_AGE_SECONDS
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if not _TEMPORARY_NAME.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed.append(entry.name)
    return removed


def write_atomically(data: bytes, destination: str | os.PathLike | IO[bytes]) -> None:
    """Write ``data`` to a path through a temporary file and a rename (never a partial file), or
    to a binary file object."""
    if isinstance(destination, (str, os.PathLike)):
        path = os.fspath(destination)
        check_destination(path)
        directory = os.path.dirname(os.path.abspath(path))
        remove_orphans(directory)
        with _temporary_file(directory, path) as (file, temp):
            file.write(data)
            file.close()
            os.replace(temp, path)
        return
    check_destination(destination)
    destination.write(data)
