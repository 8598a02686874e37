"""Guards torch.export recorded but did not check.

While tracing, torch's shape environment records a guard for every question the model asks
about a dynamic size (``if h > w``, ``int(h * 0.5)``): the graph is right only where the guards
hold. torch.export proves each guard over the declared ranges or refuses the spec, but some of
them pass its solver unchecked: guards on float arithmetic of sizes (torchvision's
``int(math.ceil(float(h) / 32) * 32)`` gives ``Eq(TruncToInt(...), 96)``) or on the minimum and
maximum of sizes (``(128 / Max(h, w)) >= (64 / Min(h, w))``), and on remainders of the root of
a derived dim (Swin's ``(4 - _w % 4) % 4 <= 0``: no padding to whole windows). The graph then
holds the example's answer, and is wrong at other sizes with nothing said.

:func:`check_guards_hold` evaluates every recorded guard at sizes spread over the declared
ranges (their ends, around the example, and seeded random points, all dims at once and each on
its own) and raises :class:`UncheckedGuards` naming each guard false somewhere, with its model
line and a size where it fails. This is a test, not a proof: it finds a guard that fails at
most sizes (an equality, a branch) at once, and one that fails at a few sizes only by chance.
With it go the declared dims' narrowings under which the failing guards hold (a minimum, or the
example's class modulo a period), which dynamic-shape refinement applies before capturing again.
A dim declared by a hint (``dynamic_axes``, ``Dim.AUTO``) is drawn from its declared minimum and
the model's plain conditions on it are evaluated too: torch.export narrows a hint's range to
the traced branch without a word (:func:`_hinted_roots`).

Guards torch's own kernels ask are left out of that evaluation (module doc of
:func:`_asked_by_the_model`), but one of them can still put the example's size into the graph:
broadcasting a size that is 1 at the example against a missing dim (``torch.arange(rows) *
stride``, ``stride`` 0-d) gives the result torch's literal 1, not ``rows``; translated, that
shape became a constant (RetinaNet's coarsest anchor grid, one row high at a 120x150 example, a
Reshape to ``[1, 1]`` that failed at every other size). Where a guard of a kernel's finds a size
equal to a number at the example and is false at sampled sizes, :func:`check_guards_hold`
propagates the graph's shapes at such sizes (fake tensors, no values: data-dependent sizes stay
symbolic) and compares each node's sizes with the ones recorded at capture, evaluated there;
a size recorded as a number that the graph computes otherwise, and that later nodes' sizes were
traced from, is refused with that guard. A kernel that only asked (the contiguity of
``torch.chunk``'s last piece of 1) left the size symbolic, and the sizes agree.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import random
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

import sympy
import torch
import torch.utils._sympy.functions as _functions
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP, ShapeEnv
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.printers import PythonPrinter

from dynexport.errors import source_line

__all__ = ["SizeFix", "UncheckedGuards", "asked_at", "check_guards_hold", "input_dim", "period_it_needs"]

# Sizes drawn for a dim without an upper bound stay below this (the range dynamic-shape
# refinement checks an unbounded dim over).
UNBOUNDED_LIMIT = 4096
_RANDOM_POINTS = 48
# Every combination of range ends is drawn for up to this many dims (2**6 points).
_MOST_DIMS_AT_ALL_ENDS = 6
# A guard holding only on a lattice of sizes (a remainder's branch) is tried with periods up to this.
_LARGEST_PERIOD = 256
# The functions of sizes torch.export's solver reasons about (DimConstraints); it drops guards
# on any other (float conversions, TruncToInt, Min, Max, ...). Floor division is audited too:
# the solver checks it for a named Dim, but not for a dim declared by a hint (dynamic_axes'
# Dim.DYNAMIC), where DINOv2's `(h // 14) ** 2 == 256` (no interpolation at the config's size)
# passed unchecked.
_UNSOLVED_FUNCTIONS = tuple(
    function
    for function in vars(_functions).values()
    if isinstance(function, sympy.FunctionClass)
    and function not in (sympy.core.function.Application, _functions.Mod, _functions.PythonMod)
)
# UncheckedGuards lists at most this many guards (CaptureError shows four "- " lines).
_SHOWN = 4
# The graph's shapes are propagated at no more sizes than this (each a pass over the graph with
# fake tensors) when kernels' guards on sizes equal to numbers are false at sampled sizes.
_MOST_PROPAGATIONS = 3


@dataclasses.dataclass(frozen=True)
class SizeFix:
    """A declared dim narrowed to where guards hold: sizes from ``minimum`` on, or the sizes
    ``period * k + offset``."""

    minimum: int | None = None
    period: int = 1
    offset: int = 0


class UncheckedGuards(Exception):
    """The captured graph assumes conditions on dynamic sizes that torch.export did not check
    and that are false at some sizes of the declared ranges. ``problems`` has one line per
    guard: the condition, the model line that asked it, and a size where it is false.
    ``fixes`` (``{dim name: SizeFix}``, empty when there is none): narrowed so, the declared
    dims hold the guards at the sizes tried (Swin's ``if min(h, w) <= window`` holds from a
    minimum on, its ``if pad > 0`` on multiples of the window)."""

    def __init__(self, problems: list[str], fixes: dict[str, SizeFix] | None = None):
        self.problems = problems
        self.fixes = dict(fixes or {})
        shown = problems[:_SHOWN]
        super().__init__(
            "\n".join(
                [f"the graph assumes {len(problems)} condition(s) on dynamic sizes that torch.export did not check:"]
                + [f"- {problem}" for problem in shown]
                + ([f"- ... and {len(problems) - len(shown)} more (this reason's .problems)"] if len(problems) > len(shown) else [])
            )
        )


def check_guards_hold(
    program: torch.export.ExportedProgram, hinted_minimums: Mapping[tuple[str, int], int] | None = None
) -> None:
    """Raise :class:`UncheckedGuards` if a guard torch recorded while capturing ``program`` is
    false at some sizes of its inputs' dynamic ranges (module doc). ``hinted_minimums``: the
    minimum declared for each ``(input, axis)`` declared by a hint (``dynamic_axes``,
    ``Dim.AUTO``), from which its sizes are drawn (:func:`_hinted_roots`)."""
    inputs = _user_inputs(program)
    shape_env = _shape_env(inputs)
    if shape_env is None or not shape_env.guards:
        return
    sizes = {name: [shape_env.replace(_expr(size)) for size in value.shape] for name, value in inputs.items()}
    roots = sorted(
        {symbol for dims in sizes.values() for expr in dims for symbol in expr.free_symbols}, key=lambda s: s.name
    )
    if not roots:
        return
    hinted = _hinted_roots(sizes, hinted_minimums or {})
    guards = _guards_on(shape_env, set(roots), set(hinted))
    ranges = {root: _sampled_range(shape_env, root, hinted.get(root)) for root in roots}
    failures: dict[int, dict[sympy.Symbol, int]] = {}
    for point in _points(shape_env, ranges):
        for index, guard in enumerate(guards):
            if index not in failures and not guard.holds(point):
                failures[index] = point
    if failures:
        names = _dim_names(sizes, shape_env)
        raise UncheckedGuards(
            [_problem(guards[index], point, names) for index, point in sorted(failures.items())],
            _declared_fixes(shape_env, guards, [guards[index] for index in failures], ranges, names),
        )
    _check_sizes_kept(program, shape_env, set(roots), ranges, _dim_names(sizes, shape_env))


def period_it_needs(shape_env: Any, guard: Any) -> tuple[sympy.Symbol, int] | None:
    """``(root, k)`` where ``guard``, just recorded, is one :func:`check_guards_hold` audits (a
    condition the model asked that torch.export leaves unchecked), reads one size symbol ``root``,
    and holds at the multiples of ``k > 1`` in its range but not at every size: the audit would
    find it false and narrow ``root`` to those multiples. None for any other guard."""
    condition = shape_env.replace(guard.expr)
    if len(condition.free_symbols) != 1 or not (_fixes_a_size(condition) and _asked_by_the_model(guard)):
        return None
    (root,) = condition.free_symbols
    if root not in shape_env.backed_var_to_val:
        return None
    lower, upper = _sampled_range(shape_env, root)
    example = _example(shape_env, root)
    found = _sizes_where_it_holds(_Guard(condition, ""), root, {root: example}, (lower, upper))
    if found is None:
        return None
    period, minimum = found
    if period == 1 or example % period or minimum > -(-lower // period) * period:
        return None
    return root, period


def _user_inputs(program: torch.export.ExportedProgram) -> dict[str, Any]:
    user_inputs = set(program.graph_signature.user_inputs)
    return {
        node.name: node.meta["val"]
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user_inputs and isinstance(node.meta.get("val"), torch.Tensor)
    }


def _shape_env(inputs: dict[str, Any]):
    for value in inputs.values():
        fake_mode = getattr(value, "fake_mode", None)
        if fake_mode is not None and fake_mode.shape_env is not None:
            return fake_mode.shape_env
    return None


def _expr(size: Any) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


class _Guard:
    """A recorded guard over the input sizes: the condition with torch's replacements applied,
    and where the model asked it."""

    def __init__(self, condition: sympy.Basic, where: str):
        self.condition = condition
        self.where = where
        self.symbols = sorted(condition.free_symbols, key=lambda s: s.name)
        # Printed as torch prints guards for Dynamo's checks: Python over the sizes' names.
        self.code = compile(PythonPrinter().doprint(condition), "<guard>", "eval")

    def holds(self, point: dict[sympy.Symbol, int]) -> bool:
        try:
            return bool(eval(self.code, SYMPY_INTERP, {symbol.name: point[symbol] for symbol in self.symbols}))
        except (ZeroDivisionError, ValueError, OverflowError):
            return False


def _hinted_roots(
    sizes: dict[str, list[sympy.Expr]], hinted_minimums: Mapping[tuple[str, int], int]
) -> dict[sympy.Symbol, int]:
    """``{root: declared minimum}`` of the roots that are input dims declared by a hint.

    torch.export narrows such a dim's range to where the guards of the traced path hold, without
    a word (``if x.shape[0] > 10`` traced at 12: from 11 on), where a named ``Dim`` is refused
    instead. Its sizes are drawn from the declared minimum and the model's guards on it
    audited, so that a minimum the model's code asked for becomes a refinement the graph's input
    checks enforce. (A narrowed maximum needs none: the checks enforce every maximum torch
    proved.) Its kernels' narrowings (an embedding bag's offsets of 3 or more) are not audited:
    their answers do not change the ops the graph holds."""
    hinted: dict[sympy.Symbol, int] = {}
    for name, dims in sizes.items():
        for axis, expr in enumerate(dims):
            if isinstance(expr, sympy.Symbol) and (name, axis) in hinted_minimums:
                hinted[expr] = max(hinted.get(expr, 0), hinted_minimums[name, axis])
    return hinted


def _guards_on(shape_env: Any, roots: set[sympy.Symbol], hinted: set[sympy.Symbol]) -> list[_Guard]:
    """The distinct recorded guards the model asked whose free symbols are all input sizes
    (guards on data, unbacked sizes, are checked at run time or refused by torch) and that
    torch's solver leaves unchecked (:func:`_fixes_a_size`), or that read hinted roots only and
    build a size or a branch into the graph (torch narrowed the hint's range to where they hold)."""
    return _distinct_guards(
        shape_env,
        roots,
        lambda guard, condition: _asked_by_the_model(guard)
        and (
            _fixes_a_size(condition)
            or (bool(condition.free_symbols) and condition.free_symbols <= hinted and _size_or_branch(condition))
        ),
    )


def _distinct_guards(shape_env: Any, roots: set[sympy.Symbol], keep: Any) -> list[_Guard]:
    """The recorded guards, once each as the shape environment's replacements leave them, that
    read only sizes of ``roots`` and that ``keep(guard, condition)``."""
    seen = set()
    guards = []
    for guard in shape_env.guards:
        condition = shape_env.replace(guard.expr)
        if condition in seen or not condition.free_symbols <= roots or not keep(guard, condition):
            continue
        seen.add(condition)
        guards.append(_Guard(condition, asked_at(guard)))
    return guards


def _fixes_a_size(condition: sympy.Basic) -> bool:
    """Whether ``condition`` builds a size or a branch into the graph (an equality of sizes to a
    number, an order between sizes, or a conjunction of those) and is one torch's solver drops
    unchecked: a conjunction, or a condition on float arithmetic, ``Min``/``Max`` or another
    function it does not reason about. Equalities of two expressions and inequations are left
    out: torch asks those about strides and contiguity (``Eq(Max(1, h), h)``, ``Ne(h*w, 6144)``),
    which decide memory layout, not values; and torch's solver checks the rest over the declared
    ranges itself (integer guards such as ``h % 2 == 0`` it refuses or refines)."""
    return _size_or_branch(condition) and (
        isinstance(condition, sympy.And) or condition.has(*_UNSOLVED_FUNCTIONS) or _modular(condition)
    )


def _modular(condition: sympy.Basic) -> bool:
    """Whether ``condition`` compares a remainder of sizes (``Eq(Mod(w // 4, 2), 0)``, Swin's
    ``(4 - w % 4) % 4 <= 0``: no padding to whole windows, so no crop back). torch's solver leaves
    such a guard on the root of a derived dim unchecked (``w = 4*_w`` where the model pads
    ``w // 4`` in Python: FocalNet's downsampling, Swin's windows) and only the ExportedProgram's
    module checks it at run time, which an ONNX graph cannot."""
    return isinstance(condition, (sympy.Eq, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge)) and condition.has(
        _functions.Mod, _functions.PythonMod, sympy.Mod
    )


def _asked_by_the_model(guard: Any) -> bool:
    """Whether the model's code asked the guard (its own or a model library's, which Dynamo
    evaluates in strict capture, or Python's ``min``/``max`` that non-strict capture answers for
    it), rather than torch's kernels: memory layout (contiguity, stride order, memory format), the
    path of reshape's view algorithm, or the decomposition behind an operator's shape function —
    questions whose answers do not change the values of the ops recorded in the graph."""
    frame = getattr(guard.sloc, "framework_loc", None)
    if not isinstance(frame, traceback.FrameSummary):
        return True
    filename = frame.filename.replace(os.sep, "/")
    if "/torch/" not in filename:
        return True
    return "/torch/_dynamo/" in filename or filename.endswith("/torch/_export/non_strict_utils.py")


def _size_or_branch(condition: sympy.Basic) -> bool:
    if isinstance(condition, sympy.And):
        return all(_size_or_branch(term) for term in condition.args)
    if isinstance(condition, sympy.Eq):
        return any(side.is_number for side in condition.args) and bool(condition.free_symbols)
    if isinstance(condition, (sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge)):
        # "a size is at least 2" (``e >= 2``, ``1 < e``): torch's assumption that sizes it
        # traces are not 0 or 1, made for intermediate sizes too (a feature map of one pixel);
        # graphs are taken to hold there, as torch.export takes them for inputs.
        return not (condition.lts.is_number and condition.lts <= 2)
    return False


def asked_at(guard: Any) -> str:
    """The line that asked the guard: the model's, or torch's when the question came from
    inside torch (non-strict export's own ``torch.min`` of sizes)."""
    location = guard.sloc
    frame = getattr(location, "maybe_user_loc", None) or getattr(location, "framework_loc", None)
    if isinstance(frame, traceback.FrameSummary):
        return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}: {(frame.line or "").strip()}'
    return str(frame or "")


