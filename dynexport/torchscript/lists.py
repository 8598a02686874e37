"""Lists of tensors whose length is only known at run time, as ONNX sequences.

torch.export traces Python lists away: a list must have a length known while tracing. A
TorchScript loop with a run-time trip count that appends to a list, or a split into a symbolic
number of chunks, has none. While torch.export traces such a model (see
:mod:`dynexport.torchscript.convert`), the list is a :class:`TensorSequence`: a *handle*, a 0-d tensor
that stands for the ONNX sequence in the FX graph and flows through ``while_loop`` like any
carried tensor, plus what its elements look like (dtype, and the dims every element shares),
which the Python side tracks because the handle's own metadata cannot.

The handle is produced and read only by the ``dynexport::sequence_*`` operators defined here;
``dynexport.ops.sequence`` translates each into its ONNX counterpart (``SequenceEmpty``,
``SequenceInsert``, ``SequenceAt``, ``SequenceLength``, ``ConcatFromSequence``,
``SplitToSequence``). They exist for export only: running one eagerly raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from dynexport.errors import TorchScriptConversionError

__all__ = ["TensorSequence", "append", "as_output", "concat", "length", "set_item", "split", "unbind"]


def _export_only(name: str) -> RuntimeError:
    return RuntimeError(
        f"dynexport::{name} stands for an ONNX sequence operator while a model is exported; it has "
        "no eager kernel. Run the original model, or the exported ONNX model, instead."
    )


def _handle() -> torch.Tensor:
    return torch.empty((), dtype=torch.int64)


@torch.library.custom_op("dynexport::sequence_empty", mutates_args=())
def sequence_empty() -> torch.Tensor:
    """An empty sequence (its element dtype is that of what is inserted later)."""
    raise _export_only("sequence_empty")


@torch.library.custom_op("dynexport::sequence_construct", mutates_args=())
def sequence_construct(tensors: list[torch.Tensor]) -> torch.Tensor:
    raise _export_only("sequence_construct")


@torch.library.custom_op("dynexport::sequence_insert", mutates_args=())
def sequence_insert(sequence: torch.Tensor, element: torch.Tensor) -> torch.Tensor:
    """``sequence`` with ``element`` appended."""
    raise _export_only("sequence_insert")


@torch.library.custom_op("dynexport::sequence_set", mutates_args=())
def sequence_set(sequence: torch.Tensor, position: int, element: torch.Tensor) -> torch.Tensor:
    """``sequence`` with its element at ``position`` (not negative) replaced by ``element``."""
    raise _export_only("sequence_set")


@torch.library.custom_op("dynexport::sequence_at", mutates_args=())
def sequence_at(sequence: torch.Tensor, index: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """Element ``index`` (negative counts from the end); ``dtype`` and ``shape`` say what it
    looks like, -1 for a dim that differs between elements."""
    raise _export_only("sequence_at")


@torch.library.custom_op("dynexport::sequence_length", mutates_args=())
def sequence_length(sequence: torch.Tensor) -> torch.Tensor:
    """The number of elements, a 0-d int64 tensor."""
    raise _export_only("sequence_length")


@torch.library.custom_op("dynexport::sequence_concat", mutates_args=())
def sequence_concat(
    sequence: torch.Tensor, dim: int, new_axis: bool, dtype: torch.dtype, shape: list[int]
) -> torch.Tensor:
    """``torch.stack`` (``new_axis``) or ``torch.cat`` of the elements along ``dim`` (not
    negative); ``dtype`` and ``shape`` describe an element as for ``sequence_at``."""
    raise _export_only("sequence_concat")


@torch.library.custom_op("dynexport::sequence_split", mutates_args=())
def sequence_split(self: torch.Tensor, split_size: int, dim: int, keepdim: bool) -> torch.Tensor:
    """``self`` cut along ``dim`` into pieces of ``split_size`` (the last may be shorter);
    ``keepdim=False`` with ``split_size=1`` is ``unbind``."""
    raise _export_only("sequence_split")


for _op in (sequence_empty, sequence_insert, sequence_set, sequence_length, sequence_split):
    _op.register_fake(lambda *args: _handle())
sequence_construct.register_fake(lambda tensors: _handle())


def _sized(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A fake tensor of ``shape``, with a fresh unbacked size for each -1."""
    context = torch.library.get_ctx()
    return torch.empty([context.new_dynamic_size() if isinstance(size, int) and size == -1 else size for size in shape], dtype=dtype)


