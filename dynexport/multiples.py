"""A dim the model needs to be a multiple, refined as soon as the model asks.

Models that pad or patch by blocks test a size's remainder in a Python branch (Swin's patch
embedding: ``if width % patch != 0: pad``). At an example that is a multiple, torch.export records
the guard ``w % 4 == 0``, traces the rest of the model on a plain ``w`` (every later size an
expression of ``w // 4`` and its remainders, whose views torch's reshape search then proves with
sympy at length), and only then reports that the declared ``Dim("w")`` violates the guard,
suggesting ``w = 4*_w``; dynamic-shape refinement (dynexport.dim_refinement) applies that and
captures again. The same holds one stage down for the root of the derived dim (``(2 - _w % 2) %
2 > 0`` for Swin's windows), a guard torch leaves unchecked and dynexport's guard audit narrows
to a lattice after capture. On a transformers Swin with plain ``Dim("h")``, ``Dim("w")`` the
first capture alone took 349 s, its answer known within the first second.

Within :func:`multiples_refined_early` a capture stops with :class:`MultipleRequired` at the
first guard recorded after guards that require named dims to be multiples:

- ``Eq(Mod(s, k), 0)`` on the symbol of an input dim declared with a named ``Dim``: torch.export
  refuses the capture for that guard and suggests ``s = k*_s``;
- a guard the guard audit checks, on one named dim or derived dim's root, holding on the
  multiples of ``k`` in its range but not everywhere (:func:`~dynexport.guard_audit.period_it_needs`):
  the audit narrows it to those multiples.

A dim declared by a hint (torch.onnx's ``dynamic_axes``: ``Dim.DYNAMIC``) of a tensor argument
counts as named for the second kind, as ``x.shape[2]`` (the guard audit's name for it): torch.export
refuses no guard on a hint, and the audit of the finished capture narrows the hint to the
multiples where the model asked (``if w % 4 != 0``), not where torch's kernels did (the
divisibility check of ``x.view(-1, 2)``, which the graph's Reshape makes itself).

Each is the fix the finished capture would have led to, found earlier; every other guard and fix
is found by the captures that follow, as before. A capture that the model carried on with after
catching the exception (its trace then took the model's error path) ends with it all the same.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import traceback
from collections.abc import Iterator, Set
from typing import Any

import sympy
from torch.utils._sympy.functions import Mod

from dynexport.errors import model_line
from dynexport.guard_audit import asked_at, input_dim, period_it_needs
from dynexport.shared_dims import after_fake_inputs

__all__ = ["MultipleRequired", "multiples_refined_early"]

_SHAPE_LOG = logging.getLogger("torch.fx.experimental.symbolic_shapes")


class MultipleRequired(Exception):
    """The model needs the named dims to be multiples: ``factors`` maps each dim's name to its
    factor (``{"w": 4}`` for ``w % 4 == 0``); ``where`` is the line that asked the first."""

    def __init__(self, factors: dict[str, int], where: str):
        self.factors = factors
        self.where = where
        needs = ", ".join(f"{name} % {factor} == 0" for name, factor in factors.items())
        super().__init__(f"the model requires {needs} (capture stopped there to refine the dims)")


_ARGUMENT_SIZE = re.compile(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]")


@contextlib.contextmanager
def multiples_refined_early(hinted: Set[tuple[str, int]] = frozenset()) -> Iterator[None]:
    """Within the block, torch.export's captures stop with :class:`MultipleRequired` at the first
    guard after guards that require named dims, or the ``hinted`` ``(argument, axis)`` dims, to
    be multiples (module doc), and the block raises it however the capture ended."""
    stopped: list[MultipleRequired] = []

    def watch_guards(shape_env: Any, equalities: Any) -> None:
        derived = {source.name for source, _, _ in getattr(equalities, "derived_equalities", ())}
        shape_env.guards = _GuardsWatched(shape_env, _named_roots(shape_env, derived, hinted), stopped)

    def not_stop_failure(record: logging.LogRecord) -> bool:  # torch logs each guard it failed to add
        return not (stopped and record.msg.startswith("failed during evaluate_expr"))

    _SHAPE_LOG.addFilter(not_stop_failure)
    try:
        with after_fake_inputs(watch_guards):
            yield
    except Exception as error:
        if stopped and error is not stopped[-1]:  # wrapped, or the model caught it and failed otherwise
            raise stopped[-1] from error
        raise
    else:
        if stopped:  # the model caught it and went on: its trace took another path
            raise stopped[-1]
    finally:
        _SHAPE_LOG.removeFilter(not_stop_failure)


def _named_roots(
    shape_env: Any, derived: set[str], hinted: Set[tuple[str, int]]
) -> dict[sympy.Symbol, tuple[str, bool]]:
    """``{symbol: (dim name, an input's own)}`` for the symbols of dims declared with a named
    ``Dim``: an input dim's own, or the root of derived dims that no input has (torch's
    ``ConstantSource`` named after it); and of the ``hinted`` input dims (``x.shape[2]``). A
    derived dim's own symbol is no root."""
    roots = {}
    for symbol, sources in shape_env.var_to_sources.items():
        for source in sources:
            if source.name in derived:
                continue
            name = shape_env.source_name_to_debug_name.get(source.name)
            argument_size = _ARGUMENT_SIZE.fullmatch(source.name)
            if name is not None:
                roots[symbol] = (name, True)
            elif argument_size and (argument_size[1], int(argument_size[2])) in hinted:
                roots.setdefault(symbol, (input_dim(argument_size[1], argument_size[2]), False))
            elif source.name.isidentifier():
                roots.setdefault(symbol, (source.name, False))
    return roots


class _GuardsWatched(list):
    """A shape environment's guard list that raises :class:`MultipleRequired`, after appending it
    to ``stopped``, when a guard is added after guards requiring multiples of ``named`` roots."""

    def __init__(self, shape_env: Any, named: dict[sympy.Symbol, tuple[str, bool]], stopped: list[MultipleRequired]):
        super().__init__(shape_env.guards)
        self._shape_env = shape_env
        self._named = named
        self._stopped = stopped
        self._factors: dict[str, int] = {}
        self._where = ""

    def append(self, guard: Any) -> None:
        super().append(guard)
        multiple = self._required_multiple(guard)
        if multiple is not None:
            name, factor = multiple
            self._factors[name] = math.lcm(self._factors.get(name, 1), factor)
            self._where = self._where or _asking_line(guard)
        elif self._factors:
            self._stopped.append(MultipleRequired(dict(self._factors), self._where))
            raise self._stopped[-1]

    def _required_multiple(self, guard: Any) -> tuple[str, int] | None:
        """``(dim name, k)`` where ``guard`` requires a named root to be a multiple of ``k``
        (module doc); else None."""
        if not guard.expr.free_symbols <= self._named.keys():
            return None
        checked = _checked_multiple(guard.expr)
        if checked is not None and self._named[checked[0]][1]:
            symbol, factor = checked
        else:
            audited = period_it_needs(self._shape_env, guard)
            if audited is None or audited[0] not in self._named:
                return None
            symbol, factor = audited
        sizes = self._shape_env.var_to_range[symbol]
        return None if sizes.lower == sizes.upper else (self._named[symbol][0], factor)


def _asking_line(guard: Any) -> str:
    """The model line that asked ``guard``: torch's record of it, or, where the question came from
    inside torch (a view's size check), the model's innermost frame on the stack now."""
    if getattr(guard.sloc, "maybe_user_loc", None) is None:
        return model_line(traceback.extract_stack()) or asked_at(guard)
    return asked_at(guard)


def _checked_multiple(expr: Any) -> tuple[sympy.Symbol, int] | None:
    """``(s, k)`` where ``expr`` is ``Eq(Mod(s, k), 0)``, ``k > 1``; else None."""
    if not isinstance(expr, sympy.Eq):
        return None
    remainder = expr.lhs if expr.rhs == 0 else expr.rhs if expr.lhs == 0 else None
    if not isinstance(remainder, Mod):
        return None
    symbol, factor = remainder.args
    if not isinstance(symbol, sympy.Symbol) or not isinstance(factor, sympy.Integer) or factor < 2:
        return None
    return symbol, int(factor)
