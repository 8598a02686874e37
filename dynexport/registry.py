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

Users' rules may also come in torch.onnx's forms (:class:`RuleForm`): an onnxscript function
(``@onnxscript.script()``), or a plain function that takes the operator's arguments without a
context and calls onnxscript ops (``onnxscript.opset18.Add(x, y)``). A user's rule always ranks
above the built-in ones, whenever either was registered.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import onnxscript
import torch

__all__ = [
    "Promote",
    "Rule",
    "RuleForm",
    "TranslationTable",
    "default_table",
    "involves_complex",
    "register_translation",
    "rule_form",
    "target_name",
    "translates",
    "unregister_translation",
]


class Promote(enum.Enum):
    """How a rule's tensor and scalar arguments are cast before the rule runs."""

    RESULT = "result"
    """Cast to the dtype of the node's (first) output: arithmetic computed in the result dtype."""

    COMMON = "common"
    """Cast to the common dtype of the promoted arguments (torch.result_type): comparisons."""


class RuleForm(enum.Enum):
    """How a rule is called."""

    CONTEXT = "context"
    """dynexport's own: ``rule(ctx, *args, **kwargs)``, emitting with ``ctx.op``."""

    ONNXSCRIPT_FUNCTION = "onnxscript_function"
    """An ``@onnxscript.script()`` function, inlined with the node's arguments."""

    TORCH_ONNX = "torch_onnx"
    """torch.onnx's plain function: ``fn(*args, **kwargs)`` without a context, calling
    onnxscript ops (``onnxscript.opset18.Add``) that emit into the graph."""


@dataclasses.dataclass(frozen=True)
class Rule:
    fn: Callable[..., Any]
    targets: tuple[Any, ...]
    promote: Promote | None = None
    promoted: tuple[str, ...] = ("self", "other")
    checker: Callable[[torch.fx.Node], bool] | None = None
    min_opset: int = 1
    form: RuleForm = RuleForm.CONTEXT
    builtin: bool = False
    accepts_complex: bool = False

    @property
    def name(self) -> str:
        fn = self.fn.function if isinstance(self.fn, onnxscript.OnnxFunction) else self.fn
        return f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', repr(fn))}"


def rule_form(fn: Callable[..., Any]) -> RuleForm:
    """Tell a user's rule's form from the rule itself: an onnxscript function, else dynexport's
    form when its first parameter is named ``ctx`` or annotated ``TranslationContext``, else
    torch.onnx's plain form."""
    if isinstance(fn, onnxscript.OnnxFunction):
        return RuleForm.ONNXSCRIPT_FUNCTION
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):  # a builtin without a signature
        return RuleForm.TORCH_ONNX
    if first is None:
        return RuleForm.TORCH_ONNX
    annotation = first.annotation
    annotation = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if first.name == "ctx" or annotation.rsplit(".", 1)[-1] == "TranslationContext":
        return RuleForm.CONTEXT
    return RuleForm.TORCH_ONNX


def _is_builtin(fn: Callable[..., Any]) -> bool:
    # Built-in rules live in dynexport's own modules; they load lazily, so the order of
    # registration cannot tell a user's rule from ours.
    return (getattr(fn, "__module__", None) or "").startswith("dynexport.")


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
    """Maps FX call targets (OpOverloads, ``operator.*``, ``torch.sym_*``) to rules.

    User rules (``register_translation``, or an export's ``custom_translation_table``) sit in a
    layer above the built-in ones: they win, and removing them brings the built-in rule back.
    """

    def __init__(self, rules: Iterable[Rule] = (), *, parent: TranslationTable | None = None):
        self._rules: dict[Any, list[Rule]] = {}
        self._user_rules: dict[Any, Rule] = {}
        self._parent = parent
        for rule in rules:
            self.add(rule)

    def add(self, rule: Rule) -> None:
        for target in rule.targets:
            candidates = self._rules.setdefault(target, [])
            candidates.append(rule)
            # Users' rules first, then the highest opset.
            candidates.sort(key=lambda r: (not r.builtin, r.min_opset), reverse=True)

    def override(self, target: Any, fn: Callable[..., Any]) -> None:
        """Make ``fn`` (in any :class:`RuleForm`) the rule for ``target``, above any other
        rule; an OpOverloadPacket stands for each of its overloads."""
        if isinstance(target, torch._ops.OpOverloadPacket):
            for overload in target.overloads():
                self.override(getattr(target, overload), fn)
            return
        self._user_rules[target] = Rule(fn=fn, targets=(target,), form=rule_form(fn))

    def remove_override(self, target: Any) -> bool:
        """Drop the user rule for ``target``; True when there was one."""
        return self._user_rules.pop(target, None) is not None

    def __contains__(self, target: Any) -> bool:
        return (
            target in self._user_rules
            or bool(self._builtin_rules(target))
            or (self._parent is not None and target in self._parent)
        )

    def _builtin_rules(self, target: Any) -> list[Rule]:
        # An operator that a library defines after dynexport loads (torchvision's) has its rules
        # under its qualified name, "torchvision::nms".
        rules = self._rules.get(target)
        if rules is None and isinstance(target, torch._ops.OpOverload):
            rules = self._rules.get(target.name())
        return rules or []

    def lookup(self, target: Any, node: torch.fx.Node | None, opset: int) -> Rule | None:
        """The rule for ``target`` at ``opset`` that accepts ``node``, or None."""
        user_rule = self._user_rules.get(target)
        if user_rule is not None:
            return user_rule
        for rule in self._builtin_rules(target):
            if rule.min_opset > opset:
                continue
            if node is not None and not _accepts(rule, node):
                continue
            return rule
        return self._parent.lookup(target, node, opset) if self._parent is not None else None

    def lowest_opset(self, target: Any, node: torch.fx.Node | None) -> int | None:
        """The lowest opset at which a rule for ``target`` accepts ``node``, or None."""
        if target in self._user_rules:
            return 1
        opsets = [
            rule.min_opset
            for rule in self._builtin_rules(target)
            if node is None or _accepts(rule, node)
        ]
        if self._parent is not None:
            opsets.append(self._parent.lowest_opset(target, node))
        opsets = [opset for opset in opsets if opset is not None]
        return min(opsets) if opsets else None

    def with_overrides(self, overrides: dict[Any, Callable[..., Any]]) -> TranslationTable:
        """A table that looks up ``overrides`` (target -> rule function) first, then this one."""
        table = TranslationTable(parent=self)
        for target, fn in overrides.items():
            table.override(target, fn)
        return table


