"""The inputs an exported graph is valid for, checked at call time.

torch.export proves the graph for a set of inputs: each dim of a tensor input (and each symbolic
int input) is a static size, a symbol in a range (``Dim("b", max=8)``), the same symbol as another
input's dim (an equality) or an expression of symbols (``past + seq``, ``2*h``). Outside that set
the graph may take a branch the model would not take and answer wrongly without a word, so
:class:`InputGuards` refuses such a call with a ``ValueError`` naming the input, the axis and what
was allowed. Python numbers the export baked into the graph are guarded too: another value would
be ignored.

The same facts go into the ONNX model's metadata for other runtimes (``INPUT_DIMS_KEY``,
``DIM_RANGES_KEY``, ``BAKED_INPUTS_KEY``, JSON).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import onnx_ir as ir
import sympy
import torch
from torch.utils._sympy.functions import Max, Min
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from dynexport.call_convention import is_graph_input, placeholders, user_input_specs
from dynexport.dim_refinement import DIM_REFINEMENTS_KEY

__all__ = [
    "BAKED_INPUTS_KEY",
    "DIM_RANGES_KEY",
    "INPUT_DIMS_KEY",
    "InputGuards",
    "accepted_minimums",
    "dim_minimums",
    "minimums_while_translating",
    "size_bounds",
    "symbol_minimums",
]

# {input: [dim, ...]}: each dim an int (static) or a dim name or expression (``batch``,
# ``past + seq``); a symbolic int input has a one-entry list.
INPUT_DIMS_KEY = "pkg.dynexport.input_dims"
# {dim or expression: [min, max]} as checked, max null when unbounded.
DIM_RANGES_KEY = "pkg.dynexport.dim_ranges"
# {argument: value}: the Python numbers (and None) the export built into the graph.
BAKED_INPUTS_KEY = "pkg.dynexport.baked_inputs"


@dataclasses.dataclass(frozen=True)
class _Dim:
    """One size the graph takes: axis ``axis`` of input ``input`` (None for an int input),
    proved to be ``expr``."""

    input: str
    axis: int | None
    expr: sympy.Expr
    name: str

    def where(self) -> str:
        return f"input {self.input!r}" if self.axis is None else f"input {self.input!r} dim {self.axis}"


@dataclasses.dataclass(frozen=True)
class _Input:
    """A fed input: a tensor's dims, or a symbolic int (one dim, axis None)."""

    name: str
    dims: list[_Dim]
    is_int: bool


