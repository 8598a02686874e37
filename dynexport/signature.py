"""How a model's arguments are read, checked, flattened and named.

Inputs are flattened the way torch.export flattens them: positional arguments, then keyword
arguments in the order of the forward signature, each nested list/tuple/dict walked depth
first. ONNX input names default to torch.export's placeholder names, which follow that walk
(``past_key_values_0_1`` for ``past_key_values[0][1]``). Outputs are named by their path in the
returned structure (``logits``, ``output_0``) unless ``output_names`` says otherwise.
Python int/float/bool arguments are baked into the graph as constants.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from dynexport.call_convention import (
    GraphIO,
    graph_input_specs,
    is_user_input,
    placeholders,
    user_input_specs,
    user_outputs,
)
from dynexport.passes.onnx.naming import unique_name

__all__ = [
    "argument_slots",
    "bind_arguments",
    "check_argument_types",
    "dynamic_shapes_from_axes",
    "dynamic_shapes_from_examples",
    "graph_input_names",
    "graph_io",
    "split_legacy_args",
]

_LEAF_TYPES = (torch.Tensor, int, float, bool, type(None))

# An argument left at its default.
_NOT_PASSED = object()


def split_legacy_args(args: Any, kwargs: Mapping[str, Any] | None) -> tuple[tuple, dict]:
    """Apply the legacy ONNX exporter's argument conventions: a lone tensor is ``(tensor,)``; a
    trailing dict in ``args`` holds keyword arguments (an empty one lets a real dict be the last
    positional argument)."""
    if isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, list):
        args = tuple(args)
    elif not isinstance(args, tuple):
        raise TypeError(
            f"args must be a tuple of model arguments or a single tensor, got {type(args).__name__}"
        )
    kwargs = dict(kwargs or {})
    if args and isinstance(args[-1], dict):
        trailing = args[-1]
        args = args[:-1]
        overlap = set(trailing) & set(kwargs)
        if overlap:
            raise ValueError(
                f"keyword argument(s) {sorted(overlap)} given both in the trailing dict of args and "
                "in kwargs; pass each once"
            )
        kwargs = {**trailing, **kwargs}
    return args, kwargs


def check_argument_types(args: tuple, kwargs: dict) -> None:
    """Raise TypeError naming the first argument that is not a tensor, number, bool, None or a
    list/tuple/dict of those."""
    leaves, _ = pytree.tree_flatten_with_path((args, kwargs))
    for path, leaf in leaves:
        if not isinstance(leaf, _LEAF_TYPES):
            raise TypeError(
                f"argument {_describe_path(path)} is a {type(leaf).__name__} ({leaf!r:.60}); "
                "dynexport accepts tensors, int/float/bool (baked in as constants), None, and "
                "lists, tuples and dicts of those. Convert it to a tensor, or bind it inside the "
                "model (e.g. functools.partial or a module attribute)."
            )


def _describe_path(path: Sequence[Any]) -> str:
    where, *rest = path
    if where.idx == 0:
        head = f"args[{rest[0].idx}]" if rest else "args"
    else:
        head = f"kwargs[{rest[0].key!r}]" if rest else "kwargs"
    return head + "".join(str(k) for k in rest[1:])


def bind_arguments(forward: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Map the forward signature's parameter names to the values given (defaults omitted)."""
    return {name: value for name, value in _bind(forward, args, kwargs).items() if value is not _NOT_PASSED}


