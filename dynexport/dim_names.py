"""The names of the ONNX graph's dynamic dims, and which dims are dynamic.

The user asks for dims in three forms: ``Dim("name")`` in ``dynamic_shapes`` (:func:`named_dims`),
torch.onnx's ``dynamic_axes`` (:func:`dynamic_shapes_from_axes`), or ``dynamic_shapes="auto"``
with further example calls (:func:`dynamic_shapes_from_examples`); each gives the dim names asked
for, keyed by (flat input path, axis). Once captured, :func:`graph_dims` names torch's shape
symbols after them (a dim nobody named is ``<input>_dim_<axis>``) and names the output dims
``dynamic_axes`` gives for outputs.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim
from torch.export.dynamic_shapes import _DerivedDim, _DimHint, _DimHintType

from dynexport.call_convention import GraphIO, graph_input_specs, placeholders, user_input_specs
from dynexport.passes.onnx.naming import unique_name
from dynexport.signature import (
    as_call,
    bind_arguments,
    input_name_slots,
    leaf_name,
    no_graph_value,
    output_values,
)

__all__ = [
    "declared_dims",
    "declared_minimums",
    "derived_dims",
    "dynamic_dims_sized_0_or_1",
    "dynamic_shapes_from_axes",
    "dynamic_shapes_from_examples",
    "graph_dims",
    "hinted_axes",
    "hinted_minimums",
    "is_dynamic",
    "named_dims",
]


def graph_dims(
    program: torch.export.ExportedProgram,
    io: GraphIO,
    requested_dims: dict[tuple[str, int], str],
    dynamic_axes: Mapping[str, Any] | None,
    output_names: Sequence[str] | None,
) -> GraphIO:
    """``io`` with the dims of ``program`` named: every symbol that is an input dim after the
    name asked for it (``requested_dims``) or ``<input>_dim_<axis>``, and the output dims the
    entries of ``dynamic_axes`` for names in ``output_names`` name."""
    input_name = {spec.arg.name: name for spec, name in zip(user_input_specs(program), io.input_names)}
    nodes = placeholders(program)
    dim_names: dict[str, str] = {}
    for spec in graph_input_specs(program):
        node = nodes[spec.arg.name]
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for axis, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt) or not size.node.expr.is_symbol:
                continue
            symbol = str(size.node.expr)
            wanted = requested_dims.get((spec.arg.name, axis))
            if wanted is not None and symbol not in dim_names:
                # Dims torch did not unify must not share a name: ONNX would read them as equal.
                dim_names[symbol] = unique_name(wanted, set(dim_names.values()))
            else:
                dim_names.setdefault(symbol, f"{input_name[spec.arg.name]}_dim_{axis}")
    given = list(output_names or ())
    output_axes = {key: _axis_names(key, axes) for key, axes in (dynamic_axes or {}).items() if key in given}
    output_dims = _output_dim_names(dict(zip(io.output_names, output_values(program))), output_axes, dim_names)
    return dataclasses.replace(io, dim_names=dim_names, output_dims=output_dims)


def dynamic_shapes_from_axes(
    dynamic_axes: Mapping[str, Any],
    bound: dict[str, Any],
    slots: list[tuple[str, Any]],
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
) -> tuple[dict[str, Any], dict[tuple[str, int], str]]:
    """Convert torch.onnx's ``dynamic_axes`` into ``dynamic_shapes`` keyed by parameter name.

    A key is a name in ``input_names`` or ``output_names`` (whose axes :func:`graph_io` names),
    or an argument's own name (a slot of :func:`argument_slots`). Returns the dynamic_shapes and
    the input dim names asked for, keyed by (slot, axis).
    """
    named = input_name_slots(input_names, slots)
    slot_values = dict(slots)
    outputs = list(output_names or ())
    dynamic: dict[str, dict[int, Any]] = {}
    requested: dict[tuple[str, int], str] = {}
    sizes: list[tuple[str | None, int]] = []
    for key, axes in dynamic_axes.items():
        if key in named:
            slot, value = named[key]
        elif key in outputs:
            _axis_names(key, axes)
            continue
        elif key in slot_values:
            slot, value = key, slot_values[key]
        else:
            raise ValueError(
                f"dynamic_axes names {key!r}, which is neither an input nor an output. Inputs: "
                f"{list(dict.fromkeys([*named, *slot_values]))}; outputs: "
                + (f"{outputs}" if outputs else "none named (name outputs with output_names)")
            )
        axis_names = _axis_names(key, axes)
        if not isinstance(value, torch.Tensor):
            if key not in named:  # graph_input_names warned about a name in input_names
                warnings.warn(
                    f"dynamic_axes names the argument {key!r}, which {no_graph_value(value)}: it is "
                    "no graph input, and its axes are ignored",
                    stacklevel=3,
                )
            continue
        for axis, dim_name in axis_names.items():
            axis = _checked_axis(key, axis, value, "input")
            dynamic.setdefault(slot, {})[axis] = dim_name
            requested[(slot, axis)] = dim_name or f"{key}_dim_{axis}"
            sizes.append((dim_name, value.shape[axis]))
    shared = _shared_dims(sizes)
    dynamic = {slot: {axis: _dim_of_name(name, shared) for axis, name in axes.items()} for slot, axes in dynamic.items()}
    shapes: dict[str, Any] = {}
    for param, value in bound.items():
        leaves, spec = pytree.tree_flatten_with_path(value)
        leaf_specs = [dynamic.get(leaf_name(param, path)) for path, _ in leaves]
        shapes[param] = pytree.tree_unflatten(leaf_specs, spec) if any(leaf_specs) else None
    return shapes, requested


def _checked_axis(key: str, axis: int, tensor: torch.Tensor, kind: str) -> int:
    """``dynamic_axes[key]``'s ``axis`` of an input or output ``tensor``, counted from 0."""
    if not -tensor.dim() <= axis < tensor.dim():
        raise ValueError(f"dynamic_axes[{key!r}] names axis {axis}, but the {kind} has rank {tensor.dim()}")
    return axis % tensor.dim()


