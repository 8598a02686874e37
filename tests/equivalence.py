"""The one helper every translation test uses: export, check, run in onnxruntime, compare.

:func:`assert_exports_equivalent` exports a model with dynexport, validates the ONNX with
``onnx.checker.check_model(full_check=True)``, runs it in onnxruntime (or, where onnxruntime has
no kernel for a dtype, onnx's reference evaluator) on the example inputs and on every resized
input set, and compares each output with eager PyTorch under dtype-aware tolerances.
"""

from __future__ import annotations

import contextvars
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import sympy
import torch
import torch.utils._pytree as pytree

import dynexport
from dynexport.verification import (
    tolerance,  # the one dtype tolerance table, shared with verify()
)
from tests.portability import assert_portable

__all__ = [
    "BATCH",
    "TESTED_OPSET",
    "grown",
    "assert_batch_dynamic_equivalent",
    "assert_spatial_dynamic_equivalent",
    "assert_as_accurate",
    "assert_close",
    "assert_dynamic_equivalent",
    "assert_exports_equivalent",
    "assert_same_structure",
    "op_histogram",
    "run_reference",
    "tolerance",
]

BATCH = torch.export.Dim("batch")

# The opset the running test exports at when it names none (None: dynexport's default); set
# with that default by tests/opset_parametrization.py, which runs tests/ops and tests/property at
# the default and at 17.
TESTED_OPSET: contextvars.ContextVar[int | None] = contextvars.ContextVar("TESTED_OPSET", default=None)


def assert_close(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None, where: str = "") -> None:
    """Compare two output structures leaf by leaf (shape, dtype and values)."""
    actual_leaves = [a for a in pytree.tree_leaves(actual) if a is not None]
    expected_leaves = [e for e in pytree.tree_leaves(expected) if e is not None]
    assert len(actual_leaves) == len(expected_leaves), (
        f"{where}: {len(actual_leaves)} outputs from ONNX, {len(expected_leaves)} from PyTorch"
    )
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        if not isinstance(e, torch.Tensor):
            e = torch.tensor(e)
        if not isinstance(a, torch.Tensor):
            a = torch.as_tensor(a)
        assert a.shape == e.shape, f"{where} output {i}: shape {tuple(a.shape)} != expected {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"{where} output {i}: dtype {a.dtype} != expected {e.dtype}"
        default_rtol, default_atol = tolerance(e.dtype)
        torch.testing.assert_close(
            a,
            e.detach(),
            rtol=default_rtol if rtol is None else rtol,
            atol=default_atol if atol is None else atol,
            equal_nan=True,
            msg=lambda m, i=i: f"{where} output {i}: {m}",
        )


def op_histogram(program: dynexport.ONNXProgram) -> Counter:
    """How many nodes of each ONNX op type the main graph holds."""
    return Counter(node.op_type for node in program.model.graph)


def run_reference(program: dynexport.ONNXProgram, *args: Any, **kwargs: Any) -> Any:
    """Run the model with onnx's reference evaluator (for dtypes onnxruntime has no kernel for)."""
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(program.model_proto)
    feeds = program.input_feeds(*args, **kwargs)
    results = evaluator.run(None, feeds)
    return program.output_structure([_to_torch(np.asarray(r)) for r in results])


def _to_torch(array: np.ndarray) -> torch.Tensor:
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _runner(program: dynexport.ONNXProgram, runtime: str):
    def reference(*args, **kwargs):
        return run_reference(program, *args, **kwargs)

    if runtime == "reference":
        return reference
    if runtime == "onnxruntime":
        return program
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        NotImplemented as OrtNotImplemented,
    )

    def auto(*args, **kwargs):
        try:
            return program(*args, **kwargs)
        except OrtNotImplemented:
            return reference(*args, **kwargs)

    return auto


def _as_call(example: Any) -> tuple[tuple, dict]:
    if isinstance(example, tuple) and len(example) == 2 and isinstance(example[1], dict) and isinstance(example[0], tuple):
        return example
    if isinstance(example, torch.Tensor):
        return (example,), {}
    return tuple(example), {}