def _bind(forward: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """:func:`bind_arguments`, with every other parameter too, in signature order, as _NOT_PASSED."""
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return {f"args_{i}": a for i, a in enumerate(args)} | dict(kwargs)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(f"the example arguments do not match the model's signature: {error}") from None
    result: dict[str, Any] = {}
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            result.update({f"{name}_{i}": v for i, v in enumerate(bound.arguments.get(name, ()))})
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            result.update(bound.arguments.get(name, {}))
        else:
            result[name] = bound.arguments.get(name, _NOT_PASSED)
    return result


def argument_slots(forward: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """Every place an input of ``forward`` could take, in torch.export's order, as (name, value):
    each leaf of each argument given, named like torch.export's placeholder for it
    (``past_key_values_0_1``), and each parameter left at its default."""
    return [
        (_leaf_name(param, path), leaf)
        for param, value in _bind(forward, args, kwargs).items()
        for path, leaf in pytree.tree_flatten_with_path(value)[0]
    ]


def _leaf_name(param: str, path: Sequence[Any]) -> str:
    return param + "".join(f"_{getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))}" for k in path)


def _no_graph_value(value: Any) -> str:
    """Why an argument slot holding ``value`` is no graph input."""
    if value is _NOT_PASSED:
        return "is left at its default"
    if value is None:
        return "is None"
    return f"is the {type(value).__name__} {value!r:.40}, baked in as a constant"


def _input_name_slots(input_names: Sequence[str] | None, slots: list[tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
    """The slot each of ``input_names`` stands for. The names go to the tensor inputs in order;
    when they outnumber the tensor inputs, to every slot in order (as the legacy exporter's users
    name an argument they leave None)."""
    names = list(input_names or ())
    tensors = [slot for slot in slots if isinstance(slot[1], torch.Tensor)]
    if len(names) > len(slots):
        raise ValueError(
            f"input_names has {len(names)} names but the model takes {len(tensors)} tensor inputs "
            f"(arguments: {[name for name, _ in slots]})"
        )
    return dict(zip(names, tensors if len(names) <= len(tensors) else slots))


def graph_input_names(input_names: Sequence[str] | None, slots: list[tuple[str, Any]]) -> list[str] | None:
    """The names ``input_names`` gives the graph's tensor inputs, in order (see
    :func:`argument_slots`); a name for an argument that is no tensor (left None, a number) is
    warned about and dropped."""
    if input_names is None:
        return None
    named = _input_name_slots(input_names, slots)
    for name, (slot, value) in named.items():
        if not isinstance(value, torch.Tensor):
            argument = f" (the argument {slot!r})" if slot != name else ""
            warnings.warn(
                f"input_names names {name!r}{argument}, which {_no_graph_value(value)}: it is no "
                "graph input, and the name goes unused",
                stacklevel=3,
            )
    name_of_slot = {slot: name for name, (slot, _) in named.items()}
    return [name_of_slot[slot] for slot, value in slots if isinstance(value, torch.Tensor) and slot in name_of_slot]


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
    named = _input_name_slots(input_names, slots)
    slot_values = dict(slots)
    outputs = list(output_names or ())
    dynamic: dict[str, dict[int, Any]] = {}
    requested: dict[tuple[str, int], str] = {}
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
                    f"dynamic_axes names the argument {key!r}, which {_no_graph_value(value)}: it is "
                    "no graph input, and its axes are ignored",
                    stacklevel=3,
                )
            continue
        for axis, dim_name in axis_names.items():
            axis = _checked_axis(key, axis, value, "input")
            dynamic.setdefault(slot, {})[axis] = Dim.DYNAMIC
            requested[(slot, axis)] = dim_name or f"{key}_dim_{axis}"
    shapes: dict[str, Any] = {}
    for param, value in bound.items():
        leaves, spec = pytree.tree_flatten_with_path(value)
        leaf_specs = [dynamic.get(_leaf_name(param, path)) for path, _ in leaves]
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


def _dim_spec_names(spec: Any, value: Any, path: str, out: dict[tuple[str, int], str]) -> None:
    """Collect named Dims from a dynamic_shapes spec walked alongside the inputs."""
    if isinstance(value, torch.Tensor):
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ())
        for axis, dim in items:
            if dim is not None and not (isinstance(axis, int) and -value.dim() <= axis < value.dim()):
                raise ValueError(
                    f"dynamic_shapes names axis {axis!r} of input {path!r}, which has rank {value.dim()} "
                    f"(axes 0..{value.dim() - 1})"
                )
            name = getattr(dim, "__name__", None)
            if name and isinstance(dim, Dim):
                out[(path, int(axis))] = name
        return
    if spec is None:
        return
    if isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
        for i, (v, s) in enumerate(zip(value, spec)):
            _dim_spec_names(s, v, f"{path}_{i}", out)
    elif isinstance(value, Mapping) and isinstance(spec, Mapping):
        for k, v in value.items():
            _dim_spec_names(spec.get(k), v, f"{path}_{k}", out)
    elif type(value) in pytree.SUPPORTED_NODES and isinstance(spec, (list, tuple)):  # a cache object
        children, _ = pytree.SUPPORTED_NODES[type(value)].flatten_with_keys_fn(value)
        for (key, v), s in zip(children, spec):
            _dim_spec_names(s, v, f"{path}_{getattr(key, 'key', getattr(key, 'idx', key))}", out)


def named_dims(dynamic_shapes: Any, bound: dict[str, Any]) -> dict[tuple[str, int], str]:
    """(flat input path, axis) -> dim name, for every ``Dim("name")`` in ``dynamic_shapes``."""
    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, Mapping):
        per_param = dynamic_shapes
    else:
        per_param = dict(zip(bound, dynamic_shapes))
    out: dict[tuple[str, int], str] = {}
    for name, value in bound.items():
        _dim_spec_names(per_param.get(name), value, name, out)
    return out


def graph_io(
    program: torch.export.ExportedProgram,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    requested_dims: dict[tuple[str, int], str],
    dynamic_axes: Mapping[str, Any] | None = None,
) -> GraphIO:
    """Name the ONNX inputs, outputs and symbolic dims of ``program``.

    ``input_names`` name the tensor inputs in order (see :func:`graph_input_names`); the entries
    of ``dynamic_axes`` for names in ``output_names`` name output dims.
    ONNX needs every input, output and initializer named differently: a default name that is
    taken gets a suffix, a name the user gave that is taken is a ``ValueError``.
    """
    specs = user_input_specs(program)
    nodes = placeholders(program)
    graph_inputs = graph_input_specs(program)
    if input_names is not None and len(input_names) > len(graph_inputs):
        raise ValueError(
            f"input_names has {len(input_names)} names but the model has {len(graph_inputs)} "
            f"tensor inputs ({[s.arg.name for s in graph_inputs]})"
        )
    custom = dict(zip((s.arg.name for s in graph_inputs), input_names or ()))
    initializers = {s.target for s in program.graph_signature.input_specs if not is_user_input(s)}
    _check_names_free("input_names", custom.values(), initializers, "a parameter, buffer or constant of the model")
    taken = initializers | set(custom.values())
    input_name = {}
    for spec in specs:
        input_name[spec.arg.name] = custom.get(spec.arg.name) or unique_name(spec.arg.name, taken)
        taken.add(input_name[spec.arg.name])
    names = [input_name[s.arg.name] for s in specs]

    dim_names: dict[str, str] = {}
    for spec in graph_inputs:
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

    output_values = _output_values(program)
    if output_names is not None and len(output_names) > len(output_values):
        raise ValueError(
            f"output_names has {len(output_names)} names but the model returns {len(output_values)} outputs"
        )
    given = list(output_names or ())
    _check_names_free("output_names", given, taken, "an input or a parameter, buffer or constant of the model")
    taken |= set(given)
    outputs = list(given)
    for default in _output_paths(program, len(output_values))[len(given):]:
        outputs.append(unique_name(default, taken))
        taken.add(outputs[-1])
    for name, value in zip(given, output_values):
        if value is None:
            warnings.warn(
                f"output_names names {name!r} an output the model returns as None: it is no graph "
                "output, and the name goes unused",
                stacklevel=3,
            )
    output_axes = {key: _axis_names(key, axes) for key, axes in (dynamic_axes or {}).items() if key in given}
    output_dims = _output_dim_names(dict(zip(outputs, output_values)), output_axes, dim_names)
    return GraphIO(names, outputs, dim_names, output_dims)


def _check_names_free(argument: str, names: Iterable[str], taken: set[str], owner: str) -> None:
    clash = sorted(set(names) & taken)
    if clash:
        raise ValueError(
            f"{argument} gives {clash}, already the name of {owner}; ONNX needs every input, "
            "output and initializer named differently: choose another name (input_names renames "
            "an input)"
        )


def _output_values(program: torch.export.ExportedProgram) -> list[Any]:
    """What each user output of ``program`` is at export: its ``meta["val"]`` (a fake tensor,
    a SymInt), or the constant returned (a number, None)."""
    return [arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg for arg, _ in user_outputs(program)]


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


def _output_paths(program: torch.export.ExportedProgram, count: int) -> list[str]:
    spec = program.call_spec.out_spec
    if spec is None:
        return [f"output_{i}" for i in range(count)]
    dummy = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    if not isinstance(dummy, (tuple, list, dict)):
        return ["output"]
    paths, _ = pytree.tree_flatten_with_path(dummy)
    names = []
    for path, _leaf in paths:
        parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        names.append(".".join(parts) if isinstance(dummy, dict) else "output_" + "_".join(parts))
    return names


def as_call(example: Any) -> tuple[tuple, dict]:
    """One example call as ``(args, kwargs)``: an ``(args_tuple, kwargs_dict)`` pair, a tuple of
    arguments (torch.onnx conventions: a trailing dict holds kwargs) or a single tensor."""
    if (
        isinstance(example, tuple) and len(example) == 2
        and isinstance(example[0], (tuple, list)) and isinstance(example[1], Mapping)
    ):
        return tuple(example[0]), dict(example[1])
    return split_legacy_args(example, None)


def dynamic_shapes_from_examples(
    forward: Any, bound: dict[str, Any], example_inputs: Sequence[Any]
) -> tuple[dict[str, Any], dict[tuple[str, int], str]]:
    """``dynamic_shapes`` marking every dim whose size differs between the example calls.

    ``bound`` is the export call's arguments by parameter name; ``example_inputs`` further
    calls (see :func:`as_call`). Dims that always have the same sizes share one name: the
    first dim is ``batch``, the second dim of a 2-D tensor (token ids, masks) ``sequence``,
    any other ``<input>_dim_<axis>``. The dims are ``Dim.AUTO``: torch.export infers their ranges.

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
            if not isinstance(leaf, torch.Tensor):
                leaf_specs.append(None)
                continue
            name = _leaf_name(param, path)
            others = [leaves_[j] for leaves_ in per_call]
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
                    spec_for_leaf[axis] = Dim.AUTO
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
