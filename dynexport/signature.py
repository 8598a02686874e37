"""How a model's arguments are read, checked, flattened and named (the names of their dims are
chosen in ``dim_names.py``).

Inputs are flattened the way torch.export flattens them: positional arguments, then keyword
arguments in the order of the forward signature, each nested list/tuple/dict walked depth
first. ONNX input names default to torch.export's placeholder names, which follow that walk
(``past_key_values_0_1`` for ``past_key_values[0][1]``). Outputs are named by their path in the
returned structure (``logits``, ``output_0``) unless ``output_names`` says otherwise. A
transformers cache's tensors are named as the ecosystem names them (``past_key_values.0.key``,
``present.0.key``: :func:`dynexport.model_caches.cache_leaf_names`).
Python int/float/bool arguments are baked into the graph as constants.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from dynexport.call_convention import (
    GraphIO,
    graph_input_specs,
    is_user_input,
    user_input_specs,
    user_outputs,
)
from dynexport.model_caches import CACHE_INPUT_PREFIX, CACHE_OUTPUT_PREFIX, cache_leaf_names
from dynexport.passes.onnx.naming import unique_name

__all__ = [
    "argument_slots",
    "as_call",
    "bind_arguments",
    "check_argument_types",
    "graph_input_names",
    "graph_io",
    "input_name_slots",
    "keyed_as_torch_export",
    "keyed_by_argument",
    "leaf_name",
    "no_graph_value",
    "output_values",
    "parameter_names",
    "split_legacy_args",
    "undeclared_arguments_static",
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


def keyed_as_torch_export(forward: Any, shapes: dict[str, Any]) -> dict[str, Any]:
    """``shapes`` keyed as :func:`bind_arguments` keys the arguments (``t_0, t_1`` for ``*t``)
    re-keyed as torch.export reads a dynamic_shapes dict: a ``*t`` parameter's entries as one
    tuple under ``t``."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return shapes
    variadic = next((p.name for p in parameters if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    if variadic is None:
        return shapes
    prefix = f"{variadic}_"
    regrouped: dict[str, Any] = {}
    for key, value in shapes.items():  # in signature order, so the entries of *t are in order
        if key.startswith(prefix) and key[len(prefix):].isdigit():
            regrouped[variadic] = (*regrouped.get(variadic, ()), value)
        else:
            regrouped[key] = value
    return regrouped


def keyed_by_argument(forward: Any, bound: dict[str, Any], shapes: Any) -> Any:
    """A dynamic_shapes tuple or list, one entry per argument passed (as torch.export reads it),
    as a dict keyed by those arguments' names, the form dim refinement narrows hints in
    (``({0: Dim.DYNAMIC},)`` as ``{"x": {0: Dim.DYNAMIC}}``); any other form as it is."""
    if not isinstance(shapes, (tuple, list)) or len(shapes) != len(bound):
        return shapes
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return shapes
    named = {p.name for p in parameters if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
    return dict(zip(bound, shapes)) if set(bound) <= named else shapes


def undeclared_arguments_static(forward: Any, bound: dict[str, Any], shapes: Any) -> Any:
    """A dynamic_shapes dict that names some of the arguments passed, with every other one
    passed given ``None`` (static), as torch.export wants each named; a dict naming something
    else, or any other form, as it is (torch.export's error then lists the names)."""
    if not isinstance(shapes, dict) or not shapes or not set(shapes) <= set(bound):
        return shapes
    try:
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in inspect.signature(forward).parameters.values()):
            return shapes  # torch.export keys ``*t`` as one entry, bound as t_0, t_1, ...
    except (TypeError, ValueError):
        return shapes
    return {name: shapes.get(name) for name in bound}


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
        (leaf_name(param, path), leaf)
        for param, value in _bind(forward, args, kwargs).items()
        for path, leaf in pytree.tree_flatten_with_path(value)[0]
    ]


def leaf_name(param: str, path: Sequence[Any]) -> str:
    return param + "".join(f"_{getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))}" for k in path)


def no_graph_value(value: Any) -> str:
    """Why an argument slot holding ``value`` is no graph input."""
    if value is _NOT_PASSED:
        return "is left at its default"
    if value is None:
        return "is None"
    return f"is the {type(value).__name__} {value!r:.40}, baked in as a constant"


def input_name_slots(input_names: Sequence[str] | None, slots: list[tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
    """The slot each of ``input_names`` stands for. The names go to the tensor inputs in order;
    when they outnumber the tensor inputs but not the slots, to every slot in order (as the
    legacy exporter's users name an argument they leave None); names beyond every slot name
    parameters (:func:`parameter_names`)."""
    names = list(input_names or ())
    tensors = [slot for slot in slots if isinstance(slot[1], torch.Tensor)]
    return dict(zip(names, slots if len(tensors) < len(names) <= len(slots) else tensors))


def parameter_names(
    input_names: Sequence[str] | None, slots: list[tuple[str, Any]], module: torch.nn.Module
) -> dict[str, str]:
    """``{state_dict key: name}`` for the names of ``input_names`` beyond every input slot: as
    the legacy exporter documents it, the inputs are followed by the model's parameters and
    buffers (its state_dict, each tensor once), which the names after the inputs name in order.

    Raises:
        ValueError: more names than inputs and state_dict entries together.
    """
    names = list(input_names or ())
    if len(names) <= len(slots):
        return {}
    tensors = sum(isinstance(value, torch.Tensor) for _, value in slots)
    keys = _distinct_tensor_keys(module.state_dict(keep_vars=True))
    if len(names) - tensors > len(keys):
        raise ValueError(
            f"input_names has {len(names)} names, but the model takes {tensors} tensor input(s) "
            f"(arguments: {[name for name, _ in slots]}) and holds {len(keys)} parameters and buffers, "
            f"(the names after the inputs name them, in order): at most {max(len(slots), tensors + len(keys))} "
            "names fit"
        )
    return dict(zip(keys, names[tensors:]))


def program_input_names(
    input_names: Sequence[str] | None, program: torch.export.ExportedProgram
) -> tuple[list[str] | None, dict[str, str]]:
    """``input_names`` given with an ExportedProgram, split into the names of its graph inputs
    and ``{state_dict key: name}`` for the names beyond them, which name the program's
    parameters and buffers (its ``state_dict``, parameters first) in order.

    Raises:
        ValueError: more names than graph inputs and state_dict entries together.
    """
    if input_names is None:
        return None, {}
    names = list(input_names)
    inputs = [spec.arg.name for spec in graph_input_specs(program)]
    keys = _distinct_tensor_keys(program.state_dict)
    if len(names) > len(inputs) + len(keys):
        raise ValueError(
            f"input_names has {len(names)} names, but the program has {len(inputs)} tensor input(s) ({inputs}) "
            f"and holds {len(keys)} parameters and buffers (the names after the inputs name them, in "
            f"order): at most {len(inputs) + len(keys)} names fit"
        )
    return names[: len(inputs)], dict(zip(keys, names[len(inputs) :]))


def _distinct_tensor_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The keys of ``state``, each tensor once (a tied weight under its first key)."""
    seen: set[int] = set()
    keys = []
    for key, tensor in state.items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            keys.append(key)
    return keys


def graph_input_names(input_names: Sequence[str] | None, slots: list[tuple[str, Any]]) -> list[str] | None:
    """The names ``input_names`` gives the graph's tensor inputs, in order (see
    :func:`argument_slots`); a name for an argument that is no tensor (left None, a number) is
    warned about and dropped."""
    if input_names is None:
        return None
    named = input_name_slots(input_names, slots)
    for name, (slot, value) in named.items():
        if not isinstance(value, torch.Tensor):
            argument = f" (the argument {slot!r})" if slot != name else ""
            warnings.warn(
                f"input_names names {name!r}{argument}, which {no_graph_value(value)}: it is no "
                "graph input, and the name goes unused",
                stacklevel=3,
            )
    name_of_slot = {slot: name for name, (slot, _) in named.items()}
    return [name_of_slot[slot] for slot, value in slots if isinstance(value, torch.Tensor) and slot in name_of_slot]


def graph_io(
    program: torch.export.ExportedProgram,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
) -> GraphIO:
    """Name the ONNX inputs and outputs of ``program`` (its dims: :func:`dim_names.graph_dims`).

    ``input_names`` name the tensor inputs in order (see :func:`graph_input_names`).
    ONNX needs every input, output and initializer named differently: a default name that is
    taken gets a suffix, a name the user gave that is taken is a ``ValueError``.
    """
    specs = user_input_specs(program)
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
    cache_names = cache_leaf_names(program.call_spec.in_spec, CACHE_INPUT_PREFIX)
    for position, spec in enumerate(specs):
        default = cache_names.get(position, spec.arg.name)
        input_name[spec.arg.name] = custom.get(spec.arg.name) or unique_name(default, taken)
        taken.add(input_name[spec.arg.name])
    names = [input_name[s.arg.name] for s in specs]

    returned = output_values(program)
    if output_names is not None and len(output_names) > len(returned):
        raise ValueError(
            f"output_names has {len(output_names)} names but the model returns {len(returned)} outputs"
        )
    given = list(output_names or ())
    _check_names_free("output_names", given, taken, "an input or a parameter, buffer or constant of the model")
    taken |= set(given)
    outputs = list(given)
    for default in _output_paths(program, len(returned))[len(given):]:
        outputs.append(unique_name(default, taken))
        taken.add(outputs[-1])
    for name, value in zip(given, returned):
        if value is None:
            warnings.warn(
                f"output_names names {name!r} an output the model returns as None: it is no graph "
                "output, and the name goes unused",
                stacklevel=3,
            )
    return GraphIO(names, outputs)


def _check_names_free(argument: str, names: Iterable[str], taken: set[str], owner: str) -> None:
    clash = sorted(set(names) & taken)
    if clash:
        raise ValueError(
            f"{argument} gives {clash}, already the name of {owner}; ONNX needs every input, "
            "output and initializer named differently: choose another name (input_names renames "
            "an input)"
        )


def output_values(program: torch.export.ExportedProgram) -> list[Any]:
    """What each user output of ``program`` is at export: its ``meta["val"]`` (a fake tensor,
    a SymInt), or the constant returned (a number, None)."""
    return [arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg for arg, _ in user_outputs(program)]


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
    for position, name in cache_leaf_names(spec, CACHE_OUTPUT_PREFIX).items():
        names[position] = name
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