def _axis_names(key: str, axes: Any) -> dict[int, str | None]:
    if isinstance(axes, Mapping):
        return {int(axis): str(name) for axis, name in axes.items()}
    if isinstance(axes, (list, tuple)):
        return {int(axis): None for axis in axes}
    raise TypeError(f"dynamic_axes[{key!r}] must be a dict {{axis: name}} or a list of axes, got {axes!r}")


def _declared_dims(spec: Any, value: Any, path: str) -> Iterator[tuple[str, int, Any, torch.Tensor]]:
    """``(flat input path, axis, dim, input tensor)`` for every axis a dynamic_shapes spec, walked
    alongside the inputs, declares (as a ``Dim``, a hint such as ``Dim.AUTO``, or an int)."""
    if isinstance(value, torch.Tensor):
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ())
        for axis, dim in items:
            if dim is None:
                continue
            if not (isinstance(axis, int) and -value.dim() <= axis < value.dim()):
                raise ValueError(
                    f"dynamic_shapes names axis {axis!r} of input {path!r}, which has rank {value.dim()} "
                    f"(axes 0..{value.dim() - 1})"
                )
            yield path, int(axis), dim, value
        return
    if spec is None:
        return
    if isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
        for i, (v, s) in enumerate(zip(value, spec)):
            yield from _declared_dims(s, v, f"{path}_{i}")
    elif isinstance(value, Mapping) and isinstance(spec, Mapping):
        for k, v in value.items():
            yield from _declared_dims(spec.get(k), v, f"{path}_{k}")
    elif type(value) in pytree.SUPPORTED_NODES and isinstance(spec, (list, tuple)):  # a cache object
        children, _ = pytree.SUPPORTED_NODES[type(value)].flatten_with_keys_fn(value)
        for (key, v), s in zip(children, spec):
            yield from _declared_dims(s, v, f"{path}_{getattr(key, 'key', getattr(key, 'idx', key))}")


def declared_dims(dynamic_shapes: Any, bound: dict[str, Any]) -> Iterator[tuple[str, int, Any, torch.Tensor]]:
    """``(flat input path, axis, dim, input tensor)`` for every axis ``dynamic_shapes`` declares
    (a ``Dim``, a hint such as ``Dim.AUTO``, or an int), over the arguments ``bound``;
    ``dynamic_shapes`` is keyed by parameter (a ``*t`` parameter's entries as one tuple, as
    torch.export reads it) or positional."""
    if dynamic_shapes is None:
        return
    if isinstance(dynamic_shapes, Mapping):
        per_param = dict(dynamic_shapes)
        for name, specs in dynamic_shapes.items():
            if isinstance(specs, tuple) and f"{name}_0" in bound and name not in bound:
                per_param.update({f"{name}_{i}": spec for i, spec in enumerate(specs)})
    else:
        per_param = dict(zip(bound, dynamic_shapes))
    for name, value in bound.items():
        yield from _declared_dims(per_param.get(name), value, name)


