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
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import traceback
from collections.abc import Iterator
from typing import Any

import sympy
import torch
import torch.utils._sympy.functions as _functions
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.printers import PythonPrinter

__all__ = ["SizeFix", "UncheckedGuards", "check_guards_hold"]

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


def check_guards_hold(program: torch.export.ExportedProgram) -> None:
    """Raise :class:`UncheckedGuards` if a guard torch recorded while capturing ``program`` is
    false at some sizes of its inputs' dynamic ranges (module doc)."""
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
    guards = _guards_on(shape_env, set(roots))
    if not guards:
        return
    ranges = {root: _sampled_range(shape_env, root) for root in roots}
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


def _guards_on(shape_env: Any, roots: set[sympy.Symbol]) -> list[_Guard]:
    """The distinct recorded guards whose free symbols are all input sizes (guards on data,
    unbacked sizes, are checked at run time or refused by torch)."""
    seen = set()
    guards = []
    for guard in shape_env.guards:
        condition = shape_env.replace(guard.expr)
        if (
            condition in seen
            or not _fixes_a_size(condition)
            or not condition.free_symbols <= roots
            or not _asked_by_the_model(guard)
        ):
            continue
        seen.add(condition)
        guards.append(_Guard(condition, _where(guard)))
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


def _where(guard: Any) -> str:
    """The line that asked the guard: the model's, or torch's when the question came from
    inside torch (non-strict export's own ``torch.min`` of sizes)."""
    location = guard.sloc
    frame = getattr(location, "maybe_user_loc", None) or getattr(location, "framework_loc", None)
    if isinstance(frame, traceback.FrameSummary):
        return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}: {(frame.line or "").strip()}'
    return str(frame or "")


def _sampled_range(shape_env: Any, root: sympy.Symbol) -> tuple[int, int]:
    """The sizes of ``root`` to draw from: its range, from 2 (torch traces sizes 0 and 1 as
    special cases) to its maximum, or below :data:`UNBOUNDED_LIMIT` when it has none."""
    bounds = shape_env.var_to_range[root]
    example = _example(shape_env, root)
    lower = max(int(bounds.lower), 2) if bounds.lower is not -int_oo else 2
    upper = int(bounds.upper) if bounds.upper is not int_oo else max(UNBOUNDED_LIMIT, 2 * example)
    return lower, max(lower, upper)


def _example(shape_env: Any, root: sympy.Symbol) -> int:
    return int(shape_env.backed_var_to_val[root])


def _points(shape_env: Any, ranges: dict[sympy.Symbol, tuple[int, int]]) -> Iterator[dict[sympy.Symbol, int]]:
    """Each dim alone at the ends of its range and around the example, the others at the
    example; then all dims at their ends together and at seeded random sizes."""
    example = {root: _example(shape_env, root) for root in ranges}
    for root, (lower, upper) in ranges.items():
        near = (lower, lower + 1, example[root] - 1, example[root] + 1, 2 * example[root], (lower + upper) // 2, upper - 1, upper)
        for size in near:
            if lower <= size <= upper:
                yield {**example, root: size}
    if len(ranges) <= _MOST_DIMS_AT_ALL_ENDS:
        for ends in itertools.product(*ranges.values()):
            yield dict(zip(ranges, ends))
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
    :data:`_LARGEST_PERIOD` with ``minimum`` at most the example."""
    lower, upper = bounds
    for period in range(1, _LARGEST_PERIOD + 1):
        size = upper - (upper - example[root]) % period  # the class's top member
        while size >= lower and guard.holds({**example, root: size}):
            size -= period
        if size < example[root]:
            return period, size + period
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


def _dim_names(sizes: dict[str, list[sympy.Expr]], shape_env: Any) -> dict[sympy.Symbol, str]:
    """How problems name each root: the input dim it is (``x.shape[2]``), or the name of the
    derived dim's root it stands for (``_h``)."""
    names: dict[sympy.Symbol, str] = {}
    for name, dims in sizes.items():
        for axis, expr in enumerate(dims):
            if isinstance(expr, sympy.Symbol):
                names.setdefault(expr, f"{name}.shape[{axis}]")
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
