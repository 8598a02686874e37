"""Check an exported model against PyTorch: outputs, resized inputs, and intermediate values.

:func:`verify_program` (``ONNXProgram.verify``) runs the eager model and onnxruntime on the same
inputs and reports, per output, the largest absolute and relative error and whether it is within
the tolerance for its dtype (:func:`tolerance`, the one table the tests use too). With
``compare_intermediates`` it also runs the FX graph node by node, reads the ONNX value of every
FX node (nodes carry ``pkg.dynexport.fx_node``; a node's result is named after it), and names the
first node whose value diverges, with its model source line.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from dynexport import files, runtime
from dynexport.call_convention import flatten_call, is_user_input, placeholders, user_input_specs, user_outputs
from dynexport.errors import ExportError, source_line
from dynexport.graph_text import module_label
from dynexport.signature import as_call, split_legacy_args

if TYPE_CHECKING:
    from dynexport.program import ONNXProgram

__all__ = [
    "Divergence",
    "OutputComparison",
    "VerificationError",
    "VerificationReport",
    "float32_without_tf32",
    "resized_inputs",
    "tolerance",
    "verify_program",
]

_TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing values of ``dtype``; exact for integers and bools."""
    return _TOLERANCES.get(dtype, (0.0, 0.0))


class VerificationError(ExportError):
    """The exported model does not compute what the PyTorch model computes."""

    def __init__(self, report: VerificationReport):
        self.report = report
        super().__init__("The ONNX model does not match PyTorch:\n" + report.summary())


@dataclasses.dataclass
class OutputComparison:
    """One output of one input set, compared."""

    inputs: str
    name: str
    dtype: str
    shape: tuple
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    passed: bool
    reason: str | None = None


@dataclasses.dataclass
class Divergence:
    """The first FX node whose ONNX value differs from its eager value."""

    node: str
    target: str
    onnx_value: str
    max_abs: float
    max_rel: float
    source: str | None
    module: str | None
    reason: str | None = None

    def __str__(self) -> str:
        where = f" in {self.module}" if self.module else ""
        text = f"first divergence at FX node {self.node} ({self.target}){where}: "
        text += self.reason or f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}"
        if self.source:
            text += f"\n  at {self.source}"
        return text


@dataclasses.dataclass
class VerificationReport:
    """Per-output comparisons and, with ``compare_intermediates``, the first divergence."""

    outputs: list[OutputComparison]
    divergence: Divergence | None = None
    intermediates_compared: int = 0
    program: ONNXProgram | None = dataclasses.field(default=None, repr=False)
    # Quantized weights: their cost against the float model (dynexport.quantize.AccuracyCost).
    accuracy: Any = None

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and self.divergence is None

    def __bool__(self) -> bool:
        return self.passed

    def table(self) -> str:
        """The comparisons as a markdown table."""
        rows = [
            "| inputs | output | dtype | shape | max abs err | max rel err | rtol / atol | result |",
            "|---|---|---|---|---:|---:|---|---|",
        ]
        for o in self.outputs:
            result = "ok" if o.passed else f"**FAIL**{': ' + o.reason if o.reason else ''}"
            rows.append(
                f"| {o.inputs} | {o.name} | {o.dtype} | {list(o.shape)} | {o.max_abs:.3g} | "
                f"{o.max_rel:.3g} | {o.rtol:g} / {o.atol:g} | {result} |"
            )
        return "\n".join(rows)

    def summary(self) -> str:
        lines = [self.table()]
        if self.accuracy is not None:
            lines.append(f"quantized weights against the float model: {self.accuracy}")
        if self.intermediates_compared:
            lines.append(
                str(self.divergence) if self.divergence
                else f"all {self.intermediates_compared} intermediate values match"
            )
        return "\n".join(lines)

    __str__ = summary

    def raise_on_failure(self) -> VerificationReport:
        if not self.passed:
            raise VerificationError(self)
        return self


# -- comparing ----------------------------------------------------------------------------------


