"""Warn when a captured program's guards hold a dynamic dim at its example size.

torch.export keeps, beside the graph, the guards its shape reasoning assumed
(``ExportedProgram._guards_code``, checked by ``program.module()``): ``x.size()[0] % 2 == 0`` after
a ``view(-1, 2)``. Most admit a range of sizes; some admit only the example's, without a
constraint violation, a range in ``range_constraints`` or an assert in the graph: a size derived
from a dynamic dim that is 1 at the example (``x.view(-1, 2)`` of 2 elements, the halves of
``glu``) is specialised to 1, and the shapes after it are traced as static. The graph may then
be wrong at other sizes (``view(-1, 2).view(1, -1)``: torch records the second view as a no-op)
or right but typed with the example's sizes. Each dynamic symbol is tried at other sizes within
its range, alone and with the others scaled or shifted alike; a symbol no other size satisfies
the guards for is pinned, and a warning names it, the guards and the fix.
"""

from __future__ import annotations

import inspect
import math
import warnings
from types import CodeType
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

from dynexport.call_convention import placeholders, user_input_specs

__all__ = ["warn_if_dims_pinned"]


def warn_if_dims_pinned(program: torch.export.ExportedProgram, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Warn when the guards of ``program`` (captured from ``module`` at ``args``/``kwargs``)
    admit a dynamic dim at its example size only."""
    guards = list(getattr(program, "_guards_code", None) or ())
    checks = [_compiled(guard) for guard in guards]
    leaves, tree = pytree.tree_flatten((tuple(args), dict(kwargs)))
    names, shapes = _leaf_shapes(program, leaves)
    example = _example_values(shapes)
    if not guards or not example:
        return
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return

    def holds(values: dict[sympy.Symbol, int]) -> bool:
        call_args, call_kwargs = pytree.tree_unflatten(_resized(leaves, shapes, values), tree)
        try:
            bound = signature.bind(*call_args, **call_kwargs)
        except TypeError:
            return True
        return all(_guard_holds(check, bound.arguments) for check in checks)

    # A dim exported at 0 or 1 is captured size-obliviously, and the rules that depend on its size
    # refuse it themselves, naming the op and its line (squeeze, unbind, chunk).
    pinned = {
        symbol: size
        for symbol, size in example.items()
        if size > 1 and not any(holds(values) for values in _other_sizes(program, example, symbol))
    }
    if not pinned:
        return
    dims = ", ".join(f"{_dim_text(symbol, names, shapes)} = {size}" for symbol, size in pinned.items())
    warnings.warn(
        f"torch.export's guards admit no other size than the example's for {dims} ({'; '.join(guards)}): "
        "a size derived from it was 1 at the example and traced as static, so the graph may be wrong "
        "at other sizes. Export with a larger example size on that dim (4 or more keeps halves and "
        "other derived sizes above 1), or declare the dim static.",
        stacklevel=5,  # capture <- dynamic-shape refinement <- export's stage <- export <- the user's call
    )


def _leaf_shapes(program: torch.export.ExportedProgram, leaves: list[Any]) -> tuple[list[str], list[tuple | None]]:
    """The input name and symbolic shape of each tensor leaf of the call (None for others)."""
    nodes = placeholders(program)
    specs = user_input_specs(program)
    if len(specs) != len(leaves):
        return [""] * len(leaves), [None] * len(leaves)
    names, shapes = [], []
    for leaf, spec in zip(leaves, specs):
        name = getattr(spec.arg, "name", "")
        val = nodes[name].meta.get("val") if name in nodes else None
        names.append(name)
        shapes.append(tuple(val.shape) if isinstance(leaf, torch.Tensor) and isinstance(val, torch.Tensor) else None)
    return names, shapes


def _example_values(shapes: list[tuple | None]) -> dict[sympy.Symbol, int]:
    """Each symbol the input dims are made of, with its example value."""
    values: dict[sympy.Symbol, int] = {}
    for shape in shapes:
        for size in shape or ():
            if isinstance(size, torch.SymInt):
                known = size.node.shape_env.backed_var_to_val
                values.update({symbol: int(known[symbol]) for symbol in size.node.expr.free_symbols if symbol in known})
    return values


def _other_sizes(
    program: torch.export.ExportedProgram, example: dict[sympy.Symbol, int], symbol: sympy.Symbol
) -> list[dict[sympy.Symbol, int]]:
    """Assignments of the dynamic symbols in which ``symbol`` differs from its example size and
    every symbol stays within its range: ``symbol`` alone at every size up to 64 (or 4 times its
    example), then all scaled, then all shifted."""
    size = example[symbol]
    alone = [{**example, symbol: other} for other in range(max(64, 4 * size) + 1) if other != size]
    scaled = [{s: v * factor for s, v in example.items()} for factor in (2, 3, 4)]
    shifted = [{s: v + offset for s, v in example.items()} for offset in (1, 2, 3)]
    return [values for values in alone + scaled + shifted if values[symbol] != size and _within(program, values)]


def _within(program: torch.export.ExportedProgram, values: dict[sympy.Symbol, int]) -> bool:
    for symbol, value in values.items():
        bounds = program.range_constraints.get(symbol)
        if bounds is not None and not (float(bounds.lower) <= value <= float(bounds.upper)):
            return False
    return True


def _resized(leaves: list[Any], shapes: list[tuple | None], values: dict[sympy.Symbol, int]) -> list[Any]:
    """The leaves, each tensor replaced by a meta tensor of its shape at ``values``."""
    resized = []
    for leaf, shape in zip(leaves, shapes):
        if shape is None:
            resized.append(leaf)
            continue
        sizes = [
            int(size.node.expr.xreplace(values)) if isinstance(size, torch.SymInt) else int(size) for size in shape
        ]
        resized.append(torch.empty(sizes, dtype=leaf.dtype, device="meta"))
    return resized


def _compiled(guard: str) -> CodeType | None:
    """torch's guard ``guard`` (a Python expression over ``L``, the call's arguments) compiled once
    for the many sizes it is evaluated at; None where it does not compile."""
    try:
        return compile(guard, "<torch.export guard>", "eval")
    except SyntaxError:
        return None


def _guard_holds(check: CodeType | None, arguments: dict[str, Any]) -> bool:
    """Whether a compiled guard holds for the call's ``arguments``; a guard this cannot evaluate
    counts as holding."""
    if check is None:
        return True
    try:
        return bool(eval(check, {"__builtins__": {}, "L": arguments, "torch": torch, "math": math}))  # noqa: S307
    except Exception:
        return True


def _dim_text(symbol: sympy.Symbol, names: list[str], shapes: list[tuple | None]) -> str:
    """``input 'x' dim 0`` for the first input dim that is ``symbol``."""
    for name, shape in zip(names, shapes):
        for axis, size in enumerate(shape or ()):
            if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                return f"input {name!r} dim {axis}"
    return str(symbol)