def _accepts(rule: Rule, node: torch.fx.Node) -> bool:
    """Whether ``rule`` translates ``node``: its checker agrees, and a node that reads or makes a
    complex tensor (carried as (real, imaginary) pairs, see dynexport.dtypes) goes only to a rule
    written for that layout."""
    if not rule.accepts_complex and involves_complex(node):
        return False
    return rule.checker is None or rule.checker(node)


def involves_complex(node: torch.fx.Node) -> bool:
    """Whether ``node`` reads or makes a complex tensor."""
    if not isinstance(node, torch.fx.Node):
        return False
    vals = [n.meta.get("val") for n in node.all_input_nodes]
    out = node.meta.get("val")
    vals += list(out) if isinstance(out, (tuple, list)) else [out]
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in vals)


default_table = TranslationTable()


def translates(
    *targets: Any,
    promote: Promote | None = None,
    promoted: tuple[str, ...] = ("self", "other"),
    checker: Callable[[torch.fx.Node], bool] | None = None,
    min_opset: int = 1,
    table: TranslationTable | None = None,
    accepts_complex: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the rule for ``targets``: in dynexport's form
    (``rule(ctx, ...)``), or an ``@onnxscript.script()`` function. Rules registered from outside
    dynexport rank above the built-in ones.

    Args:
        targets: the OpOverloads (or Python callables such as ``operator.mul``) it translates, or
            the qualified name of an operator some library defines only later
            (``"torchvision::nms"``, ``OpOverload.name()``).
        promote: cast the arguments named in ``promoted`` before the rule runs.
        promoted: schema names of the arguments ``promote`` applies to.
        checker: ``checker(node) -> bool``; when False the rule declines and the node is
            decomposed instead.
        min_opset: the lowest ONNX opset the rule is valid for; the highest applicable one wins.
        table: the table to register into (the default table when None).
        accepts_complex: the rule handles complex tensors, which it receives and returns as real
            tensors with a trailing dim of 2 (real, imaginary); other rules never see them.
    """
    if not targets:
        raise ValueError("translates() needs at least one operator")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        form = RuleForm.ONNXSCRIPT_FUNCTION if isinstance(fn, onnxscript.OnnxFunction) else RuleForm.CONTEXT
        (table or default_table).add(
            Rule(fn, tuple(targets), promote, promoted, checker, min_opset, form, _is_builtin(fn), accepts_complex)
        )
        return fn

    return register


def register_translation(target: Any, fn: Callable[..., Any]) -> None:
    """Translate ``target`` (an OpOverload such as ``torch.ops.mylib.foo.default``) with ``fn``
    in every export from now on, in place of any built-in rule.

    ``fn`` is dynexport's form, ``fn(ctx, *args, **kwargs)``: the translation context and the
    operator's arguments (ONNX values for tensors), emitting with ``ctx.op.<Op>(...)`` (in a
    custom domain with ``ctx.op.<Op>(..., _domain="my.domain")``); or one of torch.onnx's forms,
    an ``@onnxscript.script()`` function or a plain function of the operator's arguments calling
    onnxscript ops (see :func:`rule_form`).
    """
    if not callable(fn):
        raise TypeError(f"the translation for {target_name(target)} must be callable, got {type(fn).__name__}")
    if isinstance(target, torch._ops.OpOverloadPacket):
        raise TypeError(
            f"register_translation needs an overload such as {target}.default, not the packet {target}"
        )
    default_table.override(target, fn)


def unregister_translation(target: Any) -> None:
    """Undo :func:`register_translation` for ``target``: the built-in rule (if any) applies again."""
    if not default_table.remove_override(target):
        raise KeyError(f"no translation was registered for {target_name(target)}")
