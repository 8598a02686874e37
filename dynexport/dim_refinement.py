"""Dynamic-shape refinement: fit the user's ``dynamic_shapes`` to what the model requires.

A model often constrains a dim the user declared with a plain ``Dim("seq")``: position embeddings
bound it (``seq <= 128``), a reflect pad needs ``h >= 4``, a stride-2 conv whose output is added
back needs an even ``h``, one input is one longer than another. torch.export then refuses the
spec with a constraint violation that lists suggested fixes. Capture applies those fixes (bounds,
derived dims, equalities) with ``torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes``
and tries again, a bounded number of times since one fix can reveal the next, and says what
changed: one warning per dim, the export report, and the ONNX metadata (``DIM_REFINEMENTS_KEY``).
Where torch's solver asks for a multiple (``samples = 20*_samples``) only because it cannot bound a
guard that excludes small sizes, the minimum that guard is proven to need is applied instead.
Guards torch.export leaves unchecked (``min`` of sizes, remainders of a derived dim's root), which
capture's guard audit finds false somewhere, narrow the dims they read the same way: to a minimum,
or to the example's class modulo a period (``_w = 8*__w``), when that makes them hold. A capture
stops as soon as the model requires a named dim to be a multiple (:mod:`dynexport.multiples`),
and that multiple is applied the same way.

A fix that makes a declared-dynamic dim static is never applied: the ONNX model would silently
accept one size only. :class:`~dynexport.errors.DimSpecializedError` names the dim and the model
line that fixes it instead; the user opts in by declaring that dim static or ``Dim.AUTO``.

A declared dim that torch.export ties to others by itself (an attention mask's ``total`` becomes
``past + seq``) is told the same way, and the root of a derived dim takes the name the fix gave
it, so that ONNX dims read ``2*_h`` and ``past + seq``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import re
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch.utils._sympy.numbers import int_oo
from torch.export.dynamic_shapes import _DerivedDim, _DimHint, _get_dim_name_mapping, refine_dynamic_shapes_from_suggested_fixes

from dynexport.dim_names import declared_dims, dynamic_dims_sized_0_or_1, hinted_axes
from dynexport.errors import CaptureError, DimSpecializedError, ExampleTooSmallError, model_line
from dynexport.guard_audit import SizeFix, UncheckedGuards, input_dim
from dynexport.multiples import MultipleRequired
from dynexport.signature import bind_arguments

__all__ = [
    "DIM_REFINEMENTS_KEY",
    "DimRefinement",
    "capture_refining_dims",
    "derived_dim_roots",
    "dims_tied_by_the_model",
    "refinements_metadata",
]

DIM_REFINEMENTS_KEY = "pkg.dynexport.dim_refinements"

# One fix can uncover the next constraint (a bound once an equality holds; a hierarchical model's
# multiples one stage at a time, dynexport.multiples); a model still asking after this many
# captures is not converging.
MAX_ROUNDS = 12


@dataclasses.dataclass(frozen=True)
class DimRefinement:
    """One change capture made to a declared dim: ``dim`` ``seq`` and ``change`` ``max=128`` (a
    bound), or ``dim`` ``h`` and ``change`` ``= 2*_h`` (a derived dim or an equality)."""

    dim: str
    change: str

    def __str__(self) -> str:
        separator = " " if self.change.startswith("=") else ": "
        return f"{self.dim}{separator}{self.change} (from the model)"


def capture_refining_dims(
    capture: Callable[..., tuple[torch.export.ExportedProgram, str]],
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: Any,
    hint_names: Mapping[tuple[str, int], str] | None = None,
) -> tuple[torch.export.ExportedProgram, str, list[DimRefinement], Any]:
    """``capture(module, args, kwargs, dynamic_shapes)``, retried with torch's suggested fixes
    applied to ``dynamic_shapes`` while it reports violated constraints, and with the dims
    narrowed where guards it left unchecked hold (:class:`~dynexport.guard_audit.UncheckedGuards`'
    fixes: a minimum, a lattice).

    ``hint_names`` names the dims declared by hints (``dynamic_axes``), by ``(input, axis)``:
    a narrowing of such a dim is reported under that name.

    Returns the program, the capture strategy, the refinements made (each also warned about) and
    the ``dynamic_shapes`` the program was captured with.

    Raises:
        DimSpecializedError: a fix would make a dim the user declared dynamic static.
        CaptureError: capture failed for another reason, or the fixes did not converge.
    """
    refinements: list[DimRefinement] = []
    previous_fixes = None
    hinted: dict[int, torch.export.Dim] = {}  # id of a Dim.DYNAMIC hint: the Dim it stands for
    made_for: dict[str, str] = {}  # a root a fix made a declared plain dim a multiple of: that dim
    bound = bind_arguments(module.forward, args, kwargs)
    asked_at = None  # the line that asked for the last multiple applied
    try:
        for _ in range(MAX_ROUNDS):
            small = _roots_at_0_or_1(dynamic_shapes, bound, made_for)
            if small:
                raise ExampleTooSmallError(small, asked_at, {})
            try:
                program, strategy = capture(module, args, kwargs, dynamic_shapes)
                return program, strategy, _without_superseded(refinements), _named(dynamic_shapes, hinted)
            except CaptureError as error:
                unrefined = error
                declared = _get_dim_name_mapping(dynamic_shapes)
                if declared and _solver_failed(error):
                    # Without torch's account of the violated constraints, the dims are captured
                    # as hints, whose guards the guard audit checks over the declared ranges (as
                    # torch.onnx's dynamic_axes).
                    bounds = {name: (int(dim.min), dim.max) for name, dim in declared.items()}
                    dynamic_shapes = _hinted(dynamic_shapes, bounds, hinted)
                    continue
                required = _required_multiples(error)
                asked_at = next((r.where for r in error.reasons.values() if isinstance(r, MultipleRequired)), None)
                at_hints = _unchecked_guard_fixes_at_hints(error, dynamic_shapes) or _at_positions(required)
                if at_hints:
                    dynamic_shapes, hint_refinements = _hints_narrowed(dynamic_shapes, at_hints, hint_names or {}, made_for)
                    refinements += hint_refinements
                    continue
                lattices = {name: fix for name, fix in _unchecked_guard_fixes(error, dynamic_shapes).items() if fix.period > 1}
                lattices.update(required)
                single = _single_sizes(dynamic_shapes, lattices)
                if single:
                    raise DimSpecializedError(single, asked_at, error.reasons) from error
                if lattices:
                    dynamic_shapes, lattice_refinements = _on_lattices(dynamic_shapes, lattices, made_for)
                    refinements += lattice_refinements
                    continue
                message = _suggested_fixes_message(error, dynamic_shapes)
                if message is None:
                    checked = {
                        name: bounds
                        for name, bounds in _ranges_where_guards_hold(error, dynamic_shapes, _examples(dynamic_shapes, bound)).items()
                        if bounds[0] == int(declared[name].min)  # else _minimums_from_guards raises the minimum
                    }
                    if not checked:
                        pinned = _pinned_hints(error, hint_names or {})
                        if pinned:
                            line = _specializing_line(set(pinned.values()), capture, module, args, kwargs, dynamic_shapes)
                            raise DimSpecializedError(pinned, line, error.reasons) from error
                        raise
                    checked = _as_hints_keep_them(checked, dynamic_shapes, bound)
                    dynamic_shapes = _hinted(dynamic_shapes, checked, hinted)
                    refinements += [_describe_checked(name, bounds) for name, bounds in checked.items()]
                    continue
                # Fixes may also name new roots (``_h`` in ``h = 2*_h``): the user declared none of those.
                fixes = {name: fix for name, fix in _suggested_fixes(message).items() if name in declared}
                if fixes == previous_fixes:  # applied, and asked for again: torch cannot honour them
                    raise
                previous_fixes = fixes
                static = {name: int(fix) for name, fix in fixes.items() if re.fullmatch(r"-?\d+", fix)}
                examples = _examples(dynamic_shapes, bound)
                checked = _ranges_where_guards_hold(error, dynamic_shapes, examples)
                if static and all(
                    name in checked and checked[name][0] <= size and checked[name][1] == _search_upper(declared[name])
                    for name, size in static.items()
                ):
                    # torch's solver specializes dims whose guards it cannot solve (RAFT's batch:
                    # ``(3*n - 1) // n == 2``), though they hold at every size from a minimum on.
                    # (A band around the example, a loop over a count of chunks, stays refused.)
                    checked = _as_hints_keep_them({name: checked[name] for name in static}, dynamic_shapes, bound)
                    dynamic_shapes = _hinted(dynamic_shapes, checked, hinted)
                    refinements += [_describe_checked(name, bounds) for name, bounds in checked.items()]
                    continue
                if static:
                    line = _specializing_line(set(static.values()), capture, module, args, kwargs, dynamic_shapes)
                    raise DimSpecializedError(static, line, error.reasons) from error
                minimums = _proven_minimums(error, dynamic_shapes, fixes)
                if minimums:
                    # torch's solver asks for a multiple (``samples = 20*_samples``) where a guard
                    # only excludes small sizes it cannot bound (HuBERT's ``(samples // 20 - 1)**2 >
                    # 1``): every size from the proven minimum on is kept.
                    dynamic_shapes = _hinted(dynamic_shapes, minimums, hinted)
                    refinements += [DimRefinement(name, f"min={low}") for name, (low, _) in minimums.items()]
                    continue
                solver_multiples = _as_hints_keep_them(
                    _solver_multiples(fixes, checked, examples, declared), dynamic_shapes, bound
                )
                if solver_multiples:
                    # torch's solver asks for multiples to read floor divisions it cannot bound
                    # (a wav2vec2-Conformer's relative positions over ``samples // 20``), though no
                    # guard asks for one: the dims are captured as hints, whose guards the guard
                    # audit checks over the declared ranges, as for torch.onnx's dynamic_axes.
                    dynamic_shapes = _hinted(dynamic_shapes, solver_multiples, hinted)
                    refinements += [
                        DimRefinement(name, f"min={low}")
                        for name, (low, _) in solver_multiples.items()
                        if low != int(declared[name].min)
                    ]
                    continue
                plain = _plain_dims(dynamic_shapes)
                try:
                    dynamic_shapes = _refined(message, dynamic_shapes)
                except Exception:  # a fix torch cannot express in dynamic_shapes (a relation of two dims)
                    raise error from None
                for name, fix in fixes.items():
                    root = _MULTIPLE_OF_A_ROOT.fullmatch(fix)
                    if root and name in plain:
                        made_for[root.group(1)] = name
                described = [_describe(name, fix) for name, fix in fixes.items()]
                refinements += _kept_refinements(described, bound, dynamic_shapes)
        raise unrefined
    finally:
        _warned(_without_superseded(refinements))


def _kept_refinements(refinements: list[DimRefinement], bound: dict[str, Any], dynamic_shapes: Any) -> list[DimRefinement]:
    """``refinements`` less the ``min=2`` ones of a size-oblivious capture (a dim declared
    dynamic has example size 0 or 1: an empty cache, a batch of 1). Size-obliviously, torch's
    kernels ask ``seq != 1`` about the other dims too (the path of a reshape, a matmul's
    decomposition), which torch.export otherwise answers by its assumption that sizes are at
    least 2, enforcing nothing: the capture takes the minimum, the program does not, as for any
    capture (a Falcon exported from an empty cache refused its one-token steps)."""
    if not any(r.change == "min=2" for r in refinements):
        return refinements
    if not dynamic_dims_sized_0_or_1(dynamic_shapes, bound):
        return refinements
    return [r for r in refinements if r.change != "min=2"]


def _examples(dynamic_shapes: Any, bound: dict[str, Any]) -> dict[str, int]:
    """Each named dim's size at the example."""
    return {
        dim.__name__: tensor.shape[axis]
        for _, axis, dim, tensor in declared_dims(dynamic_shapes, bound)
        if isinstance(dim, torch.export.Dim)
    }