@dataclasses.dataclass
class InputGuards:
    """What torch.export proved about the inputs of a program; :meth:`check` a call's inputs.

    ``dims`` has one entry per fed input (None for an input without sizes to check), each dim
    named as in the ONNX model; ``ranges`` the ``(min, max)`` of each dim (max None when
    unbounded); ``baked`` the constant user inputs by argument name.

    Every maximum torch proved is enforced. A minimum where the model demanded it (a
    dynamic-shape refinement ``min=``), else the one the user declared (``Dim(name, min=...)``,
    also when the model expressed the dim through others: ``h = 32*_h``), else none
    (:func:`dim_minimums`): torch gives every dynamic dim a minimum of its own while tracing (2,
    from specializing sizes 0 and 1, and more for dims derived from it), an assumption the graph
    rarely depends on, and which would refuse inputs the user declared dynamic and the graph
    computes right (an embedding bag's offsets of size 2). A derived dim's range is its own, not
    its root's. Translation reads the same minimums (``least_value``), so the checks refuse every
    size a rule took to be impossible.
    """

    dims: list[_Input | None]
    ranges: dict[sympy.Expr, tuple[int, int | None]]
    baked: dict[str, Any]

    @classmethod
    def of(
        cls,
        program: torch.export.ExportedProgram,
        model: ir.Model,
        declared_minimums: Mapping[str, int] | None = None,
    ) -> InputGuards:
        """The guards of ``program``, whose fed inputs are ``model``'s (dims named as there);
        ``declared_minimums`` are the minimums of the user's Dims, by name."""
        graph = model.graph
        nodes = placeholders(program)
        fed = [v for v in graph.inputs if not v.is_initializer()]
        specs = [s for s in user_input_specs(program) if is_graph_input(s)]
        dims: list[_Input | None] = []
        for spec, value in zip(specs, fed):
            val = nodes[spec.arg.name].meta.get("val")
            if isinstance(val, torch.Tensor):
                onnx_dims = list(value.shape) if value.shape is not None else [None] * val.dim()
                tensor_dims = [
                    _Dim(value.name, axis, _expr(size), _dim_name(size, onnx_dim))
                    for axis, (size, onnx_dim) in enumerate(zip(val.shape, onnx_dims))
                ]
                dims.append(_Input(value.name, tensor_dims, is_int=False))
            elif isinstance(val, torch.SymInt):
                size = _Dim(value.name, None, _expr(val), value.name)
                dims.append(_Input(value.name, [size], is_int=True))
            else:
                dims.append(None)
        names = {d.expr: d.name for entry in dims if entry for d in entry.dims}
        refined = json.loads(model.metadata_props.get(DIM_REFINEMENTS_KEY, "{}"))
        minimums = dim_minimums(program, names, declared_minimums or {}, refined)
        ranges = {
            expr: (minimums[expr], _bound(bounds.upper, None))
            for expr, bounds in program.range_constraints.items()
            if expr in names
        }
        baked = {
            spec.arg.name: spec.arg.value
            for spec in user_input_specs(program)
            if not is_graph_input(spec)
        }
        return cls(dims, ranges, baked)

    def renamed(self, rename: Callable[[str], str]) -> InputGuards:
        """The same guards with each dim's name passed through ``rename``."""
        dims = [
            entry if entry is None or entry.is_int  # an int input's "dim" is named after the input
            else dataclasses.replace(entry, dims=[dataclasses.replace(d, name=rename(d.name)) for d in entry.dims])
            for entry in self.dims
        ]
        return InputGuards(dims, self.ranges, self.baked)

    def metadata(self) -> dict[str, str]:
        """The guards as ONNX ``metadata_props``."""
        dims = {
            entry.name: [int(d.expr) if d.expr.is_Integer else d.name for d in entry.dims]
            for entry in self.dims
            if entry is not None
        }
        names = {d.expr: d.name for entry in self.dims if entry for d in entry.dims}
        ranges = {names[expr]: [low, high] for expr, (low, high) in self.ranges.items()}
        baked = {name: value for name, value in self.baked.items() if _is_json(value)}
        return {
            INPUT_DIMS_KEY: json.dumps(dims),
            DIM_RANGES_KEY: json.dumps(ranges),
            BAKED_INPUTS_KEY: json.dumps(baked),
        }

    def check_baked(self, leaves: list[Any], specs: list[Any]) -> None:
        """Raise ValueError when a call passes another value than the export for an argument
        the graph holds as a constant."""
        for leaf, spec in zip(leaves, specs):
            if is_graph_input(spec) or spec.arg.name not in self.baked:
                continue
            exported = self.baked[spec.arg.name]
            if isinstance(leaf, torch.Tensor) or type(leaf) is not type(exported) or leaf != exported:
                raise ValueError(
                    f"argument {spec.arg.name!r} was exported as the constant {exported!r}, which the "
                    f"graph holds; this call passes {_short(leaf)}. Call with {exported!r}, or export "
                    "again with this value (or pass a tensor to make it an input of the graph)"
                )

    def check(self, values: list[Any]) -> None:
        """Raise ValueError when a size of the fed ``values`` (tensors and ints, in the graph's
        input order) lies outside what the export proved."""
        bound: dict[sympy.Symbol, tuple[int, _Dim]] = {}
        derived: list[tuple[_Dim, int]] = []
        for entry, value in zip(self.dims, values):
            if entry is None:
                continue
            if entry.is_int:
                sizes = [value] if isinstance(value, int) and not isinstance(value, bool) else None
            else:
                sizes = list(value.shape) if isinstance(value, torch.Tensor) else None
                if sizes is not None and len(sizes) != len(entry.dims):
                    raise ValueError(
                        f"input {entry.name!r} has {len(sizes)} dims, the model was exported with "
                        f"{len(entry.dims)} (shape {self._shape_text(entry)})"
                    )
            if sizes is None:
                continue  # a value of the wrong kind is the feeding's error to report
            for dim, size in zip(entry.dims, sizes):
                expr = dim.expr
                if expr.is_Integer:
                    if size != int(expr):
                        raise ValueError(
                            f"{dim.where()} is {size}, the model was exported with the static size {int(expr)} "
                            f"there (shape {self._shape_text(entry)})"
                        )
                elif isinstance(expr, sympy.Symbol):
                    if expr in bound and bound[expr][0] != size:
                        other_size, other = bound[expr]
                        raise ValueError(
                            f"{dim.where()} is {size} but {other.where()} is {other_size}: the export "
                            f"proved them equal (both {dim.name})"
                        )
                    self._check_range(expr, size, dim)
                    bound[expr] = (size, dim)
                else:
                    derived.append((dim, size))
        self._check_derived(derived, bound)

    def _check_derived(self, derived: list[tuple[_Dim, int]], bound: dict) -> None:
        """Check the dims that are expressions of symbols, solving for a symbol that no plain
        dim carries (``2*_h``) from the first dim it appears in."""
        pending = list(derived)
        while pending:
            solvable = [(d, s) for d, s in pending if len(d.expr.free_symbols - bound.keys()) <= 1]
            if not solvable:
                return  # symbols no input pins down; nothing more to check
            for dim, size in solvable:
                pending.remove((dim, size))
                free = dim.expr.free_symbols - bound.keys()
                values = {s: v for s, (v, _) in bound.items()}
                if free:
                    (symbol,) = free
                    solutions = [
                        r for r in sympy.solve(sympy.Eq(dim.expr.subs(values), size), symbol)
                        if r.is_integer and r >= 0
                    ]
                    if not solutions:
                        raise ValueError(
                            f"{dim.where()} is {size}, which is no value of {dim.name} (the export "
                            f"proved that size)"
                        )
                    self._check_range(dim.expr, size, dim)
                    bound[symbol] = (int(solutions[0]), dim)
                    continue
                expected = int(dim.expr.subs(values))
                if size != expected:
                    sources = ", ".join(
                        f"{bound[s][1].where()} is {bound[s][1].name}"
                        for s in sorted(dim.expr.free_symbols, key=str)
                    )
                    raise ValueError(
                        f"{dim.where()} is {size}, the export proved it equal to {dim.name} = "
                        f"{expected} ({sources})"
                    )
                self._check_range(dim.expr, size, dim)

    def _check_range(self, expr: sympy.Expr, size: int, dim: _Dim) -> None:
        low, high = self.ranges.get(expr, (0, None))
        if size < low or (high is not None and size > high):
            allowed = f"[{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(
                f"{dim.where()} is {size}, outside the range {dim.name} {allowed} the model was "
                "exported for; the graph is only valid there"
            )

    def _shape_text(self, entry: _Input) -> str:
        return "[" + ", ".join(d.name for d in entry.dims) + "]"