@sequence_at.register_fake
def _(sequence, index, dtype, shape):
    return _sized(shape, dtype)


@sequence_concat.register_fake
def _(sequence, dim, new_axis, dtype, shape):
    shape = list(shape)
    if new_axis:
        shape.insert(dim, -1)
    else:
        shape[dim] = -1
    return _sized(shape, dtype)


@dataclasses.dataclass(frozen=True)
class Element:
    """What every element of a sequence looks like: its dtype and, per dim, the size all
    elements share (None where they differ). ``shape`` is None when the ranks differ."""

    dtype: torch.dtype
    shape: tuple[int | torch.SymInt | None, ...] | None

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Element:
        return cls(tensor.dtype, tuple(tensor.shape))

    def join(self, other: Element | None, source: str | None) -> Element:
        """What both this and ``other``'s elements look like."""
        if other is None:
            return self
        if other.dtype != self.dtype:
            raise TorchScriptConversionError(
                "aten::append",
                source,
                f"a list whose length is only known at run time holds {self.dtype} and {other.dtype} "
                "tensors; it becomes an ONNX sequence, whose elements share one dtype",
                "cast the tensors to one dtype before appending them",
            )
        if self.shape is None or other.shape is None or len(self.shape) != len(other.shape):
            return Element(self.dtype, None)
        return Element(self.dtype, tuple(a if _same_size(a, b) else None for a, b in zip(self.shape, other.shape)))

    def outside_loop(self) -> Element:
        """This description for use after the loop that built it: sizes computed inside the
        loop's body (its unbacked symbols) mean nothing outside."""
        if self.shape is None:
            return self
        return Element(self.dtype, tuple(None if _body_local(size) else size for size in self.shape))

    def shape_argument(self, what: str, source: str | None) -> list[int | torch.SymInt]:
        if self.shape is None:
            raise TorchScriptConversionError(
                what,
                source,
                "the list, whose length is only known at run time, holds tensors of different ranks",
                "append tensors of one rank, or stack/cat them as they are made",
            )
        return [-1 if size is None else size for size in self.shape]


def _same_size(a: int | torch.SymInt | None, b: int | torch.SymInt | None) -> bool:
    if a is None or b is None:
        return False
    return bool(statically_known_true(a == b))


def _body_local(size: int | torch.SymInt | None) -> bool:
    return isinstance(size, torch.SymInt) and bool(free_unbacked_symbols(size))


class TensorSequence:
    """A list of tensors whose length is only known at run time, while torch.export traces.

    Supports what TorchScript does with lists: ``seq + [tensor]`` (``append``), ``seq[i]``;
    :func:`length`, :func:`concat` stand for ``len``, ``torch.stack`` and ``torch.cat``.
    """

    def __init__(self, handle: torch.Tensor, element: Element | None, source: str | None = None):
        self.handle = handle
        self.element = element
        self.source = source
        self.was_read = False  # an element read: the loop building it must not change its shape

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor], source: str | None) -> TensorSequence:
        """The sequence of a Python list's tensors."""
        if not tensors:
            return cls(sequence_empty(), None, source)
        element = None
        for tensor in tensors:
            element = Element.of(tensor).join(element, source)
        return cls(sequence_construct(list(tensors)), element, source)

    def with_handle(self, handle: torch.Tensor, element: Element | None) -> TensorSequence:
        return TensorSequence(handle, element, self.source)

    def __add__(self, tensors: Any) -> TensorSequence:
        if not isinstance(tensors, list):
            raise TorchScriptConversionError(
                "aten::add",
                self.source,
                "concatenating two lists when one's length is only known at run time",
                "append the elements one by one",
            )
        sequence = self
        for tensor in tensors:
            sequence = sequence.append(tensor, self.source)
        return sequence

    def __radd__(self, tensors: Any) -> TensorSequence:
        raise TorchScriptConversionError(
            "aten::add",
            self.source,
            "prepending a list to a list whose length is only known at run time",
            "build the list in order, appending its elements one by one",
        )

    def append(self, tensor: torch.Tensor, source: str | None) -> TensorSequence:
        """This sequence with ``tensor`` inserted at its end; ``source`` is the ``append``'s line."""
        element = Element.of(tensor).join(self.element, source)
        return self.with_handle(sequence_insert(self.handle, tensor), element)

    def set_item(self, index: int | torch.SymInt, tensor: torch.Tensor, source: str | None) -> TensorSequence:
        """This sequence with ``tensor`` at ``index`` (negative counts from the end)."""
        element = Element.of(tensor).join(self.element, source)
        if index < 0:  # ONNX counts a negative insert position from the end of the shortened sequence
            index = index + length(self)
        return self.with_handle(sequence_set(self.handle, index, tensor), element)

    def __getitem__(self, index: Any) -> torch.Tensor:
        if not isinstance(index, (int, torch.SymInt)):
            raise TorchScriptConversionError(
                "aten::__getitem__",
                self.source,
                f"indexing a list whose length is only known at run time with {type(index).__name__}",
                "index it with an int",
            )
        element = self._known_element("aten::__getitem__")
        return sequence_at(self.handle, index, element.dtype, element.shape_argument("aten::__getitem__", self.source))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # torch's converter returns a subgraph's unchanged inputs through torch.clone.
        if func is torch.clone and len(args) == 1 and not kwargs:
            return args[0].with_handle(args[0].handle.clone(), args[0].element)
        return NotImplemented

    def __iter__(self):
        raise TorchScriptConversionError(
            "prim::ListUnpack",
            self.source,
            "unpacking a list whose length is only known at run time",
            "index it, or loop over range(len(list))",
        )

    def _known_element(self, what: str) -> Element:
        self.was_read = True
        if self.element is None:
            raise TorchScriptConversionError(
                what,
                self.source,
                "the list is read before anything is appended to it, so the dtype and shape of its "
                "elements are unknown",
                "append to the list before reading it",
            )
        return self.element