def _sampled_range(shape_env: Any, root: sympy.Symbol, hinted_minimum: int | None = None) -> tuple[int, int]:
    """The sizes of ``root`` to draw from: its range (from ``hinted_minimum`` for a hinted root,
    :func:`_hinted_roots`), from 2 (torch traces sizes 0 and 1 as special cases) to its
    maximum, or below :data:`UNBOUNDED_LIMIT` when it has none."""
    bounds = shape_env.var_to_range[root]
    example = _example(shape_env, root)
    low = bounds.lower if hinted_minimum is None else hinted_minimum
    lower = max(int(low), 2) if low is not -int_oo else 2
    upper = int(bounds.upper) if bounds.upper is not int_oo else max(UNBOUNDED_LIMIT, 2 * example)
    return lower, max(lower, upper)


def _example(shape_env: Any, root: sympy.Symbol) -> int:
    return int(shape_env.backed_var_to_val[root])


def _points(shape_env: Any, ranges: dict[sympy.Symbol, tuple[int, int]]) -> Iterator[dict[sympy.Symbol, int]]:
    """Each dim alone at the ends of its range and around the example, the others at the
    example; then all dims at their ends together, at twice the example and at seeded random
    sizes."""
    example = {root: _example(shape_env, root) for root in ranges}
    for root, (lower, upper) in ranges.items():
        near = (lower, lower + 1, example[root] - 1, example[root] + 1, 2 * example[root], (lower + upper) // 2, upper - 1, upper)
        for size in near:
            if lower <= size <= upper:
                yield {**example, root: size}
    if len(ranges) <= _MOST_DIMS_AT_ALL_ENDS:
        for ends in itertools.product(*ranges.values()):
            yield dict(zip(ranges, ends))
    yield {root: min(2 * example[root], upper) for root, (lower, upper) in ranges.items()}
    draw = random.Random(0)
    for _ in range(_RANDOM_POINTS):
        yield {root: draw.randint(lower, upper) for root, (lower, upper) in ranges.items()}


def _declared_fixes(
    shape_env: Any,
    guards: list[_Guard],
    failing: list[_Guard],
    ranges: dict[sympy.Symbol, tuple[int, int]],
    positions: dict[sympy.Symbol, str],
) -> dict[str, SizeFix]:
    """``{dim: fix}`` narrowing the declared dims to sizes where the failing guards hold
    (:func:`_sizes_where_it_holds`, each root alone, the others at their examples), each dim by
    its ``Dim``'s name, or for a hint (``dynamic_axes``) by its input position (``x.shape[2]``);
    empty when a failing guard holds at no such sizes or reads another size. A root that some
    guard needs on a lattice gets the lattice only (the retried capture finds any minimum on it);
    minimums alone are tried first over the box they make, all at once (a guard coupling dims,
    ``h + w > 40``, fails at its lower corner)."""
    example = {root: _example(shape_env, root) for root in ranges}
    periods: dict[sympy.Symbol, int] = {}
    minimums: dict[sympy.Symbol, int] = {}
    for guard in failing:
        for root in guard.symbols:
            found = _sizes_where_it_holds(guard, root, example, ranges[root])
            if found is None:
                return {}
            period, minimum = found
            periods[root] = math.lcm(periods.get(root, 1), period)
            minimums[root] = max(minimums.get(root, ranges[root][0]), minimum)
    if any(period > 1 for period in periods.values()):
        fixes = {root: SizeFix(period=period, offset=example[root] % period) for root, period in periods.items() if period > 1}
    else:
        raised = {root: (max(lower, minimums.get(root, lower)), upper) for root, (lower, upper) in ranges.items()}
        if any(not guard.holds(point) for point in _points(shape_env, raised) for guard in guards):
            return {}
        fixes = {root: SizeFix(minimum=minimum) for root, minimum in minimums.items() if minimum > ranges[root][0]}
    names = {root: _declared_name(shape_env, root) or positions.get(root) for root in fixes}
    if None in names.values():
        return {}
    return {names[root]: fix for root, fix in fixes.items()}


def _sizes_where_it_holds(
    guard: _Guard, root: sympy.Symbol, example: dict[sympy.Symbol, int], bounds: tuple[int, int]
) -> tuple[int, int] | None:
    """``(period, minimum)``: the smallest period (1 first: every size) such that ``guard``
    holds at each size of ``root`` in the example's class modulo the period from ``minimum`` to
    the range's top, the other roots at their examples; None when there is none up to
    :data:`_LARGEST_PERIOD` with ``minimum`` at most the example, or when the class holds the
    example alone (Swin's ``pad_H <= 7``, true up to the example's size and false above it: no
    period leaves a second size, and a graph of one size is no narrowing)."""
    lower, upper = bounds
    for period in range(1, _LARGEST_PERIOD + 1):
        top = upper - (upper - example[root]) % period  # the class's top member
        size = top
        while size >= lower and guard.holds({**example, root: size}):
            size -= period
        if size < example[root]:
            return (period, size + period) if top > size + period else None
    return None


def _declared_name(shape_env: Any, root: sympy.Symbol) -> str | None:
    """The name of the ``Dim`` the user declared for ``root``: a dim's own (``h``), or the root
    of a derived dim (``_h`` of ``4*_h``, torch's source for that root); None for a hint
    (``Dim.DYNAMIC``, ``Dim.AUTO``), which has no name."""
    for source in shape_env.var_to_sources.get(root, ()):
        name = shape_env.source_name_to_debug_name.get(source.name, source.name)
        if name.isidentifier():
            return name
    return None


def input_dim(argument: str, axis: int | str) -> str:
    """How problems and fixes name an input's dim that no ``Dim`` names: ``x.shape[2]``."""
    return f"{argument}.shape[{axis}]"


def _dim_names(sizes: dict[str, list[sympy.Expr]], shape_env: Any) -> dict[sympy.Symbol, str]:
    """How problems name each root: the input dim it is (``x.shape[2]``), or the name of the
    derived dim's root it stands for (``_h``)."""
    names: dict[sympy.Symbol, str] = {}
    for name, dims in sizes.items():
        for axis, expr in enumerate(dims):
            if isinstance(expr, sympy.Symbol):
                names.setdefault(expr, input_dim(name, axis))
            for root in expr.free_symbols - names.keys():
                declared = _declared_name(shape_env, root)
                if declared is not None:
                    names[root] = declared
    return names


def _problem(guard: _Guard, point: dict[sympy.Symbol, int], names: dict[sympy.Symbol, str]) -> str:
    renamed = {symbol: sympy.Symbol(names.get(symbol, symbol.name)) for symbol in guard.symbols}
    at = ", ".join(f"{names.get(symbol, symbol.name)} = {point[symbol]}" for symbol in guard.symbols)
    where = f" ({guard.where})" if guard.where else ""
    return f"`{PythonPrinter().doprint(guard.condition.xreplace(renamed))}`{where} is false at {at}"


def _check_sizes_kept(
    program: torch.export.ExportedProgram,
    shape_env: Any,
    roots: set[sympy.Symbol],
    ranges: dict[sympy.Symbol, tuple[int, int]],
    names: dict[sympy.Symbol, str],
) -> None:
    """Raise :class:`UncheckedGuards` if the graph records a size as the number a kernel's guard
    found it equal to at the example, where at other sampled sizes the graph computes another
    (module doc). The graph's shapes are propagated at up to :data:`_MOST_PROPAGATIONS` sizes
    where such guards are false, each size making false one that the sizes before did not."""
    equalities = _kernel_equalities(shape_env, roots)
    if not equalities:
        return
    example = {root: _example(shape_env, root) for root in ranges}
    pinned = _pinned_roots(equalities, ranges, example)
    # Nearest the example first: the size the refusal suggests exporting at.
    points = sorted(
        (point for point in _points(shape_env, ranges) if all(point[root] == example[root] for root in pinned)),
        key=lambda point: sum(abs(point[root] - example[root]) for root in point),
    )
    covered: set[int] = set()
    propagations = 0
    for point in points:
        if len(covered) == len(equalities) or propagations == _MOST_PROPAGATIONS:
            return
        false = {index for index, guard in enumerate(equalities) if not guard.holds(point)} - covered
        if not false:
            continue
        covered |= false
        propagations += 1
        changed = _size_changed(program, shape_env, point)
        if changed is not None:
            suggested = _example_avoiding(shape_env, roots, equalities, points)
            raise UncheckedGuards([_replaced_size_problem(changed, equalities, point, suggested, names)])


def _example_avoiding(
    shape_env: Any, roots: set[sympy.Symbol], equalities: list[_Guard], points: list[dict[sympy.Symbol, int]]
) -> dict[sympy.Symbol, int] | None:
    """The first of ``points`` where none of the kernels' equalities that vary holds, and every
    recorded "this size is not empty" does (a feature map or a resized image of 0 rows is no
    example); None when there is none."""
    orders = _distinct_guards(shape_env, roots, lambda guard, condition: _not_empty(condition))
    varying = [guard for guard in equalities if any(not guard.holds(point) for point in points)]
    return next(
        (
            point
            for point in points
            if not any(guard.holds(point) for guard in varying) and all(guard.holds(point) for guard in orders)
        ),
        None,
    )


def _not_empty(condition: sympy.Basic) -> bool:
    """Whether ``condition`` says sizes are positive (``e > 0``, ``e >= 1``, or a conjunction or
    disjunction of those: a convolution's output size check)."""
    if isinstance(condition, (sympy.And, sympy.Or)):
        return all(_not_empty(term) for term in condition.args)
    if isinstance(condition, (sympy.Lt, sympy.Gt)):
        return condition.lts.is_number and condition.lts == 0 and not condition.gts.is_number
    if isinstance(condition, (sympy.Le, sympy.Ge)):
        return condition.lts.is_number and condition.lts == 1 and not condition.gts.is_number
    return False


def _pinned_roots(
    equalities: list[_Guard], ranges: dict[sympy.Symbol, tuple[int, int]], example: dict[sympy.Symbol, int]
) -> set[sympy.Symbol]:
    """The roots whose sizes the kernels' equalities admit at the example only among those tried
    (``x.view(-1, 2).view(1, -1)`` exported at 2 elements: ``x // 2 == 1`` and ``x % 2 == 0``).
    The graph is then the example's, which :func:`dynexport.pinned_dims.warn_if_dims_pinned`
    warns of (a ``dynamic_axes`` dim that torch.onnx lets torch specialise); their sizes stay
    the example's here. Equalities of two sizes (layout: ``Max(1, h) == h``, a padded size equal
    to the unpadded one) are no part of this."""
    pinned = set()
    for root, (lower, upper) in ranges.items():
        others = {lower, lower + 1, example[root] - 1, example[root] + 1, 2 * example[root], upper} - {example[root]}
        sizes = [size for size in others if lower <= size <= upper]
        if not any(all(guard.holds({**example, root: size}) for guard in equalities) for size in sizes):
            pinned.add(root)
    return pinned


def _kernel_equalities(shape_env: Any, roots: set[sympy.Symbol]) -> list[_Guard]:
    """The distinct recorded guards that find a size of the inputs' roots equal to a number
    (``Eq((h // 32 - 1) // 4 + 1, 1)``). Those the model asked and the audit evaluates hold at
    every sampled size by now; the others, torch's kernels', may have put the number in the graph."""
    return _distinct_guards(
        shape_env, roots,
        lambda guard, condition: (
            isinstance(condition, sympy.Eq) and any(side.is_number for side in condition.args)
            and bool(condition.free_symbols)
        ),
    )


@dataclasses.dataclass(frozen=True)
class _SizeChange:
    """A node whose size ``axis`` (None: the node is a size itself) was recorded as ``recorded``
    at capture, evaluated at a point, and is ``computed`` when the graph's shapes are propagated
    there; ``later``, a node after it whose sizes differ too."""

    node: torch.fx.Node
    axis: int | None
    recorded: int
    computed: int
    later: torch.fx.Node | None = None


class _Changed(Exception):
    def __init__(self, change: _SizeChange, later: torch.fx.Node):
        self.change = change
        self.later = later


class _SizePropagation(torch.fx.Interpreter):
    """Runs the graph on fake tensors of the sizes at a point, comparing each node's sizes with
    those recorded at capture evaluated there; stops at the second node whose sizes differ
    (:class:`_Changed`, with the first). A size that differs on one node alone (a graph output:
    ``upsample_nearest2d`` to a side of 1 at the example) only types that value wrongly; one
    that later nodes' sizes were traced from (``arange(rows) * stride`` into a meshgrid) is
    built into their shapes, which the translation writes as constants where they are numbers."""

    def __init__(self, module: torch.fx.GraphModule, shape_env: Any, point: dict[sympy.Symbol, int]):
        super().__init__(module)
        self.recorded_shape_env = shape_env
        self.point = point
        self.compiled: dict[sympy.Expr, Any] = {}
        self.first: _SizeChange | None = None

    def run_node(self, node: torch.fx.Node) -> Any:
        result = super().run_node(node)
        recorded, recorded_spec = torch.utils._pytree.tree_flatten(node.meta.get("val"))
        computed, computed_spec = torch.utils._pytree.tree_flatten(result)
        if node.op == "placeholder" or recorded_spec != computed_spec:
            return result
        for before, now in zip(recorded, computed):
            if isinstance(before, torch.Tensor) and isinstance(now, torch.Tensor) and before.dim() == now.dim():
                for axis, (size, computed_size) in enumerate(zip(before.shape, now.shape)):
                    self._compare(node, axis, size, computed_size)
            elif isinstance(before, torch.SymInt):
                self._compare(node, None, before, now)
        return result

    def _compare(self, node: torch.fx.Node, axis: int | None, size: Any, computed: Any) -> None:
        if isinstance(computed, torch.SymInt):
            computed = computed.node.maybe_as_int()  # None for a data-dependent size
        recorded = self.value_at(size)
        if not isinstance(computed, int) or recorded is None or recorded == computed:
            return
        if self.first is None:
            self.first = _SizeChange(node, axis, recorded, computed)
        elif node is not self.first.node:
            raise _Changed(self.first, node)

    def value_at(self, size: Any) -> int | None:
        """``size`` (an int or a SymInt of the capture) at the point; None when it reads a size
        of data or cannot be evaluated."""
        expr = self.recorded_shape_env.replace(_expr(size))
        if expr.is_number:
            return int(expr)
        if not expr.free_symbols <= self.point.keys():
            return None
        if expr not in self.compiled:
            self.compiled[expr] = compile(PythonPrinter().doprint(expr), "<size>", "eval")
        try:
            values = {symbol.name: self.point[symbol] for symbol in expr.free_symbols}
            return int(eval(self.compiled[expr], SYMPY_INTERP, values))
        except (ZeroDivisionError, ValueError, OverflowError, TypeError):
            return None


def _size_changed(
    program: torch.export.ExportedProgram, shape_env: Any, point: dict[sympy.Symbol, int]
) -> _SizeChange | None:
    """The first node whose sizes, propagated through the graph from inputs of the sizes at
    ``point``, differ from those recorded at capture, when a later node's differ too; None when
    no two do, or when the propagation cannot tell (an input it cannot size, an operator that
    fails on fake tensors or at these sizes: a failure is not evidence of a constant)."""
    propagation = _SizePropagation(program.graph_module, shape_env, point)
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    inputs = []
    with mode:
        for node in program.graph.nodes:
            if node.op != "placeholder":
                continue
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                shape = [propagation.value_at(size) for size in value.shape]
                stride = [propagation.value_at(size) for size in value.stride()]
                if None in shape:
                    return None
                if None in stride:
                    inputs.append(torch.empty(shape, dtype=value.dtype, device=value.device))
                else:
                    inputs.append(torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device))
            elif isinstance(value, torch.SymInt):
                size = propagation.value_at(value)
                if size is None:
                    return None
                inputs.append(size)
            else:
                inputs.append(value)
        try:
            propagation.run(*inputs, enable_io_processing=False)
        except _Changed as changed:
            return dataclasses.replace(changed.change, later=changed.later)
        except Exception as error:  # noqa: BLE001 - see the docstring
            logging.getLogger(__name__).debug("shapes not propagated at %s: %s", point, error)
    if propagation.first is not None:
        logging.getLogger(__name__).debug("only %s's sizes differ at %s", propagation.first.node, point)
    return None