def dim_minimums(
    program: torch.export.ExportedProgram,
    names: Mapping[sympy.Expr, str],
    declared_minimums: Mapping[str, int],
    refined: Mapping[str, str],
) -> dict[sympy.Expr, int]:
    """The least size the program accepts for each of its input dims (``names``: the dims by
    their expression, named as in the ONNX model), as :class:`InputGuards` checks it: a
    refinement's ``min=``, else the user's ``Dim(name, min=...)`` (also for a dim the model
    expressed through others: ``"h": "= 32*_h"``), else 0."""
    declared = dict(declared_minimums)
    for dim, change in refined.items():
        if change.startswith("= ") and dim in declared:
            declared.setdefault(change.removeprefix("= "), declared[dim])
    model_minimums = {dim for dim, change in refined.items() if re.search(r"\bmin=", change)}
    minimums = {
        expr: _bound(bounds.lower, 0) if names[expr] in model_minimums else declared.get(names[expr], 0)
        for expr, bounds in program.range_constraints.items()
        if expr in names
    }
    least = _sizes_eager_runs_at(program, symbol_minimums(minimums))
    for expr in minimums:
        if len(expr.free_symbols) == 1 and (symbol := next(iter(expr.free_symbols))) in least:
            bounds = size_bounds(expr, {symbol: ValueRanges(least[symbol], sympy.oo)})
            if bounds.lower.is_Integer:
                minimums[expr] = max(minimums[expr], int(bounds.lower))
    return minimums