def append(container: Any, element: torch.Tensor, source: str | None) -> Any:
    """TorchScript's ``list.append``: a new list, or a new sequence, with ``element`` at its end."""
    if isinstance(container, TensorSequence):
        return container.append(element, source)
    return container + [element]


def set_item(container: Any, index: int | torch.SymInt, element: torch.Tensor, source: str | None) -> Any:
    """TorchScript's ``list[index] = element``: a new list, or a new sequence, with ``element``
    at ``index``."""
    if isinstance(container, TensorSequence):
        return container.set_item(index, element, source)
    updated = list(container)
    updated[index] = element
    return updated


def as_output(value: Any) -> Any:
    """A model's output as torch.export takes it: a sequence as its handle."""
    return value.handle if isinstance(value, TensorSequence) else value


def length(container: Any) -> int | torch.SymInt:
    """``len``, for lists and sequences: a sequence's is an unbacked SymInt."""
    if isinstance(container, torch.Tensor):
        return container.shape[0]
    if not isinstance(container, TensorSequence):
        return len(container)
    size = sequence_length(container.handle).item()
    torch._check(size >= 0)
    return size


def concat(tensors: Any, dim: int, new_axis: bool) -> torch.Tensor:
    """``torch.stack`` (``new_axis``) or ``torch.cat``, for lists and sequences."""
    if not isinstance(tensors, TensorSequence):
        return torch.stack(tensors, dim) if new_axis else torch.cat(tensors, dim)
    what = "aten::stack" if new_axis else "aten::cat"
    element = tensors._known_element(what)
    shape = element.shape_argument(what, tensors.source)
    rank = len(shape) + (1 if new_axis else 0)
    if not -rank <= dim < rank:
        raise IndexError(f"{what.removeprefix('aten::')} dim {dim} out of range for tensors of rank {len(shape)}")
    return sequence_concat(tensors.handle, dim % rank, new_axis, element.dtype, shape)


def split(self: torch.Tensor, split_size: int | torch.SymInt, dim: int = 0, source: str | None = None) -> Any:
    """``torch.split`` by a size: a list when the number of pieces is known while tracing,
    otherwise a sequence."""
    size = self.shape[dim]
    if isinstance(size, int) and isinstance(split_size, int):
        return list(torch.split(self, split_size, dim))
    shape = list(self.shape)
    shape[dim] = None
    return TensorSequence(sequence_split(self, split_size, dim % self.dim(), True), Element(self.dtype, tuple(shape)), source)


def unbind(self: torch.Tensor, dim: int = 0, source: str | None = None) -> Any:
    """``torch.unbind``: a list when the size of ``dim`` is known while tracing, otherwise a
    sequence."""
    if isinstance(self.shape[dim], int):
        return list(torch.unbind(self, dim))
    shape = list(self.shape)
    del shape[dim]
    return TensorSequence(sequence_split(self, 1, dim % self.dim(), False), Element(self.dtype, tuple(shape)), source)
