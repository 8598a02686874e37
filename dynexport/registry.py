"""The translation table's mechanics: which rule translates which operator.

A rule is a small function ``rule(ctx, *args, **kwargs)`` that receives ONNX values for tensor
arguments (Python values for the rest, exactly as the FX node holds them) and returns ONNX
values. It is registered next to its definition::

    @translates(aten.add.Tensor, aten.add.Scalar, promote=Promote.RESULT)
    def add(ctx, self, other, alpha=1):
        ...

Cross-cutting concerns are declared in the decorator instead of repeated in every rule:
``promote`` casts the listed arguments before the rule runs, ``checker`` lets a rule decline
inputs it cannot handle (the node then decomposes), and ``min_opset`` picks between rules that
differ by ONNX opset.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = [
    "Promote",
    "Rule",
    "TranslationTable",
    "default_table",
    "target_name",
    "translates",
]


class Promote(enum.Enum):
    """How a rule's tensor and scalar arguments are cast before the rule runs."""

    RESULT = "result"
    """Cast to the dtype of the node's (first) output: arithmetic computed in the result dtype."""

    COMMON = "common"
    """Cast to the common dtype of the promoted arguments (torch.result_type): comparisons."""


@dataclasses.dataclass(frozen=True)
class Rule:
    fn: Callable[..., Any]
    targets: tuple[Any, ...]
    promote: Promote | None = None
    promoted: tuple[str, ...] = ("self", "other")
    checker: Callable[[torch.fx.Node], bool] | None = None
    min_opset: int = 1

    @property
    def name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


def target_name(target: Any) -> str:
    """A stable, readable name for an FX call target (``aten.add.Tensor``, ``operator.mul``)."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    if module in ("_operator", "operator"):
        module = "operator"
    return f"{module}.{name}" if module else name


class TranslationTable:
    """Maps FX call targets (OpOverloads, ``operator.*``, ``torch.sym_*``) to rules."""

    def __init__(self, rules: Iterable[Rule] = ()):
        self._rules: dict[Any, list[Rule]] = {}
        for rule in rules:
            self.add(rule)

    def add(self, rule: Rule) -> None:
        for target in rule.targets:
            candidates = self._rules.setdefault(target, [])
            candidates.append(rule)
            candidates.sort(key=lambda r: r.min_opset, reverse=True)

    def remove(self, target: Any) -> None:
        self._rules.pop(target, None)

    def __contains__(self, target: Any) -> bool:
        return target in self._rules

    def targets(self) -> list[Any]:
        return list(self._rules)

    def lookup(self, target: Any, node: torch.fx.Node | None, opset: int) -> Rule | None:
        """The rule for ``target`` at ``opset`` that accepts ``node``, or None."""
        for rule in self._rules.get(target, ()):
            if rule.min_opset > opset:
                continue
            if rule.checker is not None and node is not None and not rule.checker(node):
                continue
            return rule
        return None

    def merged(self, overrides: dict[Any, Callable[..., Any]] | None) -> TranslationTable:
        """A copy of this table where ``overrides`` (target -> rule function) take precedence."""
        table = TranslationTable()
        table._rules = {target: list(rules) for target, rules in self._rules.items()}
        for target, fn in (overrides or {}).items():
            table._rules[target] = [Rule(fn=fn, targets=(target,))]
        return table


default_table = TranslationTable()


def translates(
    *targets: Any,
    promote: Promote | None = None,
    promoted: tuple[str, ...] = ("self", "other"),
    checker: Callable[[torch.fx.Node], bool] | None = None,
    min_opset: int = 1,
    table: TranslationTable | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the rule for ``targets``.

    Args:
        targets: the OpOverloads (or Python callables such as ``operator.mul``) it translates.
        promote: cast the arguments named in ``promoted`` before the rule runs.
        promoted: schema names of the arguments ``promote`` applies to.
        checker: ``checker(node) -> bool``; when False the rule declines and the node is
            decomposed instead.
        min_opset: the lowest ONNX opset the rule is valid for; the highest applicable one wins.
        table: the table to register into (the default table when None).
    """
    if not targets:
        raise ValueError("translates() needs at least one operator")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        (table or default_table).add(
            Rule(fn, tuple(targets), promote, promoted, checker, min_opset)
        )
        return fn

    return register