# Operators PyTorch refuses to run when their output would have an empty spatial dim ("Kernel
# size can't be greater than actual input size", "Output size is too small"), with the number of
# spatial dims (None: the weight's rank less 2). Transposed convolutions may be empty.
_EMPTY_OUTPUT_REFUSED = {
    torch.ops.aten.convolution: None,
    torch.ops.aten._convolution: None,
    torch.ops.aten.conv1d: 1,
    torch.ops.aten.conv2d: 2,
    torch.ops.aten.conv3d: 3,
    torch.ops.aten.max_pool1d: 1,
    torch.ops.aten.max_pool1d_with_indices: 1,
    torch.ops.aten.max_pool2d: 2,
    torch.ops.aten.max_pool2d_with_indices: 2,
    torch.ops.aten.max_pool3d: 3,
    torch.ops.aten.max_pool3d_with_indices: 3,
    torch.ops.aten.avg_pool1d: 1,
    torch.ops.aten.avg_pool2d: 2,
    torch.ops.aten.avg_pool3d: 3,
}
# How far above a symbol's minimum to look for the least size a convolution runs at.
_SIZES_SEARCHED = 4096


def _sizes_eager_runs_at(
    program: torch.export.ExportedProgram, minimums: Mapping[sympy.Symbol, int]
) -> dict[sympy.Symbol, int]:
    """Each shape symbol's minimum raised to the least value at which every convolution and
    pooling of ``program`` has a non-empty output: below it PyTorch refuses to run the model, so
    no valid input is lost, and the rules may take those outputs (and the means over them) to be
    non-empty. A size is only raised where each smaller one empties the output (checked one by
    one from the minimum) and every larger one provably does not."""
    least = dict(minimums)
    for node in program.graph.nodes:
        spatial = _EMPTY_OUTPUT_REFUSED.get(getattr(node.target, "overloadpacket", None), 0)
        if spatial == 0 or not isinstance(output := node.meta.get("val"), torch.Tensor):
            continue
        if spatial is None:
            transposed = node.args[6] if len(node.args) > 6 else False
            weight = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
            if transposed or not isinstance(weight, torch.Tensor):
                continue
            spatial = weight.dim() - 2
        for size in output.shape[output.dim() - spatial:]:
            if isinstance(size, torch.SymInt) and len(size.node.expr.free_symbols) == 1:
                (symbol,) = size.node.expr.free_symbols
                least[symbol] = _least_nonempty(size.node.expr, symbol, least.get(symbol, 0))
    return {symbol: low for symbol, low in least.items() if low > minimums.get(symbol, 0)}


