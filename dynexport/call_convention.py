"""The call convention: which inputs and outputs of an ExportedProgram are the user's, how a call
flattens into them, and how the graph's outputs go back into the structure the model returns.

Every stage reads these facts here: naming (:mod:`dynexport.signature`), translation, running
(:class:`~dynexport.ONNXProgram`, the ``torch.compile`` backend) and verification.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import (
    ConstantArgument,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    SymBoolArgument,
    SymFloatArgument,
    SymIntArgument,
    TensorArgument,
)

__all__ = [
    "GraphIO",
    "OutputLayout",
    "flatten_call",
    "graph_input_specs",
    "graph_input_values",
    "is_graph_input",
    "is_user_input",
    "is_user_output",
    "outputs_of_kind",
    "placeholders",
    "user_input_specs",
    "user_outputs",
]

# The user inputs that become graph inputs; the others (None, Python numbers) are baked in.
_GRAPH_INPUT_ARGUMENTS = (TensorArgument, SymIntArgument, SymFloatArgument, SymBoolArgument)
_SYMBOLIC_NUMBERS = {SymIntArgument: int, SymFloatArgument: float, SymBoolArgument: bool}


@dataclasses.dataclass
class GraphIO:
    """How the ONNX graph's inputs, outputs and symbolic dims are named.

    ``input_names`` has one entry per user-input placeholder of the program, in order (entries
    for non-tensor inputs are ignored); ``output_names`` one per user output; ``dim_names`` maps
    torch's shape symbols (``s0``) to the names users gave the dims (``batch``); ``output_dims``
    the names users gave output dims, by output name and axis (``{"output0": {2: "anchors"}}``).
    """

    input_names: list[str]
    output_names: list[str]
    dim_names: dict[str, str] = dataclasses.field(default_factory=dict)
    output_dims: dict[str, dict[int, str]] = dataclasses.field(default_factory=dict)


def placeholders(program: torch.export.ExportedProgram) -> dict[str, torch.fx.Node]:
    """The program's placeholder nodes by name."""
    return {n.name: n for n in program.graph.nodes if n.op == "placeholder"}


def is_user_input(spec: InputSpec) -> bool:
    """Whether an input of the program is a leaf of the user's call (else a parameter, buffer or
    constant of the model)."""
    return spec.kind is InputKind.USER_INPUT


def user_input_specs(program: torch.export.ExportedProgram) -> list[InputSpec]:
    """The input specs of the user's arguments (one per leaf of the call), in order."""
    return [s for s in program.graph_signature.input_specs if is_user_input(s)]


def is_graph_input(spec: InputSpec) -> bool:
    """Whether a user input is fed at run time (a tensor or a symbolic number), not baked in."""
    return isinstance(spec.arg, _GRAPH_INPUT_ARGUMENTS)


def graph_input_specs(program: torch.export.ExportedProgram) -> list[InputSpec]:
    """The user inputs that become graph inputs, in order."""
    return [s for s in user_input_specs(program) if is_graph_input(s)]


def flatten_call(
    program: torch.export.ExportedProgram, args: tuple, kwargs: dict
) -> tuple[list[Any], pytree.TreeSpec]:
    """Every leaf of a call's arguments in torch.export's order (positional arguments, then
    keyword arguments in the order of the export call), and the tree spec of ``(args, kwargs)``.

    Raises:
        TypeError: the keyword arguments are not the export call's.
        ValueError: the call has another number of leaves than the export call.
    """
    in_spec = program.call_spec.in_spec
    kwarg_names = in_spec.child(1).context if in_spec is not None else list(kwargs)
    missing = set(kwarg_names) - set(kwargs)
    unexpected = set(kwargs) - set(kwarg_names)
    if missing or unexpected:
        raise TypeError(
            f"keyword arguments must be {sorted(kwarg_names)} as at export "
            f"(missing {sorted(missing)}, unexpected {sorted(unexpected)})"
        )
    leaves, spec = pytree.tree_flatten((tuple(args), {k: kwargs[k] for k in kwarg_names}))
    expected = len(user_input_specs(program))
    if len(leaves) != expected:
        raise ValueError(f"the inputs have {len(leaves)} leaves but the model was exported with {expected}")
    return leaves, spec


def graph_input_values(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list[Any]:
    """The leaves of a call that the graph takes as inputs, in order (see :func:`flatten_call`)."""
    leaves, _ = flatten_call(program, args, kwargs)
    return [leaf for leaf, spec in zip(leaves, user_input_specs(program)) if is_graph_input(spec)]


def is_user_output(spec: OutputSpec) -> bool:
    """Whether an output of the program is one the model returns (else a buffer or input it
    updates, a gradient, a token)."""
    return spec.kind is OutputKind.USER_OUTPUT


def outputs_of_kind(program: torch.export.ExportedProgram, kind: OutputKind) -> list[tuple[Any, OutputSpec]]:
    """``(FX output argument, output spec)`` for the program's outputs of ``kind``."""
    output_node = next(n for n in reversed(program.graph.nodes) if n.op == "output")
    outputs = zip(output_node.args[0], program.graph_signature.output_specs)
    return [(arg, spec) for arg, spec in outputs if spec.kind is kind]


def user_outputs(program: torch.export.ExportedProgram) -> list[tuple[Any, OutputSpec]]:
    """``(FX output argument, output spec)`` for each output the model returns, in order: the
    argument is an FX node, or the constant returned (a number, None)."""
    return outputs_of_kind(program, OutputKind.USER_OUTPUT)


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    """Where each user output of a program comes from, to rebuild what the model returns.

    ``sources`` has one ``(kind, position, constant)`` per user output: kind ``"tensor"`` (the
    graph output at ``position``), ``int``/``float``/``bool`` (a symbolic number held by that
    graph output) or ``"constant"`` (the model returns ``constant``; a None output has no
    graph output, any other constant has one, at ``position``).
    """

    sources: tuple[tuple[Any, int | None, Any], ...]
    spec: pytree.TreeSpec | None
    flat_tuple: bool

    @classmethod
    def of(cls, program: torch.export.ExportedProgram) -> OutputLayout:
        sources = []
        position = 0
        for _, spec in user_outputs(program):
            if isinstance(spec.arg, ConstantArgument):
                if spec.arg.value is None:
                    sources.append(("constant", None, None))
                    continue
                sources.append(("constant", position, spec.arg.value))
            else:
                sources.append((_SYMBOLIC_NUMBERS.get(type(spec.arg), "tensor"), position, None))
            position += 1
        out_spec = program.call_spec.out_spec
        # What Dynamo's graphs return; unflattening it costs as much as a small model's run.
        flat_tuple = out_spec == pytree.tree_structure(tuple(sources))
        return cls(tuple(sources), out_spec, flat_tuple)

    def unflatten(self, results: list[Any], *, python_values: bool = False) -> Any:
        """The model's return value from the graph's outputs ``results``. Symbolic numbers and
        constants are the graph's tensors, or with ``python_values`` the Python values the
        model returns; None outputs are None either way."""
        leaves = []
        for kind, position, constant in self.sources:
            if position is None or (python_values and kind == "constant"):
                leaves.append(constant)
            elif python_values and kind != "tensor":
                leaves.append(kind(results[position]))
            else:
                leaves.append(results[position])
        if self.flat_tuple:
            return tuple(leaves)
        return pytree.tree_unflatten(leaves, self.spec) if self.spec is not None else leaves
