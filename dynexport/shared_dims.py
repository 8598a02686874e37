"""Input dims declared with one ``Dim`` traced as one symbol.

torch.export (non-strict) gives every dynamic input dim a symbol of its own while it traces and
applies the equalities the user declared (one ``Dim`` object, or one name in ``dynamic_axes``,
for several dims) only afterwards, when it checks the guards. Model code that relies on the
equality without an op that forces it is traced on the unrelated symbols: ``torch.cat([a, b])``
of two inputs of one batch is ``s0 + s1`` long, not ``2*s0``; halving it again
(``torch.chunk(..., 2)``) then leaves conditions torch cannot prove over the declared range, and
it fixes the batch to the example's size (RAFT, siamese networks, classifier-free guidance
export only with their batches declared apart). While dynexport captures,
:func:`shared_dims_traced_as_one` makes the dims the user declared equal one symbol from the
start, as the first op comparing them would: the declaration the guards are checked against is
unchanged, and no other call is affected. Likewise a derived dim (``32 * Dim("h")``,
``Dim("n") + 1``) is traced as that expression of its root's symbol rather than as a symbol of
its own: a Swin with sides ``32 * Dim`` then views its maps in whole windows with no guard to
prove (``dynexport.contiguous_views``), and its capture takes 6–7 s where the separate symbols
took 11–24 s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import sympy
import torch.export._trace as export_trace

__all__ = ["after_fake_inputs", "shared_dims_traced_as_one"]


@contextlib.contextmanager
def after_fake_inputs(hook: Callable[[Any, Any], None]) -> Iterator[None]:
    """Within the block, ``hook(shape_env, equalities)`` runs each time torch.export has made its
    fake inputs, before it traces: the shape environment and the declared equalities
    (``source_pairs``, ``derived_equalities``, ``phantom_symbols``). Where torch.export has no
    such step (another version), nothing runs."""
    original = getattr(export_trace, "make_fake_inputs", None)
    if original is None:
        yield
        return

    def make_fake_inputs(*args: Any, **kwargs: Any) -> Any:
        made = original(*args, **kwargs)
        hook(made[0].shape_env, made[3])
        return made

    export_trace.make_fake_inputs = make_fake_inputs
    try:
        yield
    finally:
        export_trace.make_fake_inputs = original


def shared_dims_traced_as_one() -> contextlib.AbstractContextManager[None]:
    """Within the block, torch.export's fake inputs carry one symbol for the dims each declared
    ``Dim`` names (module doc)."""

    def unify(shape_env: Any, equalities: Any) -> None:
        symbol_of = {_name(source): symbol for symbol, sources in shape_env.var_to_sources.items() for source in sources}
        _unify(shape_env, symbol_of, getattr(equalities, "source_pairs", ()))
        _unify_derived(shape_env, symbol_of, getattr(equalities, "derived_equalities", ()))

    return after_fake_inputs(unify)


def _unify(shape_env: Any, symbol_of: dict[str, sympy.Symbol], source_pairs: Any) -> None:
    """Record each pair of input dims the user declared equal as equal, where both are symbols
    with equal example sizes (otherwise torch.export reports the declaration as it would).
    ``symbol_of``: each input dim's symbol by its source's name."""
    for first, second in source_pairs:
        a, b = symbol_of.get(_name(first)), symbol_of.get(_name(second))
        if a is None or b is None:
            continue  # a static dim
        a, b = shape_env.replace(a), shape_env.replace(b)  # each as the pairs before left it
        if a != b and isinstance(a, sympy.Symbol) and isinstance(b, sympy.Symbol):
            if _example_size(shape_env, a) == _example_size(shape_env, b):
                _record_equal(shape_env, b, a)


def _unify_derived(shape_env: Any, symbol_of: dict[str, sympy.Symbol], derived_equalities: Any) -> None:
    """Record each input dim declared as a function of a root (``32 * Dim("h")``, ``Dim("n") +
    1``) as that expression of the root's symbol, where it is a symbol whose example size is the
    expression's at the root's (otherwise torch.export reports the declaration as it would)."""
    for source, root, derive in derived_equalities:
        dim = symbol_of.get(_name(source))
        root_symbol = root if isinstance(root, sympy.Symbol) else symbol_of.get(_name(root))
        if dim is None or root_symbol is None:
            continue  # a static dim
        dim, root_symbol = shape_env.replace(dim), shape_env.replace(root_symbol)
        if not isinstance(dim, sympy.Symbol) or dim in root_symbol.free_symbols:
            continue
        expression = derive(root_symbol)
        sizes = {symbol: _example_size(shape_env, symbol) for symbol in expression.free_symbols}
        if None not in sizes.values() and expression.xreplace(sizes) == _example_size(shape_env, dim):
            _record_equal(shape_env, dim, expression)


def _record_equal(shape_env: Any, symbol: sympy.Symbol, expression: sympy.Expr) -> None:
    """``symbol`` replaced by ``expression`` from now on, its range narrowed to the expression's.
    What ``evaluate_expr(Eq(symbol, expression))`` does, without the guard it adds: torch.export
    checks the declaration itself, and a decoder's 60 cache tensors made 120 such guards, which
    cost a quarter of its capture (torch's guard bookkeeping, and the checks of every guard after
    capture)."""
    shape_env._set_replacement(symbol, expression, "dynexport: declared equal")


def _example_size(shape_env: Any, symbol: sympy.Symbol) -> Any:
    sizes = getattr(shape_env, "backed_var_to_val", None)  # var_to_val before torch 2.12
    return (shape_env.var_to_val if sizes is None else sizes).get(symbol)


def _name(source: Any) -> str:
    name = source.name
    return name() if callable(name) else name  # a method before torch 2.10