@functools.lru_cache(maxsize=4096)  # a network's convolutions share a few output sizes
def _least_nonempty(size: sympy.Expr, symbol: sympy.Symbol, low: int) -> int:
    """The least value from ``low`` up of ``symbol`` at which ``size`` is at least 1, where it
    provably stays so for every larger value; else ``low``."""
    for value in range(low, low + _SIZES_SEARCHED):
        evaluated = size.xreplace({symbol: sympy.Integer(value)})
        if not evaluated.is_Integer:  # a function sympy leaves unevaluated
            return low
        if evaluated >= 1:
            proven = size_bounds(size, {symbol: ValueRanges(value, sympy.oo)}).lower >= 1
            return value if proven else low
    return low


def size_bounds(size: sympy.Expr, ranges: Mapping[sympy.Symbol, ValueRanges]) -> ValueRanges:
    """The range of a size expression over symbols in ``ranges``. bound_sympy bounds each term
    alone, so a term is first moved into the Max or Min beside it, which cancels a symbol read
    twice (TF-style same padding makes a side ``s + Max(0, 2*ceil(s/2) + 1 - s)``, bounded as
    ``Max(s, 2*ceil(s/2) + 1)``)."""
    return bound_sympy(size.replace(_is_sum_with_extremum, _sum_into_extremum), dict(ranges))


def _is_sum_with_extremum(expr: sympy.Expr) -> bool:
    return expr.is_Add and any(isinstance(term, (Max, Min)) for term in expr.args)


def _sum_into_extremum(expr: sympy.Expr) -> sympy.Expr:
    extremum = next(term for term in expr.args if isinstance(term, (Max, Min)))
    rest = expr - extremum
    return type(extremum)(*(rest + term for term in extremum.args))


def symbol_minimums(minimums: Mapping[sympy.Expr, int]) -> dict[sympy.Symbol, int]:
    """The least value of each shape symbol at the sizes the program accepts, from the dims that
    are the symbol or a multiple of it with an offset (``32*s + 1``): the largest lower end
    they give."""
    least: dict[sympy.Symbol, int] = {}
    for expr, low in minimums.items():
        if len(expr.free_symbols) != 1:
            continue
        (symbol,) = expr.free_symbols
        polynomial = sympy.Poly(expr, symbol) if expr.is_polynomial(symbol) else None
        if polynomial is None or polynomial.degree() != 1:
            continue
        slope, offset = polynomial.all_coeffs()
        if slope.is_Integer and offset.is_Integer and slope > 0:
            least[symbol] = max(least.get(symbol, 0), -(-(low - int(offset)) // int(slope)))
    return least


# The least value of each shape symbol at the sizes the program being translated will accept,
# set by the export around translation: the rules read it (ops/_helpers.least_value).
_accepted: contextvars.ContextVar[Mapping[sympy.Symbol, int]] = contextvars.ContextVar(
    "dynexport_accepted_minimums", default={}
)


@contextlib.contextmanager
def minimums_while_translating(minimums: Mapping[sympy.Symbol, int]) -> Iterator[None]:
    """Translate knowing the least value each shape symbol takes at the sizes the program's
    checks accept (:func:`symbol_minimums`)."""
    token = _accepted.set(minimums)
    try:
        yield
    finally:
        _accepted.reset(token)


def accepted_minimums() -> Mapping[sympy.Symbol, int]:
    """The minimums :func:`minimums_while_translating` set (none outside a translation)."""
    return _accepted.get()


def _dim_name(size: int | torch.SymInt, onnx_dim: Any) -> str:
    """The dim as the ONNX model names it (``batch``, ``past + seq``), else torch's symbol."""
    name = getattr(onnx_dim, "value", None)
    return str(name) if name is not None else str(size)


def _expr(size: int | torch.SymInt) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def _bound(value: Any, unbounded: int | None) -> int | None:
    if not (isinstance(value, int) or getattr(value, "is_Integer", False)):  # sympy/torch infinity
        return unbounded
    return int(value)


def _is_json(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return repr(value)