def _roots_at_0_or_1(dynamic_shapes: Any, bound: dict[str, Any], made_for: dict[str, str]) -> dict[str, tuple[str, int, int]]:
    """The derived dims of ``dynamic_shapes`` whose root is 0 or 1 at the example, for
    :class:`~dynexport.errors.ExampleTooSmallError`: by the declared dim a refinement made the
    root for (``made_for``), else by their own form."""
    small = {}
    for _, axis, dim, tensor in declared_dims(dynamic_shapes, bound):
        if not isinstance(dim, _DerivedDim):
            continue
        # torch derives dims affinely (``k*root + c``): the root at the example is exact or none.
        offset, step, size = dim.fn(0), dim.fn(1) - dim.fn(0), tensor.shape[axis]
        if step and (size - offset) % step == 0 and (size - offset) // step in (0, 1):
            small[made_for.get(dim.root.__name__, dim.__name__)] = (dim.__name__, size, dim.fn(2))
    return small


def _without_superseded(refinements: list[DimRefinement]) -> list[DimRefinement]:
    """``refinements`` less each multiple of a dim that a later multiple of the same dim
    supersedes (``w = 4*_w``, then ``w = 8*_w``: a hierarchical model's stages, one a capture)."""

    def multiple(refinement: DimRefinement) -> bool:
        return bool(_MULTIPLE_OF_A_ROOT.fullmatch(refinement.change.removeprefix("= ")))

    return [
        refinement
        for index, refinement in enumerate(refinements)
        if not (multiple(refinement) and any(later.dim == refinement.dim and multiple(later) for later in refinements[index + 1 :]))
    ]