def assert_exports_equivalent(
    model: Any,
    args: Any,
    kwargs: dict | None = None,
    *,
    resized: Sequence[Any] = (),
    rtol: float | None = None,
    atol: float | None = None,
    runtime: str = "auto",
    full_check: bool = True,
    **export_options: Any,
) -> dynexport.ONNXProgram:
    """Export ``model`` and prove the ONNX model computes what PyTorch computes.

    Args:
        model: the module or function to export (put modules in eval mode first).
        args, kwargs: example inputs used for export and the first comparison.
        resized: further inputs, each a tuple of args or an ``(args, kwargs)`` pair, typically
            with other sizes for the dynamic dims; each is compared too.
        runtime: ``"onnxruntime"``, ``"reference"`` (onnx's reference evaluator), or ``"auto"``:
            onnxruntime, and the reference evaluator where onnxruntime has no kernel for an
            op/dtype pair (e.g. double Tan, bfloat16 MatMul on CPU).
        export_options: passed to :func:`dynexport.export` (dynamic_shapes, opset_version, ...).
    """
    if isinstance(args, torch.Tensor):
        args = (args,)
    kwargs = dict(kwargs or {})
    program = dynexport.export(model, args, kwargs=kwargs, **export_options)
    onnx.checker.check_model(program.model_proto, full_check=full_check)
    assert_portable(program, export_options)  # onnx's shape inference agrees; ONNX operators and types only
    run = _runner(program, runtime)
    for index, (call_args, call_kwargs) in enumerate([(tuple(args), kwargs), *map(_as_call, resized)]):
        with torch.no_grad():
            expected = model(*call_args, **call_kwargs)
        actual = run(*call_args, **call_kwargs)
        assert_close(actual, expected, rtol=rtol, atol=atol, where="example inputs" if index == 0 else f"resized inputs #{index}")
    return program


def assert_batch_dynamic_equivalent(
    fn: Any,
    *inputs: torch.Tensor,
    batched: Sequence[bool] | None = None,
    smaller: bool = False,
    dim: Any = BATCH,
    **options: Any,
) -> dynexport.ONNXProgram:
    """:func:`assert_exports_equivalent` with the first dim of the ``batched`` inputs dynamic
    (``dim``; by default, those inputs whose first dim equals the first input's), checked again
    at three times that batch (and, with ``smaller``, at its first two rows)."""
    if batched is None:
        batched = [t.dim() > 0 and t.shape[0] == inputs[0].shape[0] for t in inputs]

    def resize(grow: bool) -> tuple:
        return tuple(
            (torch.cat([t, t.flip(0), t]) if grow else t[:2]) if b else t for t, b in zip(inputs, batched)
        )

    dynamic = tuple({0: dim} if b else None for b in batched)
    resized = [resize(True), resize(False)] if smaller else [resize(True)]
    return assert_exports_equivalent(fn, inputs, dynamic_shapes=dynamic, resized=resized, **options)


def assert_spatial_dynamic_equivalent(model: Any, x: torch.Tensor, *, spatial: bool = True, **options: Any) -> dynexport.ONNXProgram:
    """:func:`assert_exports_equivalent` for an (N, C, *spatial) input with a dynamic batch and,
    with ``spatial``, dynamic spatial dims; checked again at batch 3 and larger spatial sizes."""
    dims = {0: BATCH}
    if spatial:
        dims.update({d: torch.export.Dim(f"size{d}", min=6) for d in range(2, x.dim())})
    grown = [3, x.shape[1]] + [s + (3 + d if spatial else 0) for d, s in enumerate(x.shape[2:])]
    resized = torch.randn(grown).to(x.dtype)
    return assert_exports_equivalent(model, (x,), dynamic_shapes=(dims,), resized=[(resized,)], **options)