def named_dims(dynamic_shapes: Any, bound: dict[str, Any]) -> dict[tuple[str, int], str]:
    """(flat input path, axis) -> dim name, for every ``Dim("name")`` in ``dynamic_shapes``."""
    return {
        (path, axis): dim.__name__
        for path, axis, dim, _ in declared_dims(dynamic_shapes, bound)
        if isinstance(dim, Dim) and getattr(dim, "__name__", None)
    }


def derived_dims(dynamic_shapes: Any, bound: dict[str, Any]) -> dict[tuple[str, int], str]:
    """(flat input path, axis) -> name (``16*_height``), for every derived ``Dim`` in
    ``dynamic_shapes``: where dim refinement made a hinted dim a multiple, its ONNX dim reads as
    that multiple of its root, as a refined named dim's does."""
    return {
        (path, axis): dim.__name__
        for path, axis, dim, _ in declared_dims(dynamic_shapes, bound)
        if isinstance(dim, _DerivedDim)
    }


def string_dims(dynamic_shapes: Any, bound: dict[str, Any]) -> tuple[Any, dict[tuple[str, int], str]]:
    """torch.onnx's dims given as strings (``{0: "batch"}``), taken as ``dynamic_axes`` names
    are (:func:`_shared_dims`): each names its ONNX dim. Returns the dynamic_shapes with ``Dim``
    objects and hints for the strings, and those names, keyed by (flat input path, axis).

    Raises:
        ValueError: an empty name.
    """
    names, sizes, user_dims = {}, [], {}
    for path, axis, dim, tensor in declared_dims(dynamic_shapes, bound):
        if isinstance(dim, str):
            if not dim.strip():
                raise ValueError(f"dynamic_shapes names axis {axis} of input {path!r} with an empty string; give it a name")
            names[(path, axis)] = dim
            sizes.append((dim, tensor.shape[axis]))
        elif isinstance(dim, Dim) and not isinstance(dim, _DerivedDim):
            user_dims.setdefault(dim.__name__, (dim, tensor.shape[axis]))
    if not names:
        return dynamic_shapes, names
    shared = _shared_dims(sizes)
    # a string that names one of the user's Dims, at its example size, is that Dim
    shared.update(
        {name: dim for name, (dim, size) in user_dims.items() if {s for n, s in sizes if n == name} == {size}}
    )
    return pytree.tree_map(lambda dim: _dim_of_name(dim, shared) if isinstance(dim, str) else dim, dynamic_shapes), names


def _shared_dims(sizes: Iterable[tuple[str | None, int]]) -> dict[str, Dim]:
    """One ``Dim`` for each name given to two or more input axes (``(name, example size)``
    pairs) of one example size: torch.onnx's names (``dynamic_axes``, strings in
    ``dynamic_shapes``) say that those axes are one size, as one ``dim_param`` does in ONNX, so
    the capture declares them equal (one symbol: leaner graphs, and model code may rely on it).
    A name given once, or to axes of unequal example sizes (a name reused loosely), stays a
    hint (``Dim.DYNAMIC``) for each axis, as torch.onnx takes it."""
    examples: dict[str, set[int]] = collections.defaultdict(set)
    counts = collections.Counter()
    for name, size in sizes:
        if name is not None:
            examples[name].add(size)
            counts[name] += 1
    return {name: Dim(_identifier(name)) for name, count in counts.items() if count > 1 and len(examples[name]) == 1}


def _dim_of_name(name: str | None, shared: Mapping[str, Dim]) -> Any:
    return shared.get(name, Dim.DYNAMIC) if name is not None else Dim.DYNAMIC


def _identifier(name: str) -> str:
    """``name`` as a Python identifier, as a ``Dim``'s name must be."""
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name.strip())
    return text if text.isidentifier() else f"_{text}"