def _warned(refinements: list[DimRefinement]) -> list[DimRefinement]:
    for refinement in refinements:
        warnings.warn(f"dynamic_shapes refined: {refinement}", stacklevel=4)
    return refinements


def refinements_metadata(refinements: list[DimRefinement]) -> str:
    """The ``DIM_REFINEMENTS_KEY`` metadata value: a JSON object ``{dim: change}``."""
    return json.dumps({r.dim: r.change for r in refinements})


def dims_tied_by_the_model(
    program: torch.export.ExportedProgram, requested_dims: dict[tuple[str, int], str]
) -> list[DimRefinement]:
    """Declared dims that torch.export expressed through others without a violated constraint
    (an attention mask's ``total`` is ``past + seq``), each warned about: the ONNX dim is named
    by that expression, not by the user's name."""
    sizes = _input_sizes(program)
    symbols = {
        size.node.expr: sympy.Symbol(name)
        for key, name in requested_dims.items()
        if isinstance(size := sizes.get(key), torch.SymInt) and size.node.expr.is_symbol
    }
    tied = {}
    for key, name in requested_dims.items():
        size = sizes.get(key)
        if name.isidentifier() and isinstance(size, torch.SymInt) and not size.node.expr.is_symbol:
            tied[name] = DimRefinement(name, f"= {size.node.expr.xreplace(symbols)}")
    for refinement in tied.values():
        warnings.warn(f"dynamic_shapes refined: {refinement}", stacklevel=3)
    return list(tied.values())


def _input_sizes(program: torch.export.ExportedProgram) -> dict[tuple[str, int], Any]:
    """``{(input name, axis): size}`` of the program's tensor inputs."""
    return {
        (node.name, axis): size
        for node in program.graph.nodes
        if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor)
        for axis, size in enumerate(node.meta["val"].shape)
    }


def derived_dim_roots(
    program: torch.export.ExportedProgram, requested_dims: dict[tuple[str, int], str]
) -> dict[str, str]:
    """``{symbol: root name}`` for the inputs' derived dims: an input dim requested as ``2*_h``
    whose size is ``2*s5`` names ``s5`` ``_h``, so that every size of that root reads in its name."""
    roots = {}
    sizes = _input_sizes(program)
    for (name, axis), wanted in requested_dims.items():
        size = sizes.get((name, axis))
        if not isinstance(size, torch.SymInt) or size.node.expr.is_symbol or len(size.node.expr.free_symbols) != 1:
            continue
        try:
            derived = sympy.sympify(wanted)
        except (sympy.SympifyError, TypeError):
            continue
        if not isinstance(derived, sympy.Expr) or len(derived.free_symbols) != 1:
            continue
        (symbol,), (root,) = size.node.expr.free_symbols, derived.free_symbols
        if sympy.expand(size.node.expr.subs(symbol, root) - derived) == 0:
            roots[symbol.name] = root.name
    return roots


def _constraint_violations(error: CaptureError) -> list[str]:
    """The messages of torch.export's constraint violations among ``error``'s reasons."""
    from torch._dynamo.exc import UserError, UserErrorType

    return [
        reason.msg
        for reason in error.reasons.values()
        if isinstance(reason, UserError) and reason.error_type is UserErrorType.CONSTRAINT_VIOLATION
    ]


def _required_multiples(error: CaptureError) -> dict[str, SizeFix]:
    """The multiples a capture stopped early for (:class:`~dynexport.multiples.MultipleRequired`),
    by dim name, or ``x.shape[2]`` for a dim declared by a hint."""
    return {
        name: SizeFix(period=factor)
        for reason in error.reasons.values()
        if isinstance(reason, MultipleRequired)
        for name, factor in reason.factors.items()
    }


def _suggested_fixes_message(error: CaptureError, dynamic_shapes: Any) -> str | None:
    """torch.export's constraint-violation message when it suggests fixes, or the minimums that
    the guards it names imply (:func:`_minimums_from_guards`) in the same form; else None."""
    for message in _constraint_violations(error)[:1]:
        if "Suggested fixes:" in message:
            return _with_the_guards_minimums(message, dynamic_shapes)
        return _minimums_from_guards(message, dynamic_shapes)
    return _minimums_from_unchecked_guards(error, dynamic_shapes)


# torch's fix of a dim's minimum: "Dim('h', min=19)", "Dim('h', min=19, max=512)".
_MINIMUM_FIX = re.compile(r"Dim\('\w+', min=(\d+)(?:, max=\d+)?\)")