def _compare(actual: Any, expected: Any, rtol: float | None, atol: float | None) -> dict[str, Any]:
    if not isinstance(expected, torch.Tensor):
        expected = torch.tensor(expected)
    if not isinstance(actual, torch.Tensor):
        actual = torch.as_tensor(actual)
    expected = expected.detach().cpu()  # the model may run on a GPU; onnxruntime returns CPU tensors
    actual = actual.cpu()
    default_rtol, default_atol = tolerance(expected.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    row = dict(dtype=str(expected.dtype).removeprefix("torch."), shape=tuple(expected.shape),
               max_abs=float("nan"), max_rel=float("nan"), rtol=rtol, atol=atol, passed=False, reason=None)
    if actual.shape != expected.shape:
        row["reason"] = f"shape {list(actual.shape)} != {list(expected.shape)}"
        return row
    if actual.dtype != expected.dtype:
        row["reason"] = f"dtype {actual.dtype} != {expected.dtype}"
        return row
    if expected.numel() == 0:
        row.update(max_abs=0.0, max_rel=0.0, passed=True)
        return row
    a = actual.to(torch.float64) if not actual.is_complex() else actual
    e = expected.to(torch.float64) if not expected.is_complex() else expected
    both_nan = torch.isnan(a) & torch.isnan(e)
    error = torch.where(both_nan, torch.zeros_like(a.real if a.is_complex() else a), (a - e).abs())
    error = torch.nan_to_num(error, nan=float("inf"))
    relative = error / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    relative = torch.where(error == 0, torch.zeros_like(relative), relative)
    row["max_abs"] = float(error.max())
    row["max_rel"] = float(relative.max())
    row["passed"] = bool((error <= atol + rtol * e.abs()).all())
    return row


def _compare_outputs(label: str, names: Sequence[str], actual: Any, expected: Any, rtol, atol) -> list[OutputComparison]:
    actual_leaves = [a for a in pytree.tree_leaves(actual) if a is not None]
    expected_leaves = [e for e in pytree.tree_leaves(expected) if e is not None]
    if len(actual_leaves) != len(expected_leaves):
        return [OutputComparison(label, "*", "", (), float("nan"), float("nan"), 0.0, 0.0, False,
                                 f"{len(actual_leaves)} outputs from ONNX, {len(expected_leaves)} from PyTorch")]
    names = list(names) + [f"output {i}" for i in range(len(names), len(actual_leaves))]
    return [
        OutputComparison(label, name, **_compare(a, e, rtol, atol))
        for name, a, e in zip(names, actual_leaves, expected_leaves)
    ]


# -- inputs -------------------------------------------------------------------------------------


def _example_inputs(program: ONNXProgram, args: tuple, kwargs: Mapping[str, Any] | None) -> tuple[tuple, dict]:
    if args or kwargs:
        return split_legacy_args(tuple(args), kwargs)
    example = getattr(program.exported_program, "example_inputs", None) if program.exported_program else None
    if not example:
        raise ValueError("no inputs to verify with: pass the example arguments to verify()")
    return tuple(example[0]), dict(example[1])


def resized_inputs(program: ONNXProgram, args: tuple, kwargs: dict | None = None) -> tuple[tuple, dict] | None:
    """New random inputs with every dynamic dim grown by half (within its declared range).

    Floats are drawn from a normal distribution, integers from the range the example's values
    span, bools at random. Returns None when the model has no dynamic dim.
    """
    import sympy

    kwargs = dict(kwargs or {})
    program_ = program.exported_program
    leaves, spec = flatten_call(program_, args, kwargs)
    nodes = placeholders(program_)
    symbolic, values = [], {}
    for leaf, input_spec in zip(leaves, user_input_specs(program_)):
        node = nodes.get(getattr(input_spec.arg, "name", None))
        val = node.meta.get("val") if node is not None else None
        if not isinstance(leaf, torch.Tensor) or not isinstance(val, torch.Tensor):
            symbolic.append(None)
            continue
        exprs = [d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(d) for d in val.shape]
        symbolic.append(exprs)
        for expr, size in zip(exprs, leaf.shape):
            if isinstance(expr, sympy.Symbol):
                values[expr] = int(size)
    if not values:
        return None
    new_values = {}
    for symbol, value in values.items():
        bounds = program_.range_constraints.get(symbol)
        lower, upper = _bound(bounds, "lower", 0), _bound(bounds, "upper", value * 4 + 4)
        grown = value + max(1, value // 2)
        new_values[symbol] = grown if grown <= upper else max(lower, value - 1)
    new_leaves = []
    for leaf, exprs in zip(leaves, symbolic):
        if exprs is None:
            new_leaves.append(leaf)
            continue
        shape = [int(e.subs(new_values)) for e in exprs]
        new_leaves.append(_random_like(leaf, shape))
    new_args, new_kwargs = pytree.tree_unflatten(new_leaves, spec)
    return tuple(new_args), dict(new_kwargs)


def _bound(bounds: Any, side: str, default: int) -> int:
    try:
        return int(getattr(bounds, side))
    except (AttributeError, TypeError, ValueError, OverflowError):  # unbounded: sympy/torch infinity
        return default


def _random_like(tensor: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Random values of ``tensor``'s dtype on its device (a model on a GPU takes them there)."""
    if tensor.dtype == torch.bool:
        return torch.rand(shape, device=tensor.device) > 0.5
    if tensor.dtype.is_floating_point:
        return torch.randn(shape, dtype=tensor.dtype, device=tensor.device)
    low, high = (int(tensor.min()), int(tensor.max()) + 1) if tensor.numel() else (0, 2)
    return torch.randint(low, high, shape, dtype=tensor.dtype, device=tensor.device)


def _has_real_weights(program: torch.export.ExportedProgram) -> bool:
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return all(files.has_data(t) for t in tensors if isinstance(t, torch.Tensor))


# -- verifying ----------------------------------------------------------------------------------


def _holds_sequences(exported_program: torch.export.ExportedProgram) -> bool:
    return any(
        isinstance(node.target, torch._ops.OpOverload) and node.target.name().startswith("dynexport::sequence_")
        for module in exported_program.graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    )


def verify_program(
    program: ONNXProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    model: Any = None,
    resized: Any = None,
    compare_intermediates: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
) -> VerificationReport:
    """Run PyTorch and onnxruntime on the same inputs and compare every output.

    Args:
        program: the exported model.
        args, kwargs: the inputs; by default the example inputs it was exported with.
        model: the eager model to compare with; by default the exported program run eagerly.
        resized: further inputs to check (a list of argument tuples or ``(args, kwargs)``
            pairs), or True for random inputs with every dynamic dim grown
            (:func:`resized_inputs`).
        compare_intermediates: also compare the value of every FX node and report the first
            that diverges (:class:`Divergence`), with its model source line.
        rtol, atol: override the dtype's tolerance.

    Returns:
        A :class:`VerificationReport`; ``report.passed`` says whether everything matched.
    """
    args, kwargs = _example_inputs(program, args, kwargs)
    if model is None:
        if program.exported_program is None:
            raise ValueError("this program has no exported program to run eagerly; pass model=")
        if not _has_real_weights(program.exported_program):
            raise ValueError(
                "the exported program's weights are on the meta device or fake; pass the eager "
                "model with real weights as model="
            )
        if _holds_sequences(program.exported_program):
            raise ValueError(
                "the exported program holds ONNX sequences (lists whose length is only known at "
                "run time), which it cannot run eagerly; pass the original model as model="
            )
        model = program.exported_program.module()
    input_sets = [("example", args, kwargs)]
    if resized is True:
        grown = resized_inputs(program, args, kwargs)
        if grown is not None:
            input_sets.append(("resized", *grown))
    elif resized:
        for i, call in enumerate(resized, 1):
            call_args, call_kwargs = as_call(call)
            input_sets.append((f"resized #{i}", call_args, call_kwargs))
    names = [v.name for v in program.model.graph.outputs]
    outputs: list[OutputComparison] = []
    for label, call_args, call_kwargs in input_sets:
        # Each run gets its own copies: a forward that writes to its inputs (x.mul_(2)) must
        # neither change the caller's tensors nor feed the ONNX run what eager left behind.
        with torch.no_grad(), float32_without_tf32():
            expected = model(*_private_copy(call_args), **_private_copy(call_kwargs))
        actual = program(*_private_copy(call_args), **_private_copy(call_kwargs))
        outputs += _compare_outputs(label, names, actual, expected, rtol, atol)
    report = VerificationReport(outputs, program=program)
    if compare_intermediates:
        report.divergence, report.intermediates_compared = first_divergence(program, args, kwargs, rtol=rtol, atol=atol)
    return report


@contextlib.contextmanager
def float32_without_tf32() -> Iterator[None]:
    """Eager float32 arithmetic on CUDA as onnxruntime does it: PyTorch lets cuDNN convolutions
    and RNNs use TF32 by default (10-bit mantissas, errors of ~1e-3 on a ResNet), which is
    PyTorch's own rounding, not the exported graph's. No effect on the CPU."""
    # torch._C's setters: torch.backends' attributes refuse changes once something froze them
    # (torch.backends.disable_global_flags, which PyTorch's own test harness calls).
    saved = torch._C._get_cublas_allow_tf32(), torch._C._get_cudnn_allow_tf32()
    torch._C._set_cublas_allow_tf32(False)
    torch._C._set_cudnn_allow_tf32(False)
    try:
        yield
    finally:
        torch._C._set_cublas_allow_tf32(saved[0])
        torch._C._set_cudnn_allow_tf32(saved[1])


def _private_copy(tree: Any) -> Any:
    """``tree`` with every tensor cloned."""
    return pytree.tree_map_only(torch.Tensor, torch.clone, tree)


# -- intermediates ------------------------------------------------------------------------------


class _Recorder(torch.fx.Interpreter):
    def __init__(self, module: torch.fx.GraphModule):
        super().__init__(module)
        self.values: dict[str, Any] = {}

    def run_node(self, node: torch.fx.Node) -> Any:
        result = super().run_node(node)
        if node.op == "call_function":
            self.values[node.name] = result
        return result


def _eager_values(program: ONNXProgram, args: tuple, kwargs: dict) -> dict[str, Any]:
    exported = program.exported_program
    nodes = placeholders(exported)
    leaves, _ = flatten_call(exported, args, kwargs)
    user = iter(leaves)
    state = {**exported.state_dict, **exported.constants}
    flat = []
    for spec in exported.graph_signature.input_specs:
        value = next(user) if is_user_input(spec) else state[spec.target]
        if getattr(spec.arg, "name", None) in nodes:
            flat.append(value)
    recorder = _Recorder(exported.graph_module)
    with torch.no_grad(), float32_without_tf32():
        recorder.run(*flat)
    return recorder.values


def _onnx_values_of_fx_nodes(program: ONNXProgram, fx_names: set[str]) -> dict[str, Any]:
    """FX node name -> the ONNX value holding its result."""
    import onnx_ir as ir

    graph = program.model.graph
    found: dict[str, ir.Value] = {}
    for node in graph:
        origin = node.metadata_props.get("pkg.dynexport.fx_node")
        for value in node.outputs:
            if value.name in fx_names and value.name == origin:
                found[value.name] = value
    output_nodes = [arg for arg, _ in user_outputs(program.exported_program) if isinstance(arg, torch.fx.Node)]
    for arg, value in zip(output_nodes, graph.outputs):
        found.setdefault(arg.name, value)
    return found


def first_divergence(
    program: ONNXProgram, args: tuple, kwargs: dict, *, rtol: float | None = None, atol: float | None = None
) -> tuple[Divergence | None, int]:
    """Run the FX graph eagerly and the ONNX model with every FX node's value as an output;
    return the first node (in execution order) whose values differ, and how many were compared."""
    import onnx_ir as ir

    exported = program.exported_program
    if exported is None:
        raise ValueError("compare_intermediates needs the exported program")
    eager = _eager_values(program, _private_copy(args), _private_copy(kwargs))
    onnx_values = _onnx_values_of_fx_nodes(program, set(eager))
    extra = [
        v for name, v in onnx_values.items()
        if isinstance(eager.get(name), torch.Tensor) and not v.is_graph_output()
        and not v.is_graph_input() and not v.is_initializer() and v.type is not None
    ]
    graph = program.model.graph
    for value in extra:
        graph.outputs.append(value)
    try:
        files.require_weights(program.model, "compare intermediate values")
        proto = ir.serde.serialize_model(program.model)
    finally:
        for _ in extra:
            graph.outputs.pop()
    session = runtime.inference_session(proto.SerializeToString())
    names = [o.name for o in session.get_outputs()]
    results = runtime.run_session(session, program.input_feeds(*args, **kwargs), [*graph.outputs, *extra])
    actual_by_name = dict(zip(names, results))
    compared = 0
    for node in exported.graph.nodes:
        value = onnx_values.get(node.name)
        expected = eager.get(node.name)
        if value is None or not isinstance(expected, torch.Tensor) or value.name not in actual_by_name:
            continue
        compared += 1
        row = _compare(actual_by_name[value.name], expected, rtol, atol)
        if not row["passed"]:
            stack = node.meta.get("nn_module_stack")
            module = module_label(*list(stack.values())[-1]) if stack else None
            target = getattr(node.target, "name", lambda: str(node.target))()
            return Divergence(node.name, target, value.name, row["max_abs"], row["max_rel"],
                              source_line(node), module, row["reason"]), compared
    return None, compared
