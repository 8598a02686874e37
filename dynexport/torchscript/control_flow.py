"""TorchScript's ``prim::Loop`` and ``prim::If`` while torch.export traces a converted graph.

:mod:`dynexport.torchscript.convert` turns each into a call of :func:`run_loop` or :func:`run_if`, which
decide when the values are known: a trip count or condition known at export unrolls or picks a
branch; otherwise the loop becomes ``torch.while_loop`` and the branch ``torch.cond``, called as
operators with every value their bodies read from outside passed in. Lists the bodies append to
become ONNX sequences (:mod:`dynexport.torchscript.lists`) whose handles the loop carries or the branch
returns; tensors they write to in place (``x[i] = v``) are carried or returned the same way,
the new value replacing the old after the loop or branch.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.while_loop import while_loop_op

from dynexport.errors import TorchScriptConversionError
from dynexport.torchscript.lists import Element, TensorSequence

__all__ = ["block_output", "run_if", "run_loop"]

# Whether torch.cond or while_loop is tracing a branch or body now (their outputs may not alias
# their inputs).
_in_traced_body = contextvars.ContextVar("in_traced_body", default=False)


def block_output(value: Any) -> Any:
    """A value a TorchScript block returns, as its If or Loop gives it back: a copy within a
    torch.cond branch or while_loop body, whose outputs may not alias their inputs; the value
    itself in a branch picked at export or an unrolled loop, so that writes to it and views of it
    behave as in eager (`if ...: z = y`, then `z[0] = 1` writes to y)."""
    if not _in_traced_body.get() or isinstance(value, (int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value
    return torch.clone(value)  # a sequence clones its handle


@contextlib.contextmanager
def _body(traced: bool) -> Iterator[None]:
    """Running a block: as the body torch.cond or while_loop traces, or as itself (a branch
    picked at export, an unrolled loop's body), whose outputs need no copy even within a traced
    body: the traced body's own outputs are copied."""
    token = _in_traced_body.set(traced)
    try:
        yield
    finally:
        _in_traced_body.reset(token)


def run_loop(
    body: Callable[..., Any],
    trip_count: int | torch.SymInt | torch.Tensor,
    condition: bool | torch.Tensor | None,
    carried_count: int,
    updated: tuple[int, ...],
    source: str,
    refusal: str,
    *values: Any,
) -> list[Any]:
    """TorchScript's ``prim::Loop`` while torch.export traces it: ``body(*captured, i, *carried)``
    returns ``(condition, *carried, *updated values)``, ``updated`` being the positions among
    the captured values of the lists the body appends to and the tensors it writes to; the
    loop runs while ``i < trip_count`` and the condition (None: a counted loop) holds. Returns
    the carried values, then the updated ones. ``refusal`` (if not empty) says why the loop
    cannot become a while_loop, whose body writes to copies of those tensors."""
    carried, captured = list(values[:carried_count]), list(values[carried_count:])
    if isinstance(trip_count, int) and (condition is None or isinstance(condition, (bool, int))):
        return _unrolled(body, trip_count, condition is None or bool(condition), carried, captured, updated, source)
    if refusal:
        raise TorchScriptConversionError(
            "prim::Loop", source or None, f"its trip count is only known at run time: {refusal}", _COPY_HINT
        )
    return _while_loop(body, trip_count, condition, carried, captured, updated, source)


def _unrolled(body, trip_count, condition, carried, captured, updated, source) -> list[Any]:
    iteration = 0
    while iteration < trip_count and condition:
        with _body(traced=False):
            outputs = _as_list(body(*captured, iteration, *carried))
        condition, carried = outputs[0], outputs[1 : 1 + len(carried)]
        for position, value in zip(updated, outputs[1 + len(carried) :]):
            captured[position] = value
        if isinstance(condition, torch.Tensor):
            raise TorchScriptConversionError(
                "prim::Loop",
                source or None,
                "the loop runs a trip count known at export, but its condition (a `while` "
                "test or a `break`) depends on tensor values",
                "compute the condition from Python ints, or give the loop a tensor trip count",
            )
        iteration += 1
    return [*carried, *(captured[position] for position in updated)]


def _while_loop(body, trip_count, condition, carried, captured, updated, source) -> list[Any]:
    unsupported = [
        _kind(value)
        for value in carried
        if not isinstance(value, (torch.Tensor, list, TensorSequence)) and _scalar_dtype(value) is None
    ]
    if unsupported:
        raise TorchScriptConversionError(
            "prim::Loop",
            source or None,
            f"the loop's trip count is only known at run time and it carries {', '.join(sorted(set(unsupported)))} "
            "values; an ONNX Loop carries tensors, numbers and (as ONNX sequences) lists of tensors",
            "carry tensors instead, or make the trip count a Python int known at export",
        )
    if isinstance(trip_count, torch.Tensor):
        bound = trip_count.to(torch.int64)  # int(t) truncates a float t
    else:
        bound = torch.scalar_tensor(trip_count, dtype=torch.int64)
    counted = condition is None
    # The loop's state is its own carried values, then the values the body updates: the lists
    # it appends to, carried as ONNX sequences, and the tensors it writes to.
    state = [_as_sequence(value, source) for value in carried] + [
        _as_sequence(captured[position], source) for position in updated
    ]
    loop_state = _LoopState(state)
    # What the loop updates, it carries; while_loop's inputs may not alias its carried values.
    outside = [None if position in updated else value for position, value in enumerate(captured)]
    invariant, rebuild_invariant = _lifted([outside, loop_state.entry_elements])
    first = 1 if counted else 2  # the iteration, then the condition of a `while`

    # while_loop's functions see only their arguments: what they read from outside comes last.
    def run_condition(iteration, *values):
        test = iteration < values[-1]
        return test if counted else torch.logical_and(test, values[0])

    def run_body(iteration, *values):
        # The body may mutate what it is given (`x += 1`); while_loop's inputs must stay intact.
        carried_values = [value.clone() for value in values[first - 1 : first - 1 + len(state)]]
        inputs, entry_elements = rebuild_invariant(values[first - 1 + len(state) : -1])
        current = loop_state.entering(carried_values, entry_elements)
        for position, value in zip(updated, current[len(carried) :]):
            inputs[position] = value
        with _body(traced=True):
            outputs = _as_list(body(*inputs, iteration.item(), *current[: len(carried)]))
        next_state = loop_state.leaving(outputs[1:], source)
        test = () if counted else (_as_bool(outputs[0]),)
        return (iteration + 1, *test, *next_state)

    start = torch.zeros((), dtype=torch.int64)
    test = () if counted else (_as_bool(condition),)
    final = while_loop_op(run_condition, run_body, (start, *test, *loop_state.carried(state)), (*invariant, bound))
    return loop_state.after(list(final[first:]), source)


def _lifted(outside: Any) -> tuple[list[torch.Tensor | torch.SymInt], Callable[[Sequence[Any]], Any]]:
    """What a loop body or a branch reads from outside (``outside``: values, sequences and
    element descriptions, nested in lists) as inputs of while_loop or cond, and how to rebuild
    it from them inside: tensors, sequences' handles, SymInts such as ``int(t)`` as 0-d
    tensors, and the symbols of the enclosing graph among elements' sizes (a dynamic dim) as
    SymInts: a subgraph's tracer knows only the tensors and symbols it is given."""
    leaves, spec = pytree.tree_flatten(outside, is_leaf=lambda value: isinstance(value, (TensorSequence, Element)))
    inputs: list[torch.Tensor | torch.SymInt] = []

    def position(value: torch.Tensor | torch.SymInt) -> int:
        # Each input once: while_loop's and cond's inputs may not alias.
        for index, known in enumerate(inputs):
            if known is value:
                return index
        inputs.append(value)
        return len(inputs) - 1

    positions = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (torch.Tensor, TensorSequence)):
            positions[i] = position(leaf.handle if isinstance(leaf, TensorSequence) else leaf)
        elif type(leaf) in _SYMBOLIC_DTYPES:
            positions[i] = position(_scalar_tensor(leaf, _SYMBOLIC_DTYPES[type(leaf)]))
    sizes = {}
    for i, leaf in enumerate(leaves):
        element = leaf.element if isinstance(leaf, TensorSequence) else leaf
        if isinstance(element, Element) and element.shape is not None:
            sizes[i] = [position(size) if isinstance(size, torch.SymInt) else None for size in element.shape]

    def rebuild(values: Sequence[Any]) -> Any:
        rebuilt = list(leaves)
        for i, leaf in enumerate(leaves):
            element = leaf.element if isinstance(leaf, TensorSequence) else leaf
            if i in sizes:
                shape = [size if at is None else values[at] for size, at in zip(element.shape, sizes[i])]
                element = Element(element.dtype, tuple(shape))
            if isinstance(leaf, TensorSequence):
                rebuilt[i] = leaf.with_handle(values[positions[i]], element)
            elif isinstance(leaf, Element):
                rebuilt[i] = element
            elif i in positions:
                value = values[positions[i]]
                rebuilt[i] = value if isinstance(leaf, torch.Tensor) else value.item()
        return pytree.tree_unflatten(rebuilt, spec)

    return inputs, rebuild