def _with_the_guards_minimums(message: str, dynamic_shapes: Any) -> str:
    """torch's suggested fixes, where all are minimums, each raised to the smallest size from
    which every guard torch names for that dim holds: its solver reads the bound guards only
    (CvT's ``19 <= h``, not ``(h - 3) // 32 + 1 != 1``, which needs 35), and the next capture
    would report the rest, one round each."""
    fixes = _suggested_fixes(message)
    minimums = {name: _MINIMUM_FIX.fullmatch(fix) for name, fix in fixes.items()}
    if not minimums or None in minimums.values():
        return message
    declared = _get_dim_name_mapping(dynamic_shapes)
    if not fixes.keys() <= declared.keys():
        return message
    raised = _guard_minimums(message, declared)
    merged = {name: max(int(match[1]), raised.get(name) or 0) for name, match in minimums.items()}
    if all(merged[name] == int(match[1]) for name, match in minimums.items()):
        return message
    return _minimums_message(merged, declared)


# "You marked L['x'].size()[0] as dynamic but your code specialized it to be a constant (3)."
_PINNED_HINT = re.compile(
    r"You marked L\['(\w+)'\]\.size\(\)\[(\d+)\] as dynamic but your code specialized it to be a constant \((\d+)\)"
)


def _solver_failed(error: CaptureError) -> bool:
    """Whether torch's constraint solver failed while describing the constraints the declared
    dims violate (an assertion in ``DimConstraints.prettify_results``: timm's vovnet39a's
    ceil-mode poolings), which leaves no violation or suggested fix to refine from."""
    first = next(iter(error.reasons.values()), None)
    return isinstance(first, AssertionError) and any(
        frame.name == "prettify_results" for frame in traceback.extract_tb(first.__traceback__)
    )


def _pinned_hints(error: CaptureError, hint_names: Mapping[tuple[str, int], str]) -> dict[str, int]:
    """``{"x.shape[0]": 3}`` for the dims declared by a hint (``Dim.DYNAMIC``: what ``dynamic_axes``
    and ``_hinted`` declare), which torch.export reports fixed without suggesting a fix; a dim the
    user named is ``"batch (x.shape[0])"``."""
    pinned = {}
    for message in _constraint_violations(error):
        for name, axis, size in _PINNED_HINT.findall(message):
            dim, declared = input_dim(name, axis), hint_names.get((name, int(axis)))
            pinned[f"{declared} ({dim})" if declared else dim] = int(size)
    return pinned


# "Not all values of w = L['x'].size()[3] in the specified range satisfy the generated guard
# (1 + (((-1) + L['x'].size()[3]) // 2)) != 1."
_UNSATISFIED_GUARD = re.compile(r"Not all values of (\w+) = (\S+) in the specified range.*? satisfy the generated guard (.+?)\.?\s*$")
# A guard is tried at every size up to this one.
_GUARD_SEARCH_LIMIT = 4096
# What torch's guard text calls, and nothing else.
_GUARD_FUNCTIONS = {
    "__builtins__": {}, "max": max, "min": min, "abs": abs,
    "IntInfinity": lambda: math.inf, "NegativeIntInfinity": lambda: -math.inf,
    # TF-style same padding: ``max(0, 1 - h + 2*math.ceil(h / 2))``.
    "math": types.SimpleNamespace(ceil=math.ceil, floor=math.floor, trunc=math.trunc),
}


def _minimums_from_guards(message: str, dynamic_shapes: Any) -> str | None:
    """torch.export names guards a dim's whole range does not satisfy without suggesting a fix
    when a guard only excludes small sizes (a stride-2 convolution's output ``(h - 1) // 2 + 1 !=
    1``). The smallest size from which every such guard of the dim holds becomes its minimum, as a
    "Suggested fixes:" message; torch checks the refined range again when capture is retried."""
    declared = _get_dim_name_mapping(dynamic_shapes)
    minimums = _guard_minimums(message, declared)
    if None in minimums.values():
        return None
    # A dim whose guards hold throughout is left to _ranges_where_guards_hold.
    return _minimums_message({name: low for name, low in minimums.items() if low != int(declared[name].min)}, declared)


def _guard_minimums(message: str, declared: dict[str, Any]) -> dict[str, int | None]:
    """For each declared dim the constraint violation ``message`` names guards of, the smallest
    size from which they all hold (:func:`_smallest_size_from_which_all_hold`), None where that
    search fails."""
    return {
        name: _smallest_size_from_which_all_hold(conditions, int(declared[name].min), _search_upper(declared[name]))
        for name, conditions in _unsatisfied_guards(message, declared).items()
    }


def _unchecked_guard_fixes(error: CaptureError, dynamic_shapes: Any) -> dict[str, SizeFix]:
    """The narrowing of declared dims that makes every guard torch.export left unchecked hold
    (Swin's ``if min(input_resolution) <= self.window_size`` from a minimum on, its ``if pad > 0``
    on multiples of the window), found by :func:`~dynexport.guard_audit.check_guards_hold` on the
    first strategy's capture; empty when there is none. The retried capture checks the guards
    over the narrowed dims again."""
    first = next(iter(error.reasons.values()), None)
    if not isinstance(first, UncheckedGuards) or not first.fixes.keys() <= _get_dim_name_mapping(dynamic_shapes).keys():
        return {}
    return first.fixes


# A hint's position as the guard audit names it: ``x.shape[2]``.
_POSITION = re.compile(r"(\w+)\.shape\[(\d+)\]")


def _at_positions(fixes: dict[str, SizeFix]) -> dict[tuple[str, int], SizeFix]:
    """The ``fixes`` of dims named by position (``x.shape[2]``: hinted dims), by ``(argument, axis)``."""
    return {
        (position[1], int(position[2])): fix
        for key, fix in fixes.items()
        if (position := _POSITION.fullmatch(key)) is not None
    }


def _unchecked_guard_fixes_at_hints(error: CaptureError, dynamic_shapes: Any) -> dict[tuple[str, int], SizeFix]:
    """:func:`_unchecked_guard_fixes` for dims declared by a ``Dim.DYNAMIC`` hint (torch.onnx's
    ``dynamic_axes``), by ``(argument, axis)``, when every fix is at such a dim of a tensor
    argument; else empty."""
    first = next(iter(error.reasons.values()), None)
    if not isinstance(first, UncheckedGuards) or not first.fixes:
        return {}
    at_hints = _at_positions(first.fixes)
    return at_hints if len(at_hints) == len(first.fixes) and at_hints.keys() <= hinted_axes(dynamic_shapes) else {}