def dynamic_dims_sized_0_or_1(dynamic_shapes: Any, bound: dict[str, Any]) -> bool:
    """Whether an axis declared dynamic (not an int, not ``Dim.STATIC``) has example size 0 or 1."""
    return any(
        tensor.shape[axis] in (0, 1) and is_dynamic(dim) for _, axis, dim, tensor in declared_dims(dynamic_shapes, bound)
    )


def hinted_axes(dynamic_shapes: Any) -> set[tuple[str, int]]:
    """``(argument, axis)`` of each axis that ``dynamic_shapes``, keyed by argument, declares
    dynamic by a hint (``Dim.DYNAMIC``, ``Dim.AUTO``: torch.onnx's ``dynamic_axes`` and names
    used once) on a tensor argument: the axes dim refinement can narrow."""
    if not isinstance(dynamic_shapes, dict):
        return set()
    return {
        (argument, axis)
        for argument, axes in dynamic_shapes.items()
        if isinstance(axes, dict)
        for axis, dim in axes.items()
        if isinstance(dim, _DimHint) and dim.type is not _DimHintType.STATIC
    }


def hinted_minimums(dynamic_shapes: Any) -> dict[tuple[str, int], int]:
    """``{(argument, axis): minimum}`` of each axis of :func:`hinted_axes`: the hint's ``min``
    (``Dim.DYNAMIC(min=11)``, as dim refinement narrows one), else 0."""
    return {
        (argument, axis): dynamic_shapes[argument][axis].min or 0 for argument, axis in hinted_axes(dynamic_shapes)
    }


def is_dynamic(dim: Any) -> bool:
    """Whether a dynamic_shapes entry declares its axis dynamic (not an int, not ``Dim.STATIC``)."""
    return not isinstance(dim, int) and dim is not Dim.STATIC


def _python_value_spec(name: str, value: Any, others: list[Any], hint: Any) -> Any:
    """The dynamic_shapes entry of a Python number or string the example calls pass: ``hint`` for
    an int that differs between them (a graph input, as torch.export makes it), None for one
    that does not. Another value that differs is refused: the graph would hold the export call's
    value and be wrong at the others."""
    primitive = (bool, int, float, complex, str)
    if not isinstance(value, primitive) or all(type(o) is type(value) and o == value for o in others):
        return None
    if type(value) is int and all(type(o) is int for o in others):
        return hint
    other = next(o for o in others if not (type(o) is type(value) and o == value))
    raise ValueError(
        f"{name!r} is {value!r} in the export call and {other!r} in another example call: only tensor "
        "sizes and ints may differ between the calls (the graph holds any other Python value as a "
        "constant); pass it as a tensor, or export once per value"
    )


def declared_minimums(dynamic_shapes: Any) -> dict[str, int]:
    """The minimum the user gave each ``Dim(name, min=...)`` in ``dynamic_shapes``, by name."""
    leaves = pytree.tree_leaves(dynamic_shapes, is_leaf=lambda leaf: isinstance(leaf, Dim))
    return {dim.__name__: int(dim.min) for dim in leaves if isinstance(dim, Dim) and dim.min > 0}


def _output_dim_names(
    outputs: dict[str, Any], output_axes: Mapping[str, Mapping[int, str | None]], dim_names: dict[str, str]
) -> dict[str, dict[int, str]]:
    """The names dynamic_axes gives output dims, by output and axis. A static dim keeps its size
    (warned); an unnamed (list form) dim keeps its input dim's name when it is one, else is named
    ``<output>_dim_<axis>``; a name already standing for another size is kept and warned about."""
    meaning = {name: symbol for symbol, name in dim_names.items()}
    result: dict[str, dict[int, str]] = {}
    for output, axes in output_axes.items():
        val = outputs[output]
        if val is None:  # graph_io warned that the output is None
            continue
        if not isinstance(val, torch.Tensor):
            warnings.warn(
                f"dynamic_axes names axes of the output {output!r}, which the model returns as the "
                f"constant {val!r:.40}: it has no axes to name",
                stacklevel=4,
            )
            continue
        for axis, dim_name in axes.items():
            axis = _checked_axis(output, axis, val, "output")
            size = val.shape[axis]
            if not isinstance(size, torch.SymInt) or size.node.expr.is_number:
                warnings.warn(
                    f"dynamic_axes makes dim {axis} of the output {output!r} dynamic"
                    + (f" ({dim_name!r})" if dim_name else "")
                    + f", but the model always gives it size {int(size)}: the ONNX output keeps that size",
                    stacklevel=4,
                )
                continue
            expression = str(size.node.expr)
            if dim_name is None:
                if size.node.expr.is_symbol:
                    continue
                dim_name = f"{output}_dim_{axis}"
            if meaning.setdefault(dim_name, expression) != expression:
                warnings.warn(
                    f"dynamic_axes names dim {axis} of the output {output!r} {dim_name!r}, a name that "
                    "already stands for a size torch does not prove equal: tools reading the ONNX "
                    "model will take the two sizes as equal",
                    stacklevel=4,
                )
            result.setdefault(output, {})[axis] = dim_name
    return result