def run_if(
    predicate: bool | torch.SymBool | torch.Tensor,
    true_branch: Callable[..., Any],
    false_branch: Callable[..., Any],
    updated: tuple[int, ...],
    scalar_outputs: tuple[torch.dtype | None, ...],
    source: str,
    refusal: str,
    *arguments: Any,
) -> list[Any]:
    """TorchScript's ``prim::If`` while torch.export traces it: each branch returns the If's
    outputs, then the lists it appended to and the tensors it wrote to (``updated``: their
    positions among ``arguments``). A predicate known at export picks its branch, which writes
    to the tensors themselves. Otherwise the If becomes ``torch.cond`` (``refusal``, if not
    empty, says why it cannot): the lists become ONNX sequences (their lengths now depend on
    data) and cond carries their handles, each branch writes to its own copy of the tensors
    (cond's operands must stay intact) and returns it, and outputs that TorchScript types as
    bool/int/float (``scalar_outputs``: their dtypes) cross it as 0-d tensors: a branch may
    compute one from a tensor and the other give a constant (``while i < n and bool(t[i])``)."""
    if isinstance(predicate, (bool, int)):
        with _body(traced=False):
            return _as_list((true_branch if predicate else false_branch)(*arguments))
    if refusal:
        raise TorchScriptConversionError(
            "prim::If", source or None, f"its condition depends on tensor values: {refusal}", _COPY_HINT
        )
    arguments = list(arguments)
    for position in updated:
        arguments[position] = _as_sequence(arguments[position], source)
    operands, rebuild = _lifted(arguments)
    elements: dict[int, list[Element | None]] = {}

    def as_operand(index: int, value: Any) -> Any:
        if isinstance(value, TensorSequence):
            elements.setdefault(index, []).append(value.element)
            return value.handle
        dtype = scalar_outputs[index] if index < len(scalar_outputs) else None
        if dtype is not None:
            return _scalar_tensor(value, dtype)
        # cond merges its branches' results only if their layouts agree (a slice's offset).
        return value.clone(memory_format=torch.contiguous_format) if isinstance(value, torch.Tensor) else value

    def run(branch: Callable[..., Any]) -> Callable[..., tuple[Any, ...]]:
        def run_branch(*values):
            inputs = rebuild(values)
            for position in updated:
                if isinstance(inputs[position], torch.Tensor):
                    inputs[position] = inputs[position].clone()
            with _body(traced=True):
                outputs = _as_list(branch(*inputs))
            return tuple(as_operand(index, value) for index, value in enumerate(outputs))

        return run_branch

    results = list(cond_op(_as_bool(predicate), run(true_branch), run(false_branch), tuple(operands)))
    for index, dtype in enumerate(scalar_outputs):
        if dtype is not None:
            results[index] = results[index].item()
    for index, branch_elements in elements.items():
        results[index] = TensorSequence(results[index], _joined(branch_elements, source), source or None)
    return results