def _hints_narrowed(
    dynamic_shapes: dict[str, Any],
    fixes: dict[tuple[str, int], SizeFix],
    names: Mapping[tuple[str, int], str],
    made_for: dict[str, str],
) -> tuple[dict[str, Any], list[DimRefinement]]:
    """``dynamic_shapes`` with each hinted dim of ``fixes`` narrowed: a hint from the minimum on,
    or ``period*_<name> + offset`` over a new root (a hint has no lattice form), recorded in
    ``made_for`` (see :func:`_on_lattices`); and the refinements made, under the dim's name in
    ``names`` (its ONNX name)."""
    narrowed = {argument: dict(axes) if isinstance(axes, dict) else axes for argument, axes in dynamic_shapes.items()}
    refinements = []
    for (argument, axis), fix in fixes.items():
        hint, name = narrowed[argument][axis], names.get((argument, axis), f"{argument}_dim_{axis}")
        if fix.minimum is not None:
            narrowed[argument][axis] = torch.export.Dim.DYNAMIC(min=fix.minimum, max=hint.max)
            refinements.append(DimRefinement(name, f"min={fix.minimum}"))
            continue
        low = max(0, -(-((hint.min or 0) - fix.offset) // fix.period))
        bounds = {"min": low} if hint.max is None else {"min": low, "max": (hint.max - fix.offset) // fix.period}
        root = torch.export.Dim(f"_{name}" if f"_{name}".isidentifier() else f"_{argument}_dim_{axis}", **bounds)
        narrowed[argument][axis] = root * fix.period + fix.offset if fix.offset else root * fix.period
        if not fix.offset:
            made_for[root.__name__] = name
        refinements.append(DimRefinement(name, f"= {narrowed[argument][axis].__name__}"))
    return narrowed, refinements


def _minimums_from_unchecked_guards(error: CaptureError, dynamic_shapes: Any) -> str | None:
    """:func:`_unchecked_guard_fixes` that are minimums, as a "Suggested fixes:" message."""
    fixes = _unchecked_guard_fixes(error, dynamic_shapes)
    minimums = {name: fix.minimum for name, fix in fixes.items() if fix.minimum is not None}
    return _minimums_message(minimums, _get_dim_name_mapping(dynamic_shapes))


def _single_sizes(dynamic_shapes: Any, lattices: dict[str, SizeFix]) -> dict[str, int]:
    """``{dim: size}`` for the dims of ``lattices`` whose declared range holds one size of the
    lattice (``Dim("w", min=6, max=10)`` that the model needs a multiple of 4: 8), which the
    narrowing would make static."""
    declared = _get_dim_name_mapping(dynamic_shapes)
    single = {}
    for name, fix in lattices.items():
        bounds = _lattice_root_bounds(declared[name], fix)
        if "max" in bounds and bounds["max"] <= bounds["min"]:
            single[name] = bounds["min"] * fix.period + fix.offset
    return single


def _lattice_root_bounds(dim: Any, fix: SizeFix) -> dict[str, int]:
    """The ``min`` (and ``max``, where ``dim`` has one) of the root ``k`` of the sizes
    ``fix.period * k + fix.offset`` within ``dim``'s range."""
    low = max(0, -(-(int(dim.min) - fix.offset) // fix.period))
    return {"min": low} if dim.max == int_oo else {"min": low, "max": (int(dim.max) - fix.offset) // fix.period}


def _plain_dims(dynamic_shapes: Any) -> set[str]:
    """The names of the dims declared for inputs as a ``Dim`` of their own (not derived)."""
    return {
        dim.__name__
        for dim in pytree.tree_leaves(dynamic_shapes)
        if isinstance(dim, torch.export.Dim) and not isinstance(dim, _DerivedDim)
    }


# A fix making a dim a multiple of a new root: ``4*_h``, ``2*_w + 1``.
_MULTIPLE_OF_A_ROOT = re.compile(r"\d+\*(\w+)(?: \+ \d+)?")


def _on_lattices(
    dynamic_shapes: Any, lattices: dict[str, SizeFix], made_for: dict[str, str]
) -> tuple[Any, list[DimRefinement]]:
    """``dynamic_shapes`` with each dim named in ``lattices`` (a dim, or the root of derived dims:
    ``_w`` of ``4*_w``) replaced by ``period*_<name> + offset`` over a new root ``_<name>`` whose
    range covers the old one's; and the refinements made. (torch's fix helper cannot re-derive
    the root of a derived dim.) ``made_for`` maps the roots that fixes made plain declared dims
    multiples of to those dims (``_h`` of ``h = 4*_h``), and is kept up to date: such a root keeps
    its name, and the refinement is told as the declared dim's (``h = 8*_h``, not ``_h = 2*__h``)."""
    declared = _get_dim_name_mapping(dynamic_shapes)
    roots, told = {}, {}
    for name, fix in lattices.items():
        root = torch.export.Dim(name if name in made_for else f"_{name}", **_lattice_root_bounds(declared[name], fix))
        roots[name] = root * fix.period + fix.offset if fix.offset else root * fix.period
        told[name] = (made_for[name], None) if name in made_for else (name, roots[name].__name__)

    def narrowed(dim: Any) -> Any:
        if isinstance(dim, _DerivedDim) and dim.root.__name__ in roots:
            name = dim.root.__name__
            derived = dim.fn(roots[name])
            if told[name][1] is None:  # a kept root: told as the declared dim it now derives
                told[name] = (told[name][0], derived.__name__)
            return derived
        if isinstance(dim, torch.export.Dim) and not isinstance(dim, _DerivedDim) and dim.__name__ in roots:
            made_for[roots[dim.__name__].root.__name__] = dim.__name__
            return roots[dim.__name__]
        return dim

    narrowed_shapes = pytree.tree_map(narrowed, dynamic_shapes)
    return narrowed_shapes, [DimRefinement(user, f"= {expression}") for user, expression in told.values()]


def _minimums_message(minimums: dict[str, int], declared: dict[str, Any]) -> str | None:
    """``{dim name: minimum}`` as torch.export's "Suggested fixes:", each dim keeping its maximum."""
    fixes = []
    for name, minimum in minimums.items():
        dim = declared[name]
        maximum = "" if dim.max == int_oo else f", max={int(dim.max)}"
        fixes.append(f"{name} = Dim('{name}', min={minimum}{maximum})")
    return "Suggested fixes:\n" + "\n".join(fixes) if fixes else None


def _unsatisfied_guards(message: str, declared: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """``{dim name: [(source, guard), ...]}``: the guards a constraint violation names for each
    declared dim, with the dim's source (``L['x'].size()[3]``) as the guard reads it."""
    guards: dict[str, list[tuple[str, str]]] = {}
    # torch starts its next section on the last guard's line, which has no period then: "...guard
    # 64 <= L['x'].size()[2] and L['x'].size()[2] <= IntInfinity()Specializations unexpectedly
    # required (h, w)! ..."
    message = message.replace("Specializations unexpectedly required", "\nSpecializations unexpectedly required")
    for line in message.splitlines():
        match = _UNSATISFIED_GUARD.search(line.strip())
        if match and match.group(1) in declared:
            guards.setdefault(match.group(1), []).append((match.group(2), match.group(3)))
    return guards


def _ranges_where_guards_hold(
    error: CaptureError, dynamic_shapes: Any, examples: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """``{dim name: (min, max)}`` for the declared dims whose unsatisfied guards hold at every size
    from ``min`` to ``max`` around the dim's example (``examples``), checked one size at a time:
    torch's solver cannot prove some guards that are true throughout (ConvNeXt's ``(1 %
    (160*(w // 4))) != 0``, RAFT's batch ``(3*n - 1) // n == 2``) or up to a size (MPT's ALiBi
    bias, sliced to the sequence: ``128 - max(0, 128 - seq) != 128``, true below 128). An
    unbounded range is checked up to ``_GUARD_SEARCH_LIMIT``, which becomes ``max``. A dim whose
    guards hold at its example only, or that read another dim, is left out."""
    violations = _constraint_violations(error)
    if not violations:
        return {}
    declared = _get_dim_name_mapping(dynamic_shapes)
    guards = _unsatisfied_guards(violations[0], declared)
    checked = {}
    for name, conditions in guards.items():
        dim = declared[name]
        if name in examples:
            upper = max(_search_upper(dim), examples[name])
            sizes = _sizes_around_the_example(conditions, examples[name], int(dim.min), upper)
            if sizes is not None:
                checked[name] = sizes
    return checked


# A fix that makes a dim a multiple of a root: ``samples = 20*_samples``.
_MULTIPLE = re.compile(r"\d+\*_\w+")
# The largest lcm of a guard's divisors a minimum is proven for (sympy solves once per residue).
_PROOF_PERIOD_LIMIT = 256


def _proven_minimums(error: CaptureError, dynamic_shapes: Any, fixes: dict[str, str]) -> dict[str, tuple[int, Any]]:
    """``{dim name: (min, max)}`` when every fix asks for a multiple and every guard torch names
    for those dims is proven (:func:`_proven_minimum`) to hold at every size from ``min`` to the
    dim's declared ``max``; else empty."""
    if not fixes or not all(_MULTIPLE.fullmatch(fix) for fix in fixes.values()):
        return {}
    violations = _constraint_violations(error)
    if not violations:  # the multiples come from unchecked guards (_unchecked_guard_fixes)
        return {}
    declared = _get_dim_name_mapping(dynamic_shapes)
    guards = _unsatisfied_guards(violations[0], declared)
    minimums = {}
    for name in fixes:
        minimum = _proven_minimum(guards.get(name, []), int(declared[name].min))
        if minimum is None:
            return {}
        minimums[name] = (minimum, declared[name].max)
    return minimums


def _solver_multiples(
    fixes: dict[str, str], checked: Mapping[str, tuple[int, int]], examples: Mapping[str, int], declared: dict[str, Any]
) -> dict[str, tuple[int, Any]]:
    """``{dim name: (min, max)}`` when torch suggests only multiples (``samples = 20*_samples``)
    and every guard it names for those dims holds at each size within two multiples of the
    example, off the multiples too (``checked``, :func:`_ranges_where_guards_hold`): its solver
    asked for them to read ``samples // 20``, not because a guard does (``2*((h - 1) // 2) + 2 ==
    h`` holds at even sizes only). ``min`` is the smallest size down to which they all hold from
    the example (``(samples // 20 - 1)**2 > 1``: 60), ``max`` the declared one. Else empty."""
    if not fixes or not all(_MULTIPLE.fullmatch(fix) for fix in fixes.values()):
        return {}
    ranges = {}
    for name, fix in fixes.items():
        factor, example = int(fix.split("*")[0]), examples.get(name)
        if name not in checked or example is None:
            return {}
        (low, high), dim = checked[name], declared[name]
        upper = max(_search_upper(dim), example)  # where _ranges_where_guards_hold stops
        if low > max(example - 2 * factor, int(dim.min)) or high < min(example + 2 * factor, upper):
            return {}
        ranges[name] = (low, dim.max)
    return ranges


def _proven_minimum(conditions: list[tuple[str, str]], lower: int) -> int | None:
    """The smallest size ``m >= lower`` from which every ``(source, guard)`` holds at every larger
    size, proven rather than tried: a guard of one size ``n`` through ``n // d`` and ``n % d`` is,
    for each residue ``r`` of ``n`` modulo the divisors' lcm ``k``, a guard of ``q`` in
    ``n = k*q + r`` without them, whose set of solutions sympy finds. None when a guard reads
    another size or is not proven to hold from some size on."""
    minimum = lower
    for source, guard in conditions:
        for clause in guard.replace("IntInfinity()", "oo").split(" and "):
            if "L[" in clause.replace(source, ""):
                return None
            clause_minimum = _proven_clause_minimum(clause.replace(source, "n"))
            if clause_minimum is None:
                return None
            minimum = max(minimum, clause_minimum)
    return minimum if conditions else None


def _proven_clause_minimum(clause: str) -> int | None:
    from sympy.parsing.sympy_parser import parse_expr

    n = sympy.Symbol("n", integer=True, nonnegative=True)
    q = sympy.Symbol("q", integer=True, nonnegative=True)
    try:
        relation = parse_expr(clause, local_dict={"n": n}, evaluate=False).doit()
        if relation in (sympy.true, sympy.false):
            return 0 if relation == sympy.true else None
        divisors = [
            sympy.fraction(sympy.together(term.args[0] if isinstance(term, sympy.floor) else term.args[0] / term.args[1]))[1]
            for term in relation.atoms(sympy.floor, sympy.Mod)
        ]
        if not all(d.is_Integer and d > 0 for d in divisors):
            return None
        period = math.lcm(*(int(d) for d in divisors))
        if period > _PROOF_PERIOD_LIMIT:
            return None
        largest_failing = -1
        for residue in range(period):
            failing = _failing_quotients(relation.subs(n, period * q + residue), q)
            if failing is None:
                return None
            if failing >= 0:
                largest_failing = max(largest_failing, period * failing + residue)
        return largest_failing + 1
    except Exception:  # a guard sympy cannot read or solve is not proven
        return None


def _failing_quotients(relation: Any, q: sympy.Symbol) -> int | None:
    """The largest ``q >= 0`` at which ``relation`` fails (-1: none), or None when it fails at
    arbitrarily large ``q`` or cannot be solved."""
    relation = sympy.simplify(relation)
    if relation == sympy.true:
        return -1
    if relation == sympy.false or q not in relation.free_symbols or any(
        isinstance(atom, (sympy.floor, sympy.Mod)) for atom in relation.atoms(sympy.floor, sympy.Mod)
    ):
        return None
    if isinstance(relation, sympy.Ne):
        holding = sympy.S.Reals - sympy.solveset(relation.lhs - relation.rhs, q, sympy.S.Reals)
    elif isinstance(relation, sympy.Eq):
        return None
    else:
        holding = sympy.solve_univariate_inequality(relation, q, relational=False)
    failing = sympy.Interval(0, sympy.oo) - holding
    if failing.is_empty:
        return -1
    top = failing.sup
    if not top.is_finite:
        return None
    return int(sympy.floor(top)) if top in failing else int(sympy.ceiling(top)) - 1


def _as_hints_keep_them(bounds: dict[str, tuple[int, int]], dynamic_shapes: Any, bound: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``bounds`` as a ``Dim.DYNAMIC`` hint keeps them: from 2 on, unless the capture is
    size-oblivious (an example size of 0 or 1), since torch.export ranges a hint from 2 where it
    ranges a named ``Dim`` from 0."""
    smallest = 0 if dynamic_dims_sized_0_or_1(dynamic_shapes, bound) else 2
    return {name: (max(low, smallest), high) for name, (low, high) in bounds.items()}


def _hinted(dynamic_shapes: Any, bounds: dict[str, tuple[int, int]], hinted: dict[int, Any]) -> Any:
    """``dynamic_shapes`` with each dim named in ``bounds`` a ``Dim.DYNAMIC`` hint over its bounds:
    torch.export then keeps the guards it cannot prove instead of refusing the spec (the hint
    still refuses to become static). ``hinted`` records the dim each hint stands for."""

    def hint(dim: Any) -> Any:
        if isinstance(dim, torch.export.Dim) and dim.__name__ in bounds:
            low, high = bounds[dim.__name__]
            dynamic = torch.export.Dim.DYNAMIC(min=low, max=high)
            hinted[id(dynamic)] = torch.export.Dim(dim.__name__, min=low, max=high)
            return dynamic
        return dim

    return pytree.tree_map(hint, dynamic_shapes)


def _named(dynamic_shapes: Any, hinted: dict[int, Any]) -> Any:
    """``dynamic_shapes`` with the hints of :func:`_hinted` back to the named dims they stand for,
    so that ONNX dims keep the user's names."""
    return pytree.tree_map(lambda dim: hinted.get(id(dim), dim), dynamic_shapes)


def _describe_checked(name: str, bounds: tuple[int, int]) -> DimRefinement:
    low, high = bounds
    return DimRefinement(name, f"min={low}, max={high}, guards torch cannot prove checked at each size")


def _smallest_size_from_which_all_hold(conditions: list[tuple[str, str]], lower: int, upper: int) -> int | None:
    """The smallest ``m`` in ``[lower, upper]`` such that every ``(source, guard)`` holds with the
    dim's ``source`` (``L['x'].size()[3]``) at each size from ``m`` to ``upper``; None when a guard
    reads another size or fails at ``upper``."""
    return _last_holding(conditions, upper, -1, lower) if lower <= upper and _all_hold(conditions, upper) else None


def _search_upper(dim: Any) -> int:
    """The largest size of ``dim`` its guards are tried at."""
    return min(int(dim.max), _GUARD_SEARCH_LIMIT) if dim.max != int_oo else _GUARD_SEARCH_LIMIT


def _sizes_around_the_example(
    conditions: list[tuple[str, str]], example: int, lower: int, upper: int
) -> tuple[int, int] | None:
    """The widest ``[low, high]`` within ``[lower, upper]`` around ``example`` at each size of
    which every ``(source, guard)`` holds, when it holds more than one size; None when a guard
    reads another size."""
    if not _all_hold(conditions, example):
        return None
    low, high = _last_holding(conditions, example, -1, lower), _last_holding(conditions, example, 1, upper)
    return (low, high) if low is not None and high is not None and high > low else None


def _last_holding(conditions: list[tuple[str, str]], start: int, step: int, stop: int) -> int | None:
    """The last size from ``start`` (where every guard holds) towards ``stop`` by ``step`` before
    a guard fails; None when a guard cannot be evaluated."""
    size = start
    while (stop - size) * step > 0:
        holds = _all_hold(conditions, size + step)
        if holds is None:
            return None
        if not holds:
            break
        size += step
    return size


def _all_hold(conditions: list[tuple[str, str]], size: int) -> bool | None:
    """Whether every ``(source, guard)`` holds with the dim's ``source`` at ``size``; None when a
    guard reads another size or cannot be evaluated."""
    for source, guard in conditions:
        condition = _condition(source, guard)
        if condition is None:
            return None
        try:
            holds = bool(condition(size))
        except ZeroDivisionError:  # a size the model cannot take (``1 % (w // 4)`` below 4)
            holds = False
        except Exception:
            return None
        if not holds:
            return False
    return True


@functools.cache
def _condition(source: str, guard: str) -> Callable[[int], Any] | None:
    """``guard`` as a function of the size its ``source`` reads (searches evaluate it at thousands
    of sizes); None when it reads another size or is no expression."""
    expression = guard.replace(source, "n")
    if "L[" in expression:
        return None
    try:
        return eval(f"lambda n: {expression}", _GUARD_FUNCTIONS)  # noqa: S307 (torch's guard text)
    except SyntaxError:
        return None


def _refined(message: str, dynamic_shapes: Any) -> Any:
    """``dynamic_shapes`` with torch's suggested fixes applied. torch's helper reads every dim as
    a ``Dim`` or an int: hints (``Dim.AUTO``, ``Dim.DYNAMIC``) stand in as negative ints meanwhile."""
    hints: list[_DimHint] = []

    def hide(dim: Any) -> Any:
        if isinstance(dim, _DimHint):
            hints.append(dim)
            return -len(hints)
        return dim

    refined = refine_dynamic_shapes_from_suggested_fixes(message, pytree.tree_map(hide, dynamic_shapes))
    return pytree.tree_map(lambda dim: hints[-dim - 1] if isinstance(dim, int) and dim < 0 else dim, refined)


def _suggested_fixes(message: str) -> dict[str, str]:
    """``{dim name: fix}`` from the "Suggested fixes:" lines (``seq = Dim('seq', max=128)``,
    ``h = 2*_h``, ``batch = 3``), the fix text as torch wrote it."""
    fixes = {}
    for line in message.split("Suggested fixes:", 1)[1].strip().splitlines():
        name, separator, fix = line.strip().partition(" = ")
        if separator:
            fixes[name] = fix.strip()
    return fixes


def _describe(name: str, fix: str) -> DimRefinement:
    bounds = re.fullmatch(r"Dim\('[^']*',?\s*(.*)\)", fix)
    if bounds:
        return DimRefinement(name, bounds.group(1))
    return DimRefinement(name, f"= {fix}")


# -- where the model fixes a dim ------------------------------------------------------------------

_SHAPE_LOG = logging.getLogger("torch.fx.experimental.symbolic_shapes")
# A symbol becomes a constant by a replacement (``view(3, -1)`` solving for it) or by a guard that
# holds only at the example (``if x.shape[0] == 1``).
_FIXED_TO_CONSTANT = re.compile(r"(?:set_replacement (\S+) = (-?\d+) |eval Eq\((\S+), (-?\d+)\) \[guard added\])")


class _SpecializationLines(logging.Handler):
    """Records the model line that is running when torch's shape environment fixes a symbol to a
    constant, and the first one running when it adds a guard that fails at another size the
    symbols' ranges allow (the Python stack at the time of its log call)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[int, str]] = []  # (constant, model line)
        self.first_narrowing: str | None = None  # a model line whose guard holds at some sizes only

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        fixed = _FIXED_TO_CONSTANT.match(message)
        line = model_line(traceback.extract_stack()) if fixed else None
        if line is not None:
            self.lines.append((int(fixed.group(2) or fixed.group(4)), line))
        if self.first_narrowing is None and "[guard added]" in message and _guard_narrows(sys._getframe()):
            self.first_narrowing = model_line(traceback.extract_stack())


def _guard_narrows(frame: Any) -> bool:
    """Whether the guard that torch's ``ShapeEnv._log_guard`` (a caller of ``frame``) is adding
    fails at a size its symbols' ranges allow: ``seq // 64 == 1`` (a Python loop over chunks)
    does, ``seq % 64 < 64`` does not. Each symbol is tried alone at a few sizes around its
    example."""
    while frame is not None and frame.f_code.co_name != "_log_guard":
        frame = frame.f_back
    if frame is None:
        return False
    guard, shape_env = frame.f_locals.get("g"), frame.f_locals.get("self")
    examples = getattr(shape_env, "backed_var_to_val", None) or getattr(shape_env, "var_to_val", {})
    ranges = getattr(shape_env, "var_to_range", {})
    if not isinstance(guard, sympy.Basic) or not guard.free_symbols <= set(examples):
        return False
    at_example = {symbol: sympy.Integer(examples[symbol]) for symbol in guard.free_symbols}
    for symbol in guard.free_symbols:
        bounds = ranges.get(symbol)
        example = int(examples[symbol])
        for size in {example - 1, example + 1, 2 * example, example + 63, example + 64, 3 * example + 129}:
            if bounds is not None and not (bounds.lower <= size <= bounds.upper):
                continue
            try:
                holds = guard.xreplace({**at_example, symbol: sympy.Integer(size)})
            except Exception:  # a function of sizes sympy cannot evaluate there
                continue
            if holds is sympy.false:
                return True
    return False


@contextlib.contextmanager
def _specializations_recorded() -> Iterator[_SpecializationLines]:
    handler = _SpecializationLines()
    level, handlers, propagate = _SHAPE_LOG.level, _SHAPE_LOG.handlers, _SHAPE_LOG.propagate
    # torch's own handlers would print every shape guard of this repeated capture.
    _SHAPE_LOG.handlers, _SHAPE_LOG.propagate = [handler], False
    _SHAPE_LOG.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        _SHAPE_LOG.handlers, _SHAPE_LOG.propagate = handlers, propagate
        _SHAPE_LOG.setLevel(level)


def _specializing_line(
    sizes: set[int], capture: Callable[..., Any], module, args, kwargs, dynamic_shapes
) -> str | None:
    """The model line that fixes a dim to one of ``sizes``, or else the first whose guard fails at
    other sizes (Qwen3-Next's Python loop over ``seq`` in chunks of 64 fixes their count, and so
    ``seq``): capture runs once more (only on this error path) with torch's shape log recorded,
    which costs a stack walk per guard."""
    with _specializations_recorded() as recorded, contextlib.suppress(Exception):
        capture(module, args, kwargs, dynamic_shapes)
    return next((line for size, line in recorded.lines if size in sizes), recorded.first_narrowing)