def dynamic_shapes_from_examples(
    forward: Any, bound: dict[str, Any], example_inputs: Sequence[Any], hint: Any = Dim.AUTO
) -> tuple[dict[str, Any], dict[tuple[str, int], str]]:
    """``dynamic_shapes`` marking every dim whose size differs between the example calls.

    ``bound`` is the export call's arguments by parameter name; ``example_inputs`` further
    calls (see :func:`as_call`). Dims that always have the same sizes share one name: the
    first dim is ``batch``, the second dim of a 2-D tensor (token ids, masks) ``sequence``,
    any other ``<input>_dim_<axis>``. The dims are ``hint``: with ``Dim.AUTO`` torch.export
    infers their ranges and fixes those the model fixes, with ``Dim.DYNAMIC`` it refuses those.

    Returns the dynamic_shapes (keyed by parameter) and the dim names, keyed by (input, axis).
    """
    if isinstance(example_inputs, (str, bytes)) or not isinstance(example_inputs, Sequence) or not example_inputs:
        raise ValueError(
            "dynamic_shapes='auto' needs example_inputs: a list of calls, each an (args, kwargs) pair "
            "or a tuple of arguments, whose sizes differ where the model is dynamic"
        )
    calls = [bound]
    for i, example in enumerate(example_inputs):
        args, kwargs = as_call(example)
        call = bind_arguments(forward, args, kwargs)
        if set(call) != set(bound):
            raise ValueError(
                f"example_inputs[{i}] passes {sorted(call)} but the export call passes {sorted(bound)}; "
                "every example must pass the same arguments"
            )
        calls.append(call)

    groups: dict[tuple[int, ...], list[tuple[str, int, torch.Tensor]]] = {}
    shapes: dict[str, Any] = {}
    for param, value in bound.items():
        leaves, spec = pytree.tree_flatten_with_path(value)
        per_call = []
        for i, call in enumerate(calls[1:]):
            other_leaves, other_spec = pytree.tree_flatten(call[param])
            if other_spec != spec:
                raise ValueError(f"example_inputs[{i}] gives {param!r} another structure than the export call")
            per_call.append(other_leaves)
        leaf_specs = []
        for j, (path, leaf) in enumerate(leaves):
            name = leaf_name(param, path)
            others = [leaves_[j] for leaves_ in per_call]
            if not isinstance(leaf, torch.Tensor):
                leaf_specs.append(_python_value_spec(name, leaf, others, hint))
                continue
            for i, other in enumerate(others):
                if not isinstance(other, torch.Tensor) or other.dim() != leaf.dim():
                    raise ValueError(
                        f"example_inputs[{i}] gives {name!r} rank "
                        f"{getattr(other, 'ndim', None)}, the export call rank {leaf.dim()}; ranks must agree"
                    )
            spec_for_leaf = {}
            for axis in range(leaf.dim()):
                sizes = (leaf.shape[axis], *(o.shape[axis] for o in others))
                if len(set(sizes)) > 1:
                    spec_for_leaf[axis] = hint
                    groups.setdefault(sizes, []).append((name, axis, leaf))
            leaf_specs.append(spec_for_leaf or None)
        shapes[param] = pytree.tree_unflatten(leaf_specs, spec)

    requested: dict[tuple[str, int], str] = {}
    used: set[str] = set()
    for members in groups.values():
        if any(axis == 0 for _, axis, _ in members):
            wanted = "batch"
        elif any(axis == 1 and t.dim() == 2 for _, axis, t in members):
            wanted = "sequence"
        else:
            wanted = f"{members[0][0]}_dim_{members[0][1]}"
        unique = unique_name(wanted, used)
        used.add(unique)
        for name, axis, _ in members:
            requested[(name, axis)] = unique
    return shapes, requested