_COPY_HINT = (
    "torch.cond and while_loop write to copies: clone the tensor before the branch or loop "
    "(x = x.clone()) and take views of it after, or return new values instead of writing in place"
)


def _as_sequence(value: Any, source: str) -> Any:
    return TensorSequence.of(value, source or None) if isinstance(value, list) else value


class _LoopState:
    """What a while_loop carries for TorchScript's loop state: tensors as they are, lists as
    their sequences' handles, ints, floats and bools as 0-d tensors (while_loop's autograd form,
    used when parameters require grad, carries tensors only). Keeps what the sequences' elements
    look like, from before the loop and from what the body appends."""

    def __init__(self, state: list[Any]):
        self._entry = {i: value.element for i, value in enumerate(state) if isinstance(value, TensorSequence)}
        self._scalars = {i: dtype for i, value in enumerate(state) if (dtype := _scalar_dtype(value)) is not None}
        self._appended: dict[int, Element | None] = {}
        self._read: set[int] = set()
        self._inside: dict[int, TensorSequence] = {}

    def carried(self, state: list[Any]) -> list[torch.Tensor]:
        return [self._carried(i, value) for i, value in enumerate(state)]

    def _carried(self, i: int, value: Any) -> torch.Tensor:
        if isinstance(value, TensorSequence):
            return value.handle
        if i in self._scalars:
            return _scalar_tensor(value, self._scalars[i])
        return value

    @property
    def entry_elements(self) -> list[Element | None]:
        return list(self._entry.values())

    def entering(self, values: list[torch.Tensor], entry_elements: list[Element | None]) -> list[Any]:
        """The body's state; ``entry_elements`` are :attr:`entry_elements` as the body sees them
        (with the symbols it is given)."""
        values = [value.item() if i in self._scalars else value for i, value in enumerate(values)]
        for i, element in zip(self._entry, entry_elements):
            self._inside[i] = values[i] = TensorSequence(values[i], element)
        return values

    def leaving(self, outputs: list[Any], source: str) -> list[torch.Tensor]:
        for i in self._entry:
            value = _as_sequence(outputs[i], source)
            if not isinstance(value, TensorSequence):
                raise TorchScriptConversionError(
                    "prim::Loop", source or None, f"the loop replaces a list with a {_kind(value)}", "keep it a list of tensors"
                )
            self._appended[i] = value.element
            if self._inside[i].was_read:
                self._read.add(i)
            outputs[i] = value
        return self.carried(outputs)

    def after(self, values: list[torch.Tensor], source: str) -> list[Any]:
        values = [value.item() if i in self._scalars else value for i, value in enumerate(values)]
        for i, entry in self._entry.items():
            element = _joined([entry, self._appended.get(i)], source)
            if i in self._read and entry is not None and element != entry:
                raise TorchScriptConversionError(
                    "prim::Loop",
                    source or None,
                    "the loop reads a list whose elements' shapes it changes by appending",
                    "append tensors of the shape the list already holds",
                )
            values[i] = TensorSequence(values[i], element.outside_loop() if element is not None else None, source or None)
        return values


def _joined(elements: list[Element | None], source: str) -> Element | None:
    """What the elements of all these sequences look like (None: no sequence has any)."""
    known = [element for element in elements if element is not None]
    return functools.reduce(lambda a, b: a.join(b, source or None), known) if known else None


_SYMBOLIC_DTYPES = {torch.SymInt: torch.int64, torch.SymFloat: torch.float64, torch.SymBool: torch.bool}
_SCALAR_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, **_SYMBOLIC_DTYPES}


def _scalar_dtype(value: Any) -> torch.dtype | None:
    return _SCALAR_DTYPES.get(type(value))


def _scalar_tensor(value: Any, dtype: torch.dtype) -> torch.Tensor:
    """A number (Python or symbolic) or a one-element tensor as a 0-d tensor of ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype).reshape(())
    return torch.scalar_tensor(value, dtype=dtype)


def _as_bool(condition: bool | torch.SymBool | torch.Tensor) -> torch.Tensor:
    return _scalar_tensor(condition, torch.bool)


def _kind(value: Any) -> str:
    return "list" if isinstance(value, (list, tuple)) else type(value).__name__


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
