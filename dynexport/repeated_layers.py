"""A transformer's repeated layers traced once: capture time independent of the layer count.

Tracing is most of an export's time, and a decoder's ``nn.ModuleList`` of N identical layers is
traced N times over. Here two layers of such a list are traced (with those before them), the rest
are called as stubs, and the captured graph gets the remaining layers as copies of the last traced
one, each reading its own layer's parameters and cache slot: the program is then the one a full
capture gives, up to node names, and every later stage (translation, verification, the report,
``ONNXProgram.exported_program``) sees the full model.

Soundness: nothing is copied unless each of these holds, otherwise capture is redone in full.

- Before capture (:func:`repeated_layers`): the layers are distinct modules of one class whose
  submodules, parameter and buffer names, shapes and dtypes, and other attributes (by value,
  recursively; hooks included) are the same, except an int ``layer_idx`` (transformers' attention
  selects its cache slot by it) equal to the layer's position plus a constant; each parameter
  and buffer belongs to one layer or to all. Layer 0 may differ (T5's relative attention bias):
  the traced pair is then layers 1 and 2.
- While capturing (:func:`layers_traced_once`): each layer is called once, in order. A stubbed
  layer gets the arguments the last traced layer got (tensors and objects such as the cache by
  identity, other values by equality) except the hidden state, which must be what the layer
  before returned; it returns a copy of the hidden state shaped like the traced layer's output (a
  tensor, or a tuple of it and Nones) and touches nothing else, so the traced layer must change
  no list or dict it is given either. ``layer_idx`` is read only by transformers' cache code (any
  other use, say a branch on it, is recorded and stops the copying).
- After capture (:func:`replicated`): the two traced layers' subgraphs are the same computation
  (op for op, attributes and shapes equal) up to their own parameters, the hidden state that
  links them and per-layer cache values, which are the same expression of cache inputs a constant
  number of positions apart. Only the hidden state and cache outputs (at positions a constant
  apart) leave the second one. Each stub is one copy of the hidden state; the cache value a copy
  reads is the one the graph returns unchanged for that slot, the same expression of that slot's
  inputs, and nothing after the stub reads it but that output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.export.graph_signature import OutputKind, TensorArgument

__all__ = ["LayerCalls", "NotReplicable", "RepeatedLayers", "layers_traced_once", "repeated_layers", "replicated"]

# Copies each save a trace of one layer; a check that fails costs a wasted capture of the first
# layers. Below four copies the saving is smaller than that risk.
MIN_COPIES = 4
TRACED = 2  # the pair compared: the last traced layers


class NotReplicable(Exception):
    """A check of the module doc failed: the layers are captured in full instead."""


@dataclasses.dataclass(frozen=True)
class RepeatedLayers:
    """A ``ModuleList`` at ``path`` whose layers from ``first`` on are alike: layers up to
    ``first + 1`` are traced, the later ones copied from the last traced one."""

    path: str
    layers: tuple[torch.nn.Module, ...] = dataclasses.field(repr=False)
    first: int = 0

    @property
    def reference(self) -> int:
        """The last traced layer, copied for every later one."""
        return self.first + TRACED - 1

    def describe(self) -> str:
        traced = self.reference + 1
        return f"{self.path}: {traced} of {len(self.layers)} layers traced, {len(self.layers) - traced} copied"


def repeated_layers(module: torch.nn.Module) -> list[RepeatedLayers]:
    """The outermost ``ModuleList``s of ``module`` whose layers are alike (module doc) and
    numerous enough to copy."""
    found: list[RepeatedLayers] = []
    for path, child in module.named_modules():
        if not isinstance(child, torch.nn.ModuleList) or any(path.startswith(f"{r.path}.") for r in found):
            continue
        layers = tuple(child)
        if len({id(layer) for layer in layers}) != len(layers) or len(layers) < TRACED + MIN_COPIES:
            continue
        if (
            not all(_same_layer(layers[1], layer) for layer in layers[2:])
            or not _indexed_by_position(layers)
            or not _tensors_own_or_shared_by_all(layers)
        ):
            continue
        first = 0 if _same_layer(layers[0], layers[1]) else 1
        if len(layers) - first - TRACED >= MIN_COPIES and "forward" not in vars(layers[0]) | vars(layers[1]):
            found.append(RepeatedLayers(path, layers, first))
    return found


def _same_layer(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    modules_a, modules_b = list(a.named_modules()), list(b.named_modules())
    return [name for name, _ in modules_a] == [name for name, _ in modules_b] and all(
        _same_module(x, y) for (_, x), (_, y) in zip(modules_a, modules_b)
    )


def _same_module(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    if type(a) is not type(b) or vars(a).keys() != vars(b).keys():
        return False
    for name, value in vars(a).items():
        other = vars(b)[name]
        if name in ("_parameters", "_buffers"):
            same = value.keys() == other.keys() and all(_same_kind_of_tensor(value[k], other[k]) for k in value)
        elif name == "_modules":
            same = value.keys() == other.keys()  # the children themselves are compared by _same_layer
        elif name == "layer_idx" and type(value) is int:
            same = type(other) is int
        elif "hook" in name and isinstance(value, dict):  # keyed by handle ids, which differ
            same = _same_value(list(value.values()), list(other.values()))
        else:
            same = _same_value(value, other)
        if not same:
            return False
    return True


def _same_kind_of_tensor(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return (type(a), a.shape, a.dtype, a.device, a.requires_grad) == (type(b), b.shape, b.dtype, b.device, b.requires_grad)


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return _same_kind_of_tensor(a, b) and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, functools.partial):  # one per layer (Gemma's activation): equal when made alike
        return _same_value((a.func, a.args, a.keywords), (b.func, b.args, b.keywords))
    try:
        return (a == b) is True
    except Exception:  # an __eq__ that does not answer with a bool: not provably the same
        return False


def _indexed_by_position(layers: tuple[torch.nn.Module, ...]) -> bool:
    """Every int ``layer_idx`` in layer i is i plus one constant for all layers (none at all: no
    cache; another value is an attribute like the others)."""
    offsets = set()
    for position, layer in enumerate(layers):
        for submodule in layer.modules():
            index = vars(submodule).get("layer_idx")
            if type(index) is int:
                offsets.add(index - position)
    return len(offsets) <= 1


def _tensors_own_or_shared_by_all(layers: tuple[torch.nn.Module, ...]) -> bool:
    """Each parameter and buffer belongs to one layer or to all (a copy reads a shared one as
    the traced layer does, and its own layer's otherwise): none tied between some layers only."""
    holders: dict[int, set[int]] = {}
    for position, layer in enumerate(layers):
        named = [*layer.named_parameters(remove_duplicate=False), *layer.named_buffers(remove_duplicate=False)]
        for _, tensor in named:
            holders.setdefault(id(tensor), set()).add(position)
    return all(len(held) in (1, len(layers)) for held in holders.values())


# -- capture ------------------------------------------------------------------------------


class LayerCalls:
    """What the layers of one list saw while captured: their hidden outputs by position, the
    reference layer's call, the uses of ``layer_idx`` outside transformers' cache code."""

    def __init__(self, repeated: RepeatedLayers):
        self.repeated = repeated
        self.called: list[int] = []
        self.hidden_outputs: dict[int, torch.Tensor] = {}
        self.reference_call: tuple[tuple, dict] | None = None
        self.output_length: int | None = None  # None: the layer returns a tensor
        self.index_uses: list[str] = []

    def check_complete(self) -> None:
        if self.index_uses:
            raise NotReplicable(f"layer_idx is read outside the cache: {self.index_uses[0]}")
        if self.called != list(range(len(self.repeated.layers))):
            raise NotReplicable(f"{self.repeated.path}'s layers were called in the order {self.called}")

    def _call(self, position: int) -> None:
        if self.called != list(range(position)):
            raise NotReplicable(f"layer {position} called after layers {self.called}")
        self.called.append(position)

    def traced_forward(self, position: int, forward: Any) -> Any:
        def traced(*args: Any, **kwargs: Any) -> Any:
            self._call(position)
            containers = _containers(args, kwargs)
            output = forward(*args, **kwargs)
            if position == self.repeated.reference and containers != _containers(args, kwargs):
                raise NotReplicable(f"layer {position} changes a list or dict it is given (the stubs would not)")
            if position >= self.repeated.reference - 1:
                self.hidden_outputs[position] = _hidden_state(output)
            if position == self.repeated.reference:
                self.reference_call = (args, kwargs)
                self.output_length = None if isinstance(output, torch.Tensor) else len(output)
            return output

        return traced

    def stub_forward(self, position: int) -> Any:
        def stub(*args: Any, **kwargs: Any) -> Any:
            self._call(position)
            hidden = self._hidden_argument(position, args, kwargs).clone()
            self.hidden_outputs[position] = hidden
            return hidden if self.output_length is None else (hidden,) + (None,) * (self.output_length - 1)

        return stub

    def _hidden_argument(self, position: int, args: tuple, kwargs: dict) -> torch.Tensor:
        """The hidden state a stub was called with, once its other arguments are checked to be
        the reference layer's."""
        reference_args, reference_kwargs = self.reference_call
        if len(args) != len(reference_args) or kwargs.keys() != reference_kwargs.keys():
            raise NotReplicable(f"layer {position} is called with other arguments than layer {self.repeated.reference}")
        reference_hidden = self.hidden_outputs[self.repeated.reference - 1]
        previous_hidden = self.hidden_outputs[position - 1]
        pairs = [*zip(reference_args, args), *((reference_kwargs[k], kwargs[k]) for k in kwargs)]
        hidden = [value for reference, value in pairs if reference is reference_hidden]
        if len(hidden) != 1 or hidden[0] is not previous_hidden:
            raise NotReplicable(f"layer {position} does not take the hidden state layer {position - 1} returned")
        if not all(_same_argument(reference, value) for reference, value in pairs if reference is not reference_hidden):
            raise NotReplicable(f"layer {position} is called with other arguments than layer {self.repeated.reference}")
        return hidden[0]


def _containers(args: tuple, kwargs: dict) -> list[tuple[int, list[int]]]:
    """The lists and dicts among a call's arguments, by identity, with the identities of what
    they hold: a layer that appends to one changes this."""
    found = []
    for value in [*args, *kwargs.values()]:
        if isinstance(value, (list, dict)):
            held = value.values() if isinstance(value, dict) else value
            found.append((id(value), [id(item) for item in held]))
    return found


def _hidden_state(output: Any) -> torch.Tensor:
    """A layer's output as the stubs can imitate it: a tensor, or a tuple of it and Nones."""
    if isinstance(output, torch.Tensor):
        return output
    if type(output) is tuple and output and isinstance(output[0], torch.Tensor) and all(o is None for o in output[1:]):
        return output[0]
    raise NotReplicable(f"a layer returns {type(output).__name__}, not a tensor or (tensor, None, ...)")


def _same_argument(reference: Any, value: Any) -> bool:
    if isinstance(reference, torch.Tensor) or isinstance(value, torch.Tensor):
        return reference is value
    if type(reference) is not type(value):
        return False
    if isinstance(reference, (list, tuple)):
        return len(reference) == len(value) and all(_same_argument(r, v) for r, v in zip(reference, value))
    if isinstance(reference, dict):
        return reference.keys() == value.keys() and all(_same_argument(reference[k], value[k]) for k in reference)
    return _same_value(reference, value)


@contextlib.contextmanager
def layers_traced_once(lists: list[RepeatedLayers]) -> Iterator[list[LayerCalls]]:
    """Within the block, each list's layers up to its reference run (recorded) and the later ones
    are stubs; their ``layer_idx`` attributes record every use outside transformers' cache code."""
    calls = [LayerCalls(repeated) for repeated in lists]
    patched: list[tuple[torch.nn.Module, str, Any]] = []  # (module, attribute, value to restore)
    try:
        for record in calls:
            for position, layer in enumerate(record.repeated.layers):
                if position <= record.repeated.reference:
                    layer.forward = record.traced_forward(position, layer.forward)
                    for submodule in layer.modules():
                        if "layer_idx" in vars(submodule):
                            index = vars(submodule)["layer_idx"]
                            patched.append((submodule, "layer_idx", index))
                            submodule.layer_idx = _LayerIndex(index, record.index_uses)
                else:
                    layer.forward = record.stub_forward(position)
                patched.append((layer, "forward", None))
        yield calls
    finally:
        for module, name, value in reversed(patched):
            if name == "forward":
                del module.forward
            else:
                setattr(module, name, value)


_CACHE_CODE = os.path.join("transformers", "cache_utils.py")


class _LayerIndex:
    """An int that records where it is used, unless by transformers' cache code (which selects
    the layer's slot with it). ``isinstance(index, int)`` holds, as for the int it stands for."""

    __slots__ = ("_uses", "_value")

    def __init__(self, value: int, uses: list[str]):
        self._value = value
        self._uses = uses

    @property
    def __class__(self) -> type:
        return int

    def _used(self) -> None:
        caller = sys._getframe(2)
        if not caller.f_code.co_filename.endswith(_CACHE_CODE):
            self._uses.append(f"{caller.f_code.co_filename}:{caller.f_lineno}")


def _recording(name: str) -> Any:
    def method(self: _LayerIndex, *others: Any) -> Any:
        self._used()
        values = [other._value if type(other) is _LayerIndex else other for other in others]
        return getattr(self._value, name)(*values)

    method.__name__ = name
    return method


for _name in (
    "__index__", "__int__", "__float__", "__bool__", "__hash__", "__repr__", "__str__", "__format__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__abs__",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__",
):
    setattr(_LayerIndex, _name, _recording(_name))


# -- the captured graph -----------------------------------------------------------------------


def replicated(program: torch.export.ExportedProgram, calls: list[LayerCalls]) -> torch.export.ExportedProgram:
    """``program``, captured with stubs, with each stub replaced by a copy of its list's
    reference layer (module doc).

    Raises:
        NotReplicable: a check failed.
    """
    for record in calls:
        record.check_complete()
        _Copier(program, record.repeated).copy_layers()
    program.graph.lint()
    program.graph_module.recompile()
    _rename_outputs(program)
    program.validate()
    return program


def _module_path(node: torch.fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][0] if stack else None


class _Copier:
    """Replaces the stubs of one list in a captured program by copies of its reference layer."""

    def __init__(self, program: torch.export.ExportedProgram, repeated: RepeatedLayers):
        self.program = program
        self.graph = program.graph
        self.repeated = repeated
        self.order = {node: index for index, node in enumerate(self.graph.nodes)}
        self.output = self.graph.output_node()
        self.signature = program.graph_signature
        user_inputs = set(self.signature.user_inputs)
        self.user_inputs = {
            node: index for index, node in enumerate(n for n in self.graph.nodes if n.name in user_inputs)
        }
        self.states = {**self.signature.inputs_to_parameters, **self.signature.inputs_to_buffers}
        self.placeholders = {node.name: node for node in self.graph.nodes if node.op == "placeholder"}
        self.state_nodes = {fqn: self.placeholders[name] for name, fqn in self.states.items()}
        self.regions = self._regions()

    def _regions(self) -> dict[int, list[torch.fx.Node]]:
        paths = {f"{self.repeated.path}.{position}": position for position in range(len(self.repeated.layers))}
        regions: dict[int, list[torch.fx.Node]] = {position: [] for position in paths.values()}
        for node in self.graph.nodes:
            path = _module_path(node)
            while path:
                if path in paths:
                    regions[paths[path]].append(node)
                    break
                path = path.rpartition(".")[0]
        return regions

    def copy_layers(self) -> None:
        reference = self.repeated.reference
        first, second = self.regions[reference - 1], self.regions[reference]
        image, externals = _correspondence(first, second)
        in_first, in_second = set(first), set(second)
        hidden_links = [(a, b) for a, b in externals.items() if b in in_first and not _symbolic_equal(a, b)]
        if len(hidden_links) != 1:
            raise NotReplicable(f"layer {reference} reads {len(hidden_links)} values of layer {reference - 1}")
        previous_hidden = hidden_links[0][1]
        hidden = image[previous_hidden]
        states, slots, shift = self._classify(externals, previous_hidden)
        outputs, output_stride = self._outputs(second, in_second, image, hidden)
        slot_outputs = self._slot_outputs(second, in_second, slots, outputs)
        current = hidden
        for position in range(reference + 1, len(self.repeated.layers)):
            steps = position - reference
            stub = self._stub(position, current)
            env: dict[torch.fx.Node, torch.fx.Node] = {previous_hidden: current}
            for node, rest in states.items():
                env[node] = self._state(f"{self.repeated.path}.{position}.{rest}", node)
            for node, at in slot_outputs.items():
                env[node] = self._slot_value(node, at + steps * output_stride, steps * shift, stub)
            for node in externals.values():
                env.setdefault(node, node)
            with self.graph.inserting_before(stub):
                for node in second:
                    env[node] = self.graph.node_copy(node, env.__getitem__)
                    env[node].meta["nn_module_stack"] = self._relabelled(node.meta["nn_module_stack"], position)
            stub.replace_all_uses_with(env[hidden])
            self.graph.erase_node(stub)
            self.output.args = (self._with_outputs(outputs, env, steps * output_stride),)
            current = env[hidden]

    def _classify(
        self, externals: dict[torch.fx.Node, torch.fx.Node], previous_hidden: torch.fx.Node
    ) -> tuple[dict[torch.fx.Node, str], list[torch.fx.Node], int]:
        """The reference layer's inputs from outside: its parameters and buffers (by the name
        under the layer), the per-layer cache values, and the shift between two layers' cache
        inputs; all others are read as they are by every copy."""
        reference = self.repeated.reference
        states: dict[torch.fx.Node, str] = {}
        slots: list[torch.fx.Node] = []
        shifts = set()
        for a, b in externals.items():
            if a is b or b is previous_hidden or _symbolic_equal(a, b) or self._equal_constants(a, b):
                continue
            rest_a = self._state_under(a, reference - 1)
            rest_b = self._state_under(b, reference)
            if rest_a is not None and rest_a == rest_b:
                states[b] = rest_b
                continue
            offsets: set[int] = set()
            if not self._same_expression(a, b, offsets) or len(offsets) != 1 or 0 in offsets:
                raise NotReplicable(f"layer {reference} reads {b.name} where layer {reference - 1} reads {a.name}")
            shifts |= offsets
            slots.append(b)
        if len(shifts) > 1:
            raise NotReplicable(f"the cache inputs of layers {reference - 1} and {reference} lie {shifts} apart")
        return states, slots, next(iter(shifts), 0)

    def _state_under(self, node: torch.fx.Node, position: int) -> str | None:
        fqn = self.states.get(node.name) if node.op == "placeholder" else None
        prefix = f"{self.repeated.path}.{position}."
        return fqn[len(prefix):] if fqn is not None and fqn.startswith(prefix) else None

    def _state(self, fqn: str, like: torch.fx.Node) -> torch.fx.Node:
        node = self.state_nodes.get(fqn)
        if node is None or not _same_meta(node, like):
            raise NotReplicable(f"{fqn} is not an input of the captured graph like {self.states[like.name]}")
        return node

    def _equal_constants(self, a: torch.fx.Node, b: torch.fx.Node) -> bool:
        constants = self.signature.inputs_to_lifted_tensor_constants
        if a.op != "placeholder" or b.op != "placeholder" or a.name not in constants or b.name not in constants:
            return False
        return _same_value(self.program.constants[constants[a.name]], self.program.constants[constants[b.name]])

    def _same_expression(self, a: Any, b: Any, offsets: set[int]) -> bool:
        """Whether ``a`` and ``b`` compute the same from user inputs (each pair's distance in
        the inputs added to ``offsets``), constants and shared values."""
        if not isinstance(a, torch.fx.Node) or not isinstance(b, torch.fx.Node):
            return _same_literals(a, b, lambda x, y: self._same_expression(x, y, offsets))
        if a is b or self._equal_constants(a, b):
            return True
        if a in self.user_inputs and b in self.user_inputs:
            offsets.add(self.user_inputs[b] - self.user_inputs[a])
            return _same_meta(a, b)
        if a.op != "call_function" or b.op != "call_function" or a.target != b.target or not _same_meta(a, b):
            return False
        return self._same_expression((a.args, a.kwargs), (b.args, b.kwargs), offsets)

    def _outputs(
        self, second: list[torch.fx.Node], in_second: set[torch.fx.Node], image: dict[torch.fx.Node, torch.fx.Node],
        hidden: torch.fx.Node,
    ) -> tuple[dict[int, torch.fx.Node], int]:
        """The reference layer's values among the graph's user outputs, by position, and the
        distance between two layers' outputs."""
        positions = self._output_positions()
        preimage = {b: a for a, b in image.items()}
        outputs: dict[int, torch.fx.Node] = {}
        strides = set()
        for node in second:
            outside = [user for user in node.users if user not in in_second]
            if node is hidden or not outside:
                continue
            if outside != [self.output] or node not in positions:
                raise NotReplicable(f"{node.name} of layer {self.repeated.reference} is read outside the layer")
            for at in positions[node]:
                if self._output_kind(at) is not OutputKind.USER_OUTPUT or preimage[node] not in positions:
                    raise NotReplicable(f"{node.name} of layer {self.repeated.reference} is not a user output")
                strides |= {at - before for before in positions[preimage[node]]}
                outputs[at] = node
        if len(strides) > 1 or 0 in strides:
            raise NotReplicable(f"the outputs of two layers lie {strides} apart")
        return outputs, next(iter(strides), 0)

    def _slot_outputs(
        self, second: list[torch.fx.Node], in_second: set[torch.fx.Node], slots: list[torch.fx.Node],
        outputs: dict[int, torch.fx.Node],
    ) -> dict[torch.fx.Node, int]:
        """Each cache value the reference layer reads, with the position of the one output that
        depends on it (its slot's update)."""
        depends: dict[torch.fx.Node, set[torch.fx.Node]] = {}
        for node in second:
            found = set()
            for arg in node.all_input_nodes:
                found |= depends.get(arg, set()) if arg in in_second else ({arg} & set(slots))
            depends[node] = found
        slot_outputs: dict[torch.fx.Node, int] = {}
        for at, node in outputs.items():
            read = depends[node]
            if len(read) != 1 or next(iter(read)) in slot_outputs:
                raise NotReplicable(f"output {at} of layer {self.repeated.reference} updates {len(read)} cache values")
            slot_outputs[next(iter(read))] = at
        if slot_outputs.keys() != set(slots):
            raise NotReplicable(f"layer {self.repeated.reference} reads cache values it does not return")
        return slot_outputs

    def _slot_value(self, like: torch.fx.Node, at: int, shift: int, stub: torch.fx.Node) -> torch.fx.Node:
        """The cache value a copy reads: the graph's output ``at``, which the stub left as it
        came, the same expression as ``like`` of inputs ``shift`` further."""
        outputs = self.output.args[0]
        value = outputs[at] if 0 <= at < len(outputs) else None
        offsets: set[int] = set()
        if (
            not isinstance(value, torch.fx.Node)
            or self._output_kind(at) is not OutputKind.USER_OUTPUT
            or self.order[value] > self.order[stub]
            or not self._same_expression(like, value, offsets)
            or offsets != {shift}
        ):
            raise NotReplicable(f"output {at} is not the cache value layer {stub.name} leaves unchanged")
        later_readers = [user for user in value.users if user is not self.output and self.order[user] > self.order[stub]]
        if later_readers or list(outputs).count(value) != 1:
            raise NotReplicable(f"{value.name} is read after the layer that would update it")
        return value

    def _stub(self, position: int, hidden: torch.fx.Node) -> torch.fx.Node:
        region = self.regions[position]
        if len(region) != 1 or region[0].target is not torch.ops.aten.clone.default or region[0].args[0] is not hidden:
            raise NotReplicable(f"layer {position}'s stub did not copy the hidden state of layer {position - 1}")
        return region[0]

    def _with_outputs(
        self, outputs: dict[int, torch.fx.Node], env: dict[torch.fx.Node, torch.fx.Node], distance: int
    ) -> tuple:
        values = list(self.output.args[0])
        for at, node in outputs.items():
            values[at + distance] = env[node]
        return tuple(values)

    def _output_positions(self) -> dict[torch.fx.Node, list[int]]:
        positions: dict[torch.fx.Node, list[int]] = {}
        for at, value in enumerate(self.output.args[0]):
            if isinstance(value, torch.fx.Node):
                positions.setdefault(value, []).append(at)
        return positions

    def _output_kind(self, at: int) -> OutputKind:
        return self.signature.output_specs[at].kind

    def _relabelled(self, stack: dict[str, tuple[str, Any]], position: int) -> dict[str, tuple[str, Any]]:
        """An ``nn_module_stack`` of the reference layer as the copy for ``position``'s."""
        pattern = re.compile(re.escape(f"{self.repeated.path}.{self.repeated.reference}") + r"(?=\.|$)")
        replacement = f"{self.repeated.path}.{position}"
        return {
            pattern.sub(replacement, key, count=1): (pattern.sub(replacement, path, count=1), cls)
            for key, (path, cls) in stack.items()
        }


def _correspondence(
    first: list[torch.fx.Node], second: list[torch.fx.Node]
) -> tuple[dict[torch.fx.Node, torch.fx.Node], dict[torch.fx.Node, torch.fx.Node]]:
    """The node-for-node map from ``first`` to ``second``, two subgraphs that compute the same
    (same targets, literal arguments and value metadata, in the same order), and the map of
    the values they read from outside."""
    if len(first) != len(second) or not first:
        raise NotReplicable("the traced layers have different numbers of nodes")
    image: dict[torch.fx.Node, torch.fx.Node] = {}
    externals: dict[torch.fx.Node, torch.fx.Node] = {}
    taken: set[torch.fx.Node] = set()
    in_first, in_second = set(first), set(second)

    def same_node(a: torch.fx.Node, b: torch.fx.Node) -> bool:
        if a in in_first or b in in_second:
            return image.get(a) is b
        if a in externals:
            return externals[a] is b
        if b in taken:
            return False
        externals[a] = b
        taken.add(b)
        return True

    for a, b in zip(first, second):
        if (
            a.op != "call_function"
            or b.op != "call_function"
            or a.target != b.target
            or not _same_meta(a, b)
            or not _same_literals((a.args, a.kwargs), (b.args, b.kwargs), same_node)
        ):
            raise NotReplicable(f"the traced layers differ at {a.name} / {b.name}")
        image[a] = b
    return image, externals


def _same_literals(a: Any, b: Any, same_node: Any) -> bool:
    """Whether two argument structures are equal, nodes compared by ``same_node``."""
    if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
        return isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and same_node(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_literals(x, y, same_node) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_literals(a[k], b[k], same_node) for k in a)
    return _same_value(a, b)


def _same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Same kind of value: tensors of equal dtype and (symbolic) shape, equal symbolic numbers."""
    return _value_text(a.meta.get("val")) == _value_text(b.meta.get("val"))


def _value_text(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, str(tuple(value.shape)), value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_value_text(v) for v in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) or value is None:
        return (type(value).__name__, str(value))
    return ("other", type(value).__name__)


def _symbolic_equal(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Two nodes whose values are the same symbolic number (a size computed twice)."""
    value_a, value_b = a.meta.get("val"), b.meta.get("val")
    symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return isinstance(value_a, symbolic) and isinstance(value_b, symbolic) and str(value_a) == str(value_b)


def _rename_outputs(program: torch.export.ExportedProgram) -> None:
    """The signature's outputs named after the output node's arguments, after copies replaced some."""
    values = program.graph.output_node().args[0]
    for spec, value in zip(program.graph_signature.output_specs, values):
        if isinstance(spec.arg, TensorArgument) and isinstance(value, torch.fx.Node):
            spec.arg = TensorArgument(name=value.name)