def _replaced_size_problem(
    change: _SizeChange,
    equalities: list[_Guard],
    point: dict[sympy.Symbol, int],
    suggested: dict[sympy.Symbol, int] | None,
    names: dict[sympy.Symbol, str],
) -> str:
    """The guard behind ``change`` (one false at ``point`` that found a size equal to the number
    recorded), the model line of the node, and the fixes: an example where none of the kernels'
    equalities that vary holds (``suggested``, None when no size tried is one), or ranges over
    which the size keeps the number."""

    def sizes(values: dict[sympy.Symbol, int]) -> str:
        return ", ".join(sorted(f"{names.get(root, root.name)} = {size}" for root, size in values.items()))

    guard = next(
        (guard for guard in equalities if not guard.holds(point) and change.recorded in guard.condition.args),
        next((guard for guard in equalities if not guard.holds(point)), None),
    )
    where = source_line(change.node)
    size = f"size {change.axis} of {change.node.name}" if change.axis is not None else change.node.name
    condition = ""
    if guard is not None:
        renamed = {symbol: sympy.Symbol(names.get(symbol, symbol.name)) for symbol in guard.symbols}
        text = PythonPrinter().doprint(guard.condition.xreplace(renamed))
        condition = f"`{text}` ({guard.where}) is false at {sizes(point)}: "
    traced_from = f" (and the sizes of {change.later.name} were traced from it)" if change.later is not None else ""
    example = f"such as {sizes(suggested)}" if suggested is not None else "none of the sizes tried avoids them all"
    return (
        f"{condition}torch's kernels found it true at the example and wrote {change.recorded} for the {size}"
        f"{f' ({where})' if where else ''}, which the graph computes as {change.computed} there{traced_from}; "
        f"export at an example where no such size is the example's ({example}), or declare ranges over "
        f"which it stays {change.recorded}"
    )