def grown(tensor: torch.Tensor, sizes: dict[int, int]) -> torch.Tensor:
    """``tensor`` with the dims in ``sizes`` grown to the given sizes by repeating its values
    cyclically (values stay in the tensor's own domain: positive stays positive, indices stay
    valid when the indexed dim grows too)."""
    for d, size in sizes.items():
        current = tensor.shape[d]
        if size == current or current == 0:
            continue
        reps = -(-size // current)
        tensor = torch.cat([tensor] * reps, dim=d).narrow(d, 0, size)
    return tensor.contiguous()


def assert_dynamic_equivalent(
    fn: Any,
    inputs: Sequence[torch.Tensor],
    *,
    growth: Callable[[str], int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    runtime: str = "auto",
    check_values: bool = True,
    dynamic: bool = True,
    float64_reference: bool = False,
) -> dynexport.ONNXProgram:
    """Export ``fn(*inputs)`` with every dim of size >= 2 dynamic (``Dim.AUTO``: torch relates
    or specializes them as the op requires), compare with eager PyTorch at ``inputs``, then at
    inputs whose dynamic dims grew by ``growth(dim_name)`` (each ONNX dim name grows once, so
    related dims stay equal).

    ``check_values=False`` compares shapes and dtypes only (uninitialized or random outputs);
    ``dynamic=False`` exports with static shapes. ``float64_reference``: a float16, bfloat16 or
    float32 output that differs from eager's passes when it is as accurate as eager's, both
    measured against ``fn`` computed in float64 (the two round and accumulate differently;
    neither is the truth).
    """
    inputs = tuple(inputs)
    fn = _fixed_arity(fn, len(inputs))
    shapes = tuple({d: torch.export.Dim.AUTO for d, s in enumerate(t.shape) if s >= 2} or None for t in inputs)
    program = dynexport.export(fn, inputs, dynamic_shapes=shapes if dynamic else None)
    onnx.checker.check_model(program.model_proto, full_check=True)
    assert_portable(program, {})
    run = _runner(program, runtime)
    calls = [inputs]
    if growth is not None:
        new_sizes: dict[str, int] = {}
        upper = _upper_bounds(program.exported_program)
        dims = [
            (i, d, str(dim.value))
            for i, value in enumerate(program.model.graph.inputs)
            for d, dim in enumerate(value.shape or ())
            if not isinstance(dim, int) and dim is not None and getattr(dim, "value", None) is not None
        ]
        # Dims named by a symbol grow; a dim torch derived from them (``6 - x0_dim_3``) follows.
        for i, d, name in sorted(dims, key=lambda dim: not dim[2].isidentifier()):
            if name in new_sizes:
                continue
            if name.isidentifier():
                # Within the range torch.export proved the program for (e.g. s0 <= 3 when a
                # slice ends at 4): larger inputs are outside its contract.
                limit = upper.get((program.model.graph.inputs[i].name, d), math.inf)
                new_sizes[name] = min(inputs[i].shape[d] + growth(name), limit)
            else:
                size = sympy.sympify(name).subs(new_sizes)
                new_sizes[name] = int(size) if size.is_number else inputs[i].shape[d]
        resized = []
        for i, tensor in enumerate(inputs):
            resized.append(grown(tensor, {d: new_sizes[name] for j, d, name in dims if j == i}))
        if new_sizes:
            calls.append(tuple(resized))
    for index, call in enumerate(calls):
        try:
            with torch.no_grad():
                expected = fn(*call)
        except Exception:
            if index == 0:
                raise
            continue  # the resized inputs are not valid for this op in eager PyTorch either
        actual = run(*call)
        where = "example inputs" if index == 0 else "resized inputs " + str([tuple(t.shape) for t in call])
        if check_values and float64_reference:
            try:
                assert_close(actual, expected, rtol=rtol, atol=atol, where=where)
            except AssertionError:
                if not any(t.dtype in _ROUNDED for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)):
                    raise
                with torch.no_grad():
                    precise = fn(*[t.double() if t.is_floating_point() else t for t in call])
                assert_as_accurate(actual, expected, precise, where=where)
        elif check_values:
            assert_close(actual, expected, rtol=rtol, atol=atol, where=where)
        else:
            assert_same_structure(actual, expected, where=where)
    return program


def _upper_bounds(program: torch.export.ExportedProgram) -> dict[tuple[str, int], int]:
    """``{(input name, dim): largest size}`` for the user inputs' dims torch.export bounded."""
    bounds = {}
    user_inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for name in user_inputs:
        val = placeholders[name].meta.get("val") if name in placeholders else None
        for d, size in enumerate(getattr(val, "shape", ())):
            if isinstance(size, torch.SymInt) and size.node.expr in program.range_constraints:
                high = program.range_constraints[size.node.expr].upper
                if high.is_Integer:  # not int_oo
                    bounds[(name, d)] = int(high)
    return bounds


_ARITIES = [
    lambda f: lambda: f(),
    lambda f: lambda x0: f(x0),
    lambda f: lambda x0, x1: f(x0, x1),
    lambda f: lambda x0, x1, x2: f(x0, x1, x2),
    lambda f: lambda x0, x1, x2, x3: f(x0, x1, x2, x3),
    lambda f: lambda x0, x1, x2, x3, x4: f(x0, x1, x2, x3, x4),
    lambda f: lambda x0, x1, x2, x3, x4, x5: f(x0, x1, x2, x3, x4, x5),
    lambda f: lambda x0, x1, x2, x3, x4, x5, x6: f(x0, x1, x2, x3, x4, x5, x6),
]


def _fixed_arity(fn: Any, count: int) -> Any:
    """``fn`` (which may take ``*args``) as a function of exactly ``count`` positional tensors,
    so that ``dynamic_shapes`` is one entry per tensor."""
    return _ARITIES[count](fn) if count < len(_ARITIES) else fn


_ROUNDED = (torch.float16, torch.bfloat16, torch.float32)


def assert_as_accurate(actual: Any, expected: Any, precise: Any, *, where: str = "") -> None:
    """float16/bfloat16/float32 outputs no further from ``precise`` (the float64 computation)
    than twice eager's largest error, within the dtype's tolerance; other outputs equal to
    eager's."""
    for i, (a, e, p) in enumerate(zip(*(pytree.tree_leaves(x) for x in (actual, expected, precise)))):
        if e.dtype not in _ROUNDED:
            assert_close(a, e, where=where)
            continue
        rtol, atol = tolerance(e.dtype)
        dtype = e.dtype
        a, e, p = (torch.as_tensor(x).double() for x in (a, e, p))
        ours, eager = _error(a, p), _error(e, p)
        eager_worst = float(eager.max()) if eager.numel() else 0.0
        worse = ~(ours <= atol + rtol * p.abs() + 2 * eager_worst)
        assert not worse.any(), (
            f"{where} output {i}: {int(worse.sum())} of {worse.numel()} {dtype} elements are further from "
            f"the float64 result than eager PyTorch's (largest error {ours[worse].max():.4g}, eager's {float(eager_worst):.4g})"
        )


def _error(value: torch.Tensor, precise: torch.Tensor) -> torch.Tensor:
    """|value - precise|: 0 where both are NaN or the same infinity, inf where only one is NaN."""
    error = (value - precise).abs()
    error = torch.where(value == precise, 0.0, error)
    return torch.where(value.isnan() | precise.isnan(), torch.where(value.isnan() & precise.isnan(), 0.0, math.inf), error)


def assert_same_structure(actual: Any, expected: Any, *, where: str = "") -> None:
    """Compare two output structures' shapes and dtypes only."""
    actual_leaves = [a for a in pytree.tree_leaves(actual) if a is not None]
    expected_leaves = [torch.as_tensor(e) for e in pytree.tree_leaves(expected) if e is not None]
    assert len(actual_leaves) == len(expected_leaves), f"{where}: output counts differ"
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        assert a.shape == e.shape, f"{where} output {i}: shape {tuple(a.shape)} != expected {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"{where} output {i}: dtype {a.dtype} != expected {e.dtype}"
