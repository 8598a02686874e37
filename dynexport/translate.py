"""Walk an ExportedProgram's FX graph and emit an ONNX model through the translation table.

Every call_function node goes to the table. A node whose operator has no rule (or whose rule
declines it) is decomposed on the spot: its decomposition is traced under the program's own fake
mode into a small FX graph, which is translated the same way. Nothing else in the program is
re-traced, which is what makes this stage cheap.

SymInts are ONNX int64 scalars (0-d); ``sym_size`` reads them from ``Shape``.

Control-flow operators (``torch.cond``, ``while_loop``, ``scan``, ``map``) carry FX subgraphs:
planning recurses into them, and their rules translate them with the same table into ONNX
subgraphs (``TranslationContext.subgraph`` and ``call_graph``) that read enclosing values
through ONNX's outer scope.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import sympy
import torch
from onnx_ir.tensor_adapters import TorchTensor
from torch.export.graph_signature import OutputKind

from dynexport.builder import ModelBuilder, OnnxScriptError, OperatorNotInOpset
from dynexport.call_convention import GraphIO, is_user_input, outputs_of_kind, placeholders, user_outputs
from dynexport.decompositions import (
    Decomposition,
    decomposition_table,
    sizes_fixed_since,
    trace_decomposition,
)
from dynexport.dtypes import carried_dtype, scalar_dtype, to_onnx_dtype, to_torch_dtype
from dynexport.errors import (
    ComplexTensorError,
    ExportError,
    OpsetTooLowError,
    TranslationError,
    UnsupportedOperatorError,
    UnsupportedUse,
    source_line,
)
from dynexport.module_functions import extract_module_functions
from dynexport.passes.fx.functionalize import functional_variant, mutated_argument
from dynexport.passes.fx.simplify import Simplifications
from dynexport.passes.onnx.naming import make_names_unique
from dynexport.registry import Promote, Rule, RuleForm, TranslationTable, involves_complex, target_name

__all__ = [
    "BUFFER_UPDATES_KEY",
    "OUTPUT_DIMS_KEY",
    "TranslationContext",
    "TranslationOptions",
    "TranslationPlan",
    "TranslationSummary",
]

# Model metadata: JSON ``{buffer: output}`` for the buffers a training-mode model updates.
BUFFER_UPDATES_KEY = "pkg.dynexport.buffer_updates"
# {output: {axis: size}}: the size each output dim named by the user stands for, in input dim names.
OUTPUT_DIMS_KEY = "pkg.dynexport.output_dims"

# An operator with neither a rule at the target opset nor a decomposition: its name, the model's
# node that uses it, and the lowest opset with a rule for it (None: none has).
_Missing = tuple[str, torch.fx.Node, int | None]

# Keyword arguments that place or lay out a tensor; they never change an ONNX computation.
_PLACEMENT_KWARGS = frozenset({"device", "layout", "pin_memory", "memory_format", "non_blocking"})


class TranslationContext:
    """What a rule knows about the node it translates.

    ``op`` emits ONNX ops (``ctx.op.Add(x, y)``) into the graph being built; ``node`` is the FX
    node; ``name`` the name its result gets; ``out`` its ``meta["val"]``; ``opset`` the target
    ONNX opset. Control-flow rules translate the node's FX subgraphs with :meth:`call_graph`
    and :meth:`subgraph`.
    """

    __slots__ = ("node", "name", "opset", "_origin", "_translator")

    def __init__(self, translator: _Translator, node: torch.fx.Node, name: str, origin: torch.fx.Node | None):
        self._translator = translator
        self.node = node
        self.name = name
        self.opset = translator.opset
        self._origin = origin

    @property
    def op(self) -> Any:
        return self._translator.builder.op

    @property
    def out(self) -> Any:
        return self.node.meta["val"]

    @property
    def out_dtype(self) -> ir.DataType:
        """ONNX element type of the node's (first) tensor output (a complex one's parts')."""
        val = self.out
        if isinstance(val, (tuple, list)):
            val = next(v for v in val if isinstance(v, torch.Tensor))
        if isinstance(val, torch.Tensor):
            return carried_dtype(val.dtype)
        return scalar_dtype(val)

    @property
    def out_rank(self) -> int:
        return self.out.dim()

    def constant(self, value: Any, dtype: ir.DataType) -> ir.Value:
        """A constant tensor of ``dtype`` holding ``value`` (a number, list or torch tensor)."""
        return self._translator.constant(value, dtype)

    def sym_size(self, x: ir.Value, dim: int) -> ir.Value:
        """Size of ``x`` along ``dim`` as an int64 scalar."""
        if self.opset < 15:  # Shape takes start and end from opset 15
            return self.op.Gather(self.op.Shape(x), self.constant(dim, ir.DataType.INT64))
        size = self.op.Shape(x, start=dim, end=dim + 1 if dim != -1 else None)
        size.shape = ir.Shape([1])
        return self.op.Squeeze(size)

    def call_graph(self, module: torch.fx.GraphModule, args: Sequence[Any], label: str) -> list[Any]:
        """Translate ``module`` (an FX subgraph of the node) into the graph being built, its
        placeholders bound to ``args`` (ONNX values, or Python values for constants); return its
        outputs as a list. ``label`` names the subgraph's values (``<node>.<label>.<fx name>``)."""
        outputs = self._translator.inline_graph(module, args, f"{self.name}.{label}.")
        self._translator.builder.set_origin(self.node, self._origin)
        return outputs

    def subgraph(self, label: str, inputs: Sequence[ir.Value], emit: Callable[[], Sequence[Any]]) -> ir.Graph:
        """A new ONNX graph for a graph attribute (If's branches, Loop's and Scan's bodies):
        ``emit()`` runs with ``op`` and :meth:`call_graph` emitting into it, and returns its
        outputs. ``inputs`` are its fresh input values; values of enclosing graphs may be read
        directly (ONNX's outer scope)."""
        return self._translator.subgraph(f"{self.name}.{label}", inputs, emit, self.node, self._origin)

    def value(self, name: str, val: Any) -> ir.Value:
        """A fresh value (a subgraph input) named ``<node>.<name>``, typed after ``val`` (a fake
        tensor, a SymInt or a Python scalar)."""
        value = ir.Value(name=f"{self.name}.{name}")
        self._translator.annotate(value, val, None)
        return value


class _DimNamer:
    """Names symbolic dims after the user's dim names (``s0`` -> ``batch``, ``2*s0`` -> ``2*batch``)."""

    def __init__(self, dim_names: dict[str, str]):
        self._names = dim_names
        self._cache: dict[Any, str] = {}

    def named(self, symbol: sympy.Symbol) -> str:
        return self._names.get(symbol.name, symbol.name)

    def dim(self, size: int | torch.SymInt) -> int | str:
        if isinstance(size, int):
            return size
        expr = size.node.expr
        if expr.is_number:
            return int(expr)
        name = self._cache.get(expr)
        if name is None:
            renamed = expr.xreplace(
                {s: sympy.Symbol(self._names[s.name]) for s in expr.free_symbols if s.name in self._names}
            )
            name = self._cache[expr] = str(renamed)
        return name

    def shape(self, val: torch.Tensor) -> ir.Shape:
        """The shape ``val`` has in the graph: a complex tensor's ends in its (real, imaginary) pair."""
        pair = [2] if val.is_complex() else []
        return ir.Shape([self.dim(d) for d in val.shape] + pair)


def _rule_error(node: torch.fx.Node, origin: torch.fx.Node | None, rule: Rule, reason: str, custom_hint: str) -> TranslationError:
    """A rule's failure on ``node``: dynexport's bug for a built-in rule, else ``custom_hint``."""
    hint = "this is a bug in dynexport's rule; please report it with the model." if rule.builtin else custom_hint
    return TranslationError(target_name(node.target), source_line(origin or node), reason, hint)


class _Translator:
    def __init__(
        self,
        table: TranslationTable,
        opset: int,
        dim_names: dict[str, str],
        fake_mode,
        fallback_to_custom_domain: bool = False,
        simplifications: Simplifications | None = None,
    ):
        self.table = table
        self.simplifications = simplifications or Simplifications()
        self.fallback_to_custom_domain = fallback_to_custom_domain
        self.fallbacks: dict[torch.fx.Node, Any] = {}
        self.fake_mode = fake_mode
        self._shape_env = fake_mode.shape_env if fake_mode is not None else None
        self._replaced = dict(self._shape_env.replacements) if self._shape_env is not None else {}
        self._decomposition_table: dict[Any, Callable[..., Any]] | None = None
        self._decompositions: dict[torch.fx.Node, Decomposition] = {}
        self._rules: dict[torch.fx.Node, Rule] = {}
        self.opset = opset
        self.graph = ir.Graph([], [], nodes=[], opset_imports={"": opset}, name="main_graph")
        self.builder = ModelBuilder(self.graph)
        self.dims = _DimNamer(dim_names)
        # One constant cache per graph being built, innermost last: a subgraph may read its
        # enclosing graphs' constants, never the other way round.
        self._constant_scopes: list[dict[tuple[Any, ir.DataType], ir.Value]] = [{}]
        self._constant_count = 0

    # -- values ---------------------------------------------------------------------------

    def constant(self, value: Any, dtype: ir.DataType) -> ir.Value:
        if isinstance(value, (int, float, bool)) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, bool)) for v in value)
        ):
            # repr tells -0.0 from 0.0, which compare (and hash) equal.
            key = (repr(value), type(value), dtype)
            cached = next((scope[key] for scope in self._constant_scopes if key in scope), None)
            if cached is None:
                try:
                    tensor = ir.tensor(value, dtype=dtype)
                except OverflowError:
                    # PyTorch wraps an out-of-range Python int into an integer dtype (uint8 -1 is 255).
                    tensor = TorchTensor(torch.tensor(value).to(to_torch_dtype(dtype)))
                cached = self.builder.op.Constant(value=tensor)
                cached.name = f"const_{self._constant_count}"
                cached.shape = ir.Shape(tensor.shape)
                self._constant_count += 1
                self._constant_scopes[-1][key] = cached
            return cached
        tensor = TorchTensor(value.detach().to(to_torch_dtype(dtype)))
        result = self.builder.op.Constant(value=tensor)
        result.shape = ir.Shape(tensor.shape)
        return result

    def annotate(self, value: ir.Value, val: Any, name: str | None) -> None:
        """Give ``value`` the type, shape and name the FX node's ``meta["val"]`` says it has
        (a sequence keeps its type: its ``val`` is the handle standing for it)."""
        sequence = isinstance(value.type, ir.SequenceType)
        if isinstance(val, torch.Tensor) and not sequence:
            value.type = ir.TensorType(carried_dtype(val.dtype))
            value.shape = self.dims.shape(val)
        elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
            value.type = ir.TensorType(scalar_dtype(val))
            value.shape = ir.Shape([])
        if name is not None and value.producer() is not None and not value.is_graph_input():
            if value.name is None or value.name.startswith(f"{self.builder.origin_name}."):
                value.name = name

    # -- planning -------------------------------------------------------------------------

    def plan(self, graph: torch.fx.Graph, origin: torch.fx.Node | None = None) -> list[_Missing]:
        """Choose a rule or trace a decomposition for every live node of ``graph`` (recursively),
        before anything is emitted. Returns the (operator, node, lowest opset with a rule) of
        those that have neither."""
        missing = []
        for node in graph.nodes:
            if node.op != "call_function" or not (node.users or mutated_argument(node) is not None):
                continue
            if node in self.simplifications:
                continue
            target = self._functional_target(node)
            rule = self.table.lookup(target, node, self.opset)
            if rule is not None:
                self._rules[node] = rule
                for module in _subgraph_modules(node):
                    missing += self.plan(module.graph, origin)
                continue
            region = _inlined_region(node)
            if region is not None:
                self._decompositions[node] = region
                missing += self.plan(region.graph, origin or node)
                continue
            if self._decomposition_table is None:
                self._decomposition_table = decomposition_table(lambda op: op in self.table)
            decomposition = trace_decomposition(node, target, self._decomposition_table, self.fake_mode)
            fixed = self._sizes_fixed()
            if fixed:
                raise TranslationError(
                    target_name(target),
                    source_line(origin or node),
                    f"it has no rule, and its decomposition fixes sizes the program keeps dynamic to the "
                    f"example's ({self._named(fixed)})",
                    "declare those dims static (None in dynamic_shapes), or report the operator: dynexport "
                    "needs a rule for it that keeps them dynamic.",
                )
            if decomposition is None:
                # A custom-domain node would receive complex values as their (real, imaginary) pairs.
                if self.fallback_to_custom_domain and isinstance(target, torch._ops.OpOverload) and not involves_complex(node):
                    self.fallbacks[node] = target
                else:
                    missing.append((target_name(target), origin or node, self.table.lowest_opset(target, node)))
                continue
            self._decompositions[node] = decomposition
            missing += self.plan(decomposition.graph, origin or node)
        return missing

    def _named(self, fixed: dict[Any, int]) -> str:
        return ", ".join(f"{self.dims.named(symbol)} = {size}" for symbol, size in fixed.items())

    def _sizes_fixed(self) -> dict[Any, int]:
        """The sizes of the program fixed to a number since the last call (a rule or a
        decomposition read a symbolic size as an int, which makes the shared shape environment
        replace it by the example's value in every shape)."""
        fixed = sizes_fixed_since(self._shape_env, self._replaced)
        if self._shape_env is not None and len(self._shape_env.replacements) != len(self._replaced):
            self._replaced = dict(self._shape_env.replacements)
        return fixed

    def _check_sizes_kept(self, node: torch.fx.Node, origin: torch.fx.Node | None, rule: Rule) -> None:
        """Refuse a rule that fixed sizes of the program: the graph written so far assumed them
        dynamic, and its values at the example's are baked in."""
        fixed = self._sizes_fixed()
        if not fixed:
            return
        raise _rule_error(
            node, origin, rule, f"its rule ({rule.name}) fixes sizes the program keeps dynamic to the example's "
            f"({self._named(fixed)})",
            "the custom translation reads a symbolic size as an int: read sizes from the graph (op.Shape) instead.",
        )

    def _functional_target(self, node: torch.fx.Node) -> Any:
        """The node's operator, or its functional form for an in-place op (the caller checked
        with ``inplace_ops_are_local`` that no alias can see the difference)."""
        if mutated_argument(node) is None:
            return node.target
        return functional_variant(node.target)

    # -- nodes ----------------------------------------------------------------------------

    def simplified_value(self, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
        """What a node that passes/fx simplified stands for: its input, or an initializer."""
        if node in self.simplifications.aliases:
            return env[self.simplifications.aliases[node]]
        if node in self.simplifications.constants:
            name, tensor = self.simplifications.constants[node]
            value = ir.Value(name=name)
            while value.name in self.graph.initializers:
                value.name = f"{value.name}_"
            self.annotate(value, tensor, None)
            value.const_value = TorchTensor(_carried(tensor), name=value.name)
            self.graph.register_initializer(value)
            return value
        return None  # dropped: nothing reads it

    def translate_graph(
        self,
        graph: torch.fx.Graph,
        env: dict[torch.fx.Node, Any],
        name_prefix: str = "",
        origin: torch.fx.Node | None = None,
    ) -> None:
        for node in graph.nodes:
            if node.op == "get_attr" and node.users:
                # A control-flow operator's subgraph (torch.cond's branches, a loop's body).
                env[node] = _attribute(graph.owning_module, node.target)
                continue
            if node.op != "call_function" or not (node.users or mutated_argument(node) is not None):
                continue
            if node in self.simplifications:
                env[node] = self.simplified_value(node, env)
                continue
            env[node] = self.translate_node(node, env, name_prefix, origin)
            base = mutated_argument(node)
            if base is not None:
                # Later reads of the mutated tensor see the new value.
                env[base] = env[node]

    def translate_node(
        self,
        node: torch.fx.Node,
        env: dict[torch.fx.Node, Any],
        name_prefix: str,
        origin: torch.fx.Node | None,
    ) -> Any:
        rule = self._rules.get(node)
        if node in self.fallbacks:
            return self.custom_domain_node(node, env, origin)
        if rule is None:
            return self.decompose(node, env, name_prefix, origin)
        self.builder.set_origin(node, origin)
        args = tuple(_argument_value(a, env) for a in node.args)
        kwargs = {k: _argument_value(v, env) for k, v in node.kwargs.items() if k not in _PLACEMENT_KWARGS}
        ctx = TranslationContext(self, node, name_prefix + node.name, origin)
        if rule.promote is not None:
            args, kwargs = _promote(ctx, rule, args, kwargs)
        try:
            result = self.call_rule(rule, ctx, args, kwargs)
            self._check_sizes_kept(node, origin, rule)
        except ExportError:
            raise
        except OperatorNotInOpset as error:
            use = UnsupportedUse(target_name(node.target), 1, source_line(origin or node), error.since, error.what)
            raise OpsetTooLowError([use], error.opset) from error
        except OnnxScriptError as error:
            raise TranslationError(
                target_name(node.target), source_line(origin or node), f"{error.reason} (rule {rule.name})", error.hint
            ) from error
        except Exception as error:
            raise _rule_error(
                node, origin, rule, f"{type(error).__name__}: {error} (rule {rule.name})",
                "the custom translation raised it; it receives the operator's arguments as the FX node holds "
                "them (ONNX values for tensors).",
            ) from error
        if not rule.builtin:
            _check_custom_result(node, origin, rule, result)
        return self._annotate_result(node, result, name_prefix + node.name)

    def call_rule(self, rule: Rule, ctx: TranslationContext, args: tuple, kwargs: dict) -> Any:
        """Run ``rule`` in its form; torch.onnx's forms take no context, and dtypes as ONNX
        element types, as torch.onnx passes them."""
        if rule.form is RuleForm.CONTEXT:
            return rule.fn(ctx, *args, **kwargs)
        args = tuple(_torch_onnx_argument(a) for a in args)
        kwargs = {k: _torch_onnx_argument(v) for k, v in kwargs.items()}
        if rule.form is RuleForm.ONNXSCRIPT_FUNCTION:
            return self.builder.inline_function(rule.fn, args, kwargs)
        with self.builder.evaluating_onnxscript():
            return rule.fn(*args, **kwargs)

    def custom_domain_node(self, node: torch.fx.Node, env: dict[torch.fx.Node, Any], origin: torch.fx.Node | None) -> Any:
        """One node in the domain ``pkg.torch.<namespace>`` standing for an operator with no
        translation: tensor arguments are its inputs, the others its attributes."""
        target = self.fallbacks[node]
        self.builder.set_origin(node, origin)
        inputs: list[ir.Value] = []
        attributes: dict[str, Any] = {}
        schema = target._schema.arguments
        bound = list(zip(schema, node.args)) + [(a, node.kwargs[a.name]) for a in schema if a.name in node.kwargs]
        for argument, value in bound:
            translated = _argument_value(value, env)
            if isinstance(translated, ir.Value):
                inputs.append(translated)
            elif isinstance(translated, (list, tuple)) and any(isinstance(v, ir.Value) for v in translated):
                inputs.extend(v for v in translated if isinstance(v, ir.Value))
            elif translated is not None and argument.name not in _PLACEMENT_KWARGS:
                attributes[argument.name] = _attribute_value(translated)
        val = node.meta.get("val")
        count = len(val) if isinstance(val, (tuple, list)) else 1
        name = target._opname if target._overloadname == "default" else f"{target._opname}.{target._overloadname}"
        result = self.builder.call_op(
            name, inputs, attributes, domain=f"pkg.torch.{target.namespace}", version=1, outputs=count
        )
        return self._annotate_result(node, list(result) if count > 1 else result, node.name)

    def _annotate_result(self, node: torch.fx.Node, result: Any, name: str) -> Any:
        val = node.meta.get("val")
        if isinstance(result, ir.Value):
            self.annotate(result, val, name)
        elif isinstance(result, (list, tuple)) and isinstance(val, (list, tuple)):
            for i, (value, v) in enumerate(zip(result, val)):
                if isinstance(value, ir.Value):
                    self.annotate(value, v, f"{name}.{i}")
        return result

    def decompose(
        self,
        node: torch.fx.Node,
        env: dict[torch.fx.Node, Any],
        name_prefix: str,
        origin: torch.fx.Node | None,
    ) -> Any:
        decomposition = self._decompositions[node]
        sub_env: dict[torch.fx.Node, Any] = {}
        placeholders = [n for n in decomposition.graph.nodes if n.op == "placeholder"]
        for placeholder, leaf in zip(placeholders, decomposition.leaves):
            sub_env[placeholder] = env[leaf] if isinstance(leaf, torch.fx.Node) else leaf
        self.translate_graph(decomposition.graph, sub_env, f"{name_prefix}{node.name}.", origin or node)
        output = next(n for n in reversed(decomposition.graph.nodes) if n.op == "output").args[0]
        result = torch.fx.node.map_arg(output, sub_env.__getitem__)
        self.builder.set_origin(node, origin)
        return self._annotate_result(node, result, name_prefix + node.name)

    def inline_graph(self, module: torch.fx.GraphModule, args: Sequence[Any], name_prefix: str) -> list[Any]:
        """Translate ``module``'s graph into the graph being built, its placeholders bound to
        ``args``; return its outputs as a list."""
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(args):
            raise TypeError(f"subgraph takes {len(placeholders)} inputs, {len(args)} given")
        env: dict[torch.fx.Node, Any] = dict(zip(placeholders, args))
        self.translate_graph(module.graph, env, name_prefix)
        output = next(n for n in reversed(module.graph.nodes) if n.op == "output").args[0]
        outputs = torch.fx.node.map_arg(output, env.__getitem__)
        return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]

    def subgraph(
        self,
        name: str,
        inputs: Sequence[ir.Value],
        emit: Callable[[], Sequence[Any]],
        node: torch.fx.Node,
        origin: torch.fx.Node | None,
    ) -> ir.Graph:
        """An ONNX graph (for a graph attribute) with ``inputs``, whose nodes and outputs
        ``emit()`` builds while the translator emits into it."""
        graph = ir.Graph(inputs, [], nodes=[], opset_imports={"": self.opset}, name=name)
        outer = self.builder
        self.builder = ModelBuilder(graph, parent=outer, scope=f"{name}.")
        self._constant_scopes.append({})
        try:
            self.builder.set_origin(node, origin)
            outputs = list(emit())
            self.builder.set_origin(node, origin)
            for index, value in enumerate(outputs):
                graph.outputs.append(self._subgraph_output(graph, value, f"{name}.output_{index}"))
        finally:
            self._constant_scopes.pop()
            self.builder = outer
        return graph

    def _subgraph_output(self, graph: ir.Graph, value: Any, name: str) -> ir.Value:
        """``value`` as an output of ``graph``: a node of ``graph`` must produce it, and only
        once (onnxruntime does not accept an outer-scope value or an input as a subgraph's
        output in every case)."""
        if not isinstance(value, ir.Value):
            # A Python number returned where PyTorch holds a 0-d tensor (a SymInt specialized).
            value = self.constant(value, to_onnx_dtype(torch.tensor(value).dtype))
        if value.producer() is None or value.producer().graph is not graph or value.is_graph_output():
            identity = self._copy(value)
            identity.type, identity.shape = value.type, value.shape
            identity.name = name
            value = identity
        return value

    def _copy(self, value: ir.Value) -> ir.Value:
        if isinstance(value.type, ir.SequenceType) and self.opset < 14:
            # Identity takes sequences from opset 14: before it, one element appended and erased.
            element = self.constant(0, value.type.elem_type.dtype)
            return self.builder.op.SequenceErase(self.builder.op.SequenceInsert(value, element))
        return self.builder.op.Identity(value)


def _check_custom_result(node: torch.fx.Node, origin: torch.fx.Node | None, rule: Rule, result: Any) -> None:
    """A custom rule must return what the operator gives: an ONNX value of its dtype and rank
    per tensor result (a list of them for several), else the next rule or the model is blamed."""
    val = node.meta.get("val")
    expected = list(val) if isinstance(val, (tuple, list)) else [val]
    returned = list(result) if isinstance(result, (tuple, list)) and isinstance(val, (tuple, list)) else [result]
    problem = None
    if len(returned) != len(expected):
        problem = f"returned {_described(result)}, but the operator has {len(expected)} results"
    for index, (value, want) in enumerate(zip(returned, expected)):
        if problem is not None or not isinstance(want, torch.Tensor):
            continue
        which = f"result {index}" if len(expected) > 1 else "its result"
        if not isinstance(value, ir.Value):
            problem = f"returned {_described(value)} for {which}, a {want.dim()}-d {want.dtype} tensor"
        elif value.dtype is not None and value.dtype != carried_dtype(want.dtype):
            problem = f"returned a {value.dtype.name} value for {which}, which the operator gives as {want.dtype}"
        elif value.shape is not None and value.shape.rank() != want.dim() + want.is_complex():
            problem = f"returned a {value.shape.rank()}-d value for {which}, which the operator gives {want.dim()}-d"
    if problem is not None:
        raise TranslationError(
            target_name(node.target),
            source_line(origin or node),
            f"the custom rule {rule.name} {problem}",
            "a rule returns one ONNX value per tensor result of the operator (a list of them for "
            "several), of the operator's dtype and rank; Cast or Reshape inside the rule if needed.",
        )


def _described(value: Any) -> str:
    if isinstance(value, ir.Value):
        return "an ONNX value"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"the {type(value).__name__} {value!r:.40}"


def _subgraph_modules(node: torch.fx.Node) -> list[torch.fx.GraphModule]:
    """The FX subgraphs a control-flow node calls (its ``get_attr`` arguments)."""
    owner = node.graph.owning_module
    attributes = [_attribute(owner, argument.target) for argument in node.all_input_nodes if argument.op == "get_attr"]
    return [a for a in attributes if isinstance(a, torch.fx.GraphModule)]


def _attribute(module: torch.nn.Module, target: str) -> Any:
    for part in target.split("."):
        module = getattr(module, part)
    return module


_INLINED_REGIONS = {
    torch.ops.higher_order.wrap_with_set_grad_enabled: 2,
    torch.ops.higher_order.wrap_with_autocast: 5,
}


def _inlined_region(node: torch.fx.Node) -> Decomposition | None:
    """The body of a region marker that changes nothing at inference (a ``torch.no_grad()``
    block, a disabled autocast), as a graph to translate in place of the node."""
    first_operand = _INLINED_REGIONS.get(node.target)
    if first_operand is None:
        return None
    if node.target is torch.ops.higher_order.wrap_with_autocast and node.args[2]:
        return None  # an enabled autocast changes dtypes: no rule yet
    body = node.graph.owning_module.get_submodule(node.args[first_operand - 1].target)
    return Decomposition(body.graph, list(node.args[first_operand:]))


def _argument_value(argument: Any, env: dict[torch.fx.Node, Any]) -> Any:
    """An FX argument with its nodes replaced by their ONNX values; FX's immutable lists become
    plain lists, which a rule may change."""
    if isinstance(argument, torch.fx.Node):
        return env[argument]
    if isinstance(argument, list):
        return [_argument_value(a, env) for a in argument]
    if isinstance(argument, tuple):
        return tuple(_argument_value(a, env) for a in argument)
    return argument


def _torch_onnx_argument(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return int(to_onnx_dtype(value))
    if isinstance(value, list):
        return [_torch_onnx_argument(v) for v in value]
    return value


def _attribute_value(value: Any) -> Any:
    """A non-tensor operator argument as an ONNX attribute value."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return int(to_onnx_dtype(value))
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return list(value)
    return str(value)


def _promote(ctx: TranslationContext, rule: Rule, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Cast the arguments a rule's ``promoted`` names to the dtype its ``promote`` asks for."""
    schema = ctx.node.target._schema
    positions = [i for i, a in enumerate(schema.arguments) if a.name in rule.promoted]
    if rule.promote is Promote.RESULT:
        dtype = ctx.out_dtype
    else:
        dtype = _common_dtype(ctx.node, positions, rule.promoted)
    args = list(args)
    for i in positions:
        if i < len(args):
            args[i] = _promoted(ctx, args[i], dtype)
    for name in rule.promoted:
        if name in kwargs:
            kwargs[name] = _promoted(ctx, kwargs[name], dtype)
    return tuple(args), kwargs


def _promoted(ctx: TranslationContext, value: Any, dtype: ir.DataType) -> Any:
    """A tensor or number argument as ``dtype``; other arguments (lists, None) as they are."""
    # Imported here: importing dynexport.ops registers the built-in rules, which happens at the
    # first export, not when dynexport is imported (user rules registered before it win).
    from dynexport.ops._helpers import scalar

    return scalar(ctx, value, dtype) if isinstance(value, (ir.Value, int, float, bool)) else value


def _common_dtype(node: torch.fx.Node, positions: Sequence[int], names: Sequence[str]) -> ir.DataType:
    operands = [node.args[i] for i in positions if i < len(node.args)]
    operands += [node.kwargs[n] for n in names if n in node.kwargs]
    vals = [o.meta["val"] if isinstance(o, torch.fx.Node) else o for o in operands]
    return to_onnx_dtype(_result_type([v for v in vals if v is not None]))


def _result_type(vals: Sequence[Any]) -> torch.dtype:
    """torch.result_type over tensors (real or fake) and Python scalars, SymInts included."""
    plain = []
    for v in vals:
        if isinstance(v, torch.Tensor):
            plain.append(torch.empty([1] * v.dim(), dtype=v.dtype) if v.dim() else torch.empty((), dtype=v.dtype))
        elif isinstance(v, torch.SymBool):
            plain.append(True)
        elif isinstance(v, torch.SymInt):
            plain.append(1)
        elif isinstance(v, torch.SymFloat):
            plain.append(1.0)
        else:
            plain.append(v)
    result = plain[0]
    dtype = None
    for other in plain[1:]:
        dtype = torch.result_type(result, other)
        result = torch.empty((), dtype=dtype) if not isinstance(result, torch.Tensor) else result.to(dtype)
    if dtype is None:
        return result.dtype if isinstance(result, torch.Tensor) else torch.tensor(result).dtype
    return dtype


@dataclasses.dataclass
class TranslationSummary:
    """How the program's operators were translated, counted per operator (top-level nodes)."""

    translated: Counter[str] = dataclasses.field(default_factory=Counter)
    decomposed: Counter[str] = dataclasses.field(default_factory=Counter)
    custom_domain: Counter[str] = dataclasses.field(default_factory=Counter)
    unsupported: Counter[str] = dataclasses.field(default_factory=Counter)

    def record(self, translator: _Translator, graph: torch.fx.Graph, missing: list[_Missing]) -> None:
        for node in graph.nodes:
            name = target_name(node.target) if node.op == "call_function" else None
            if node in translator._rules:
                self.translated[name] += 1
            elif node in translator.fallbacks:
                self.custom_domain[name] += 1
            elif node in translator._decompositions:
                self.decomposed[name] += 1
        self.unsupported.update(target for target, _, _ in missing)


@dataclasses.dataclass(frozen=True)
class TranslationOptions:
    """How a program is translated: the table, the opset and what becomes of weights, custom
    domains, module functions and buffer updates (``buffer_updates``, training mode, makes each
    buffer the program mutates a graph input too, its initializer the default, and its new value
    an output ``<buffer>.updated``)."""

    table: TranslationTable
    opset: int
    export_params: bool = True
    keep_initializers_as_inputs: bool = False
    fallback_to_custom_domain: bool = False
    custom_opsets: Mapping[str, int] = dataclasses.field(default_factory=dict)
    module_functions: Callable[[str], bool] | None = None
    buffer_updates: bool = False


class TranslationPlan:
    """Every node of a program with its rule or its traced decomposition, made before anything
    is emitted, so that all unsupported operators are known at once."""

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        io: GraphIO,
        options: TranslationOptions,
        simplifications: Simplifications | None = None,
    ):
        fake_mode = torch._guards.detect_fake_mode(
            [n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"]
        )
        self.program, self.io, self.options = program, io, options
        self.translator = _Translator(
            options.table, options.opset, io.dim_names, fake_mode, options.fallback_to_custom_domain, simplifications
        )
        self.missing = self.translator.plan(program.graph)

    def summary(self) -> TranslationSummary:
        """How the program's operators will be translated, counted per operator."""
        summary = TranslationSummary()
        summary.record(self.translator, self.program.graph, self.missing)
        return summary

    def emit(self) -> ir.Model:
        """The ONNX model (no optimization, no file); raises UnsupportedOperatorError listing every
        operator with no translation."""
        if self.missing:
            uses = _unsupported_uses(self.missing)
            if all(use.min_opset is not None for use in uses):
                raise OpsetTooLowError(uses, self.options.opset)
            raise UnsupportedOperatorError(uses)
        translator, program, io, options = self.translator, self.program, self.io, self.options
        graph = translator.graph
        env: dict[torch.fx.Node, Any] = {}
        signature = program.graph_signature
        state = {**program.state_dict, **program.constants}
        user_names = iter(io.input_names)
        nodes = placeholders(program)
        weight_inputs = []  # listed after the user's inputs, as torch.onnx's exporters list them
        for spec in signature.input_specs:
            node = nodes.get(spec.arg.name)
            if is_user_input(spec):
                name = next(user_names)
                if node is None:  # a None argument has no placeholder
                    continue
                val = node.meta.get("val")
                _refuse_complex_io(val, f"input {name!r}")
                if isinstance(val, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
                    value = ir.Value(name=name)
                    translator.annotate(value, val, None)
                    graph.inputs.append(value)
                    env[node] = value
                else:
                    env[node] = val
                continue
            tensor = state[spec.target]
            if isinstance(tensor, torch.ScriptObject):
                raise ExportError(f"Script object constant {spec.target!r} cannot be exported to ONNX")
            value = ir.Value(name=spec.target)
            translator.annotate(value, tensor, None)
            if options.export_params:
                value.const_value = TorchTensor(_carried(tensor.detach()), name=spec.target)
                graph.register_initializer(value)
                if options.keep_initializers_as_inputs:
                    weight_inputs.append(value)
            else:
                weight_inputs.append(value)
            env[node] = value
        graph.inputs.extend(weight_inputs)

        translator.translate_graph(program.graph, env)
        output_dims = _add_outputs(translator, program, env, io.output_names, io.output_dims)
        updated = _add_buffer_updates(translator, program, env) if options.buffer_updates else {}
        model = ir.Model(
            graph,
            ir_version=10,
            producer_name="dynexport",
            producer_version=_version(),
            functions=list(translator.builder.functions.values()),
        )
        if updated:
            model.metadata_props[BUFFER_UPDATES_KEY] = json.dumps(updated)
        if output_dims:
            model.metadata_props[OUTPUT_DIMS_KEY] = json.dumps(output_dims)
        # Before functions are extracted: they import the domains at the graph's versions.
        _import_custom_domains(graph, dict(options.custom_opsets), translator.builder.domain_versions)
        if options.module_functions is not None:
            extract_module_functions(model, translator.builder.node_module_calls, options.module_functions)
        if translator.fallbacks:
            names = sorted({target_name(t) for t in translator.fallbacks.values()})
            warnings.warn(
                f"{len(names)} operator(s) have no ONNX translation and were exported as custom-domain "
                f"nodes (pkg.torch.<namespace>), which a runtime must implement: {', '.join(names)}",
                stacklevel=4,
            )
        return model


def _import_custom_domains(graph: ir.Graph, custom_opsets: dict[str, int], written_for: dict[str, set[int]]) -> None:
    """Declare every domain the nodes use: at ``custom_opsets``' version, else the version the
    rules' onnxscript Opsets name (``written_for``), else the first node's own (``_version=``),
    else 1."""
    for domain, versions in written_for.items():
        if domain not in custom_opsets and len(versions) > 1:
            raise ExportError(
                f"the custom translations use the domain {domain!r} at versions {sorted(versions)}; a model "
                f"imports one. Pass custom_opsets={{{domain!r}: <version>}} to choose it."
            )
    for node in graph.all_nodes():
        if node.domain not in graph.opset_imports:
            default = min(written_for.get(node.domain, {node.version or 1}))
            graph.opset_imports[node.domain] = custom_opsets.get(node.domain, default)
    for domain, version in custom_opsets.items():
        graph.opset_imports.setdefault(domain, version)


def _add_outputs(
    translator: _Translator,
    program,
    env: dict[torch.fx.Node, Any],
    names: list[str],
    dim_names: dict[str, dict[int, str]],
) -> dict[str, dict[int, str]]:
    """Make the program's user outputs the graph's outputs, named ``names``; None outputs are
    left out, Python numbers become constants. An output dim in ``dim_names`` takes the user's
    name; returns the size each such dim stands for, by output and axis."""
    graph = translator.graph
    used: set[int] = set()
    sizes: dict[str, dict[int, str]] = {}
    for (arg, _), name in zip(user_outputs(program), names):
        if isinstance(arg, torch.fx.Node):
            _refuse_complex_io(arg.meta.get("val"), f"output {name!r}")
        value = env[arg] if isinstance(arg, torch.fx.Node) else arg
        if value is None:
            continue
        if not isinstance(value, ir.Value):
            # As torch.tensor(value) would hold it: float32 for a Python float.
            value = translator.constant(value, to_onnx_dtype(torch.tensor(value).dtype))
        if id(value) in used or value.is_graph_input() or value.is_initializer():
            # One value cannot carry two names, nor be renamed when it is an input or weight.
            identity = translator.builder.op.Identity(value)
            identity.type, identity.shape = value.type, value.shape
            value = identity
        used.add(id(value))
        value.name = name
        if name in dim_names:
            dims = list(value.shape)
            sizes[name] = {axis: str(dims[axis]) for axis in dim_names[name]}
            value.shape = ir.Shape([dim_names[name].get(axis, dim) for axis, dim in enumerate(dims)])
        graph.outputs.append(value)
    # A value inside the graph may hold a name the user gave an output.
    make_names_unique(graph)
    return sizes


def _add_buffer_updates(translator: _Translator, program, env: dict[torch.fx.Node, Any]) -> dict[str, str]:
    """Outputs for the new values of the buffers the program mutates; each buffer also becomes
    a graph input (defaulting to its initializer) so that a caller can feed the state back.
    Returns ``{buffer: output name}``."""
    graph = translator.graph
    updated = {}
    for arg, spec in outputs_of_kind(program, OutputKind.BUFFER_MUTATION):
        buffer = graph.initializers.get(spec.target) or next(v for v in graph.inputs if v.name == spec.target)
        if not buffer.is_graph_input():
            graph.inputs.append(buffer)
        value = translator.builder.op.Identity(env[arg])
        value.type, value.shape = buffer.type, buffer.shape
        value.name = updated[spec.target] = f"{spec.target}.updated"
        graph.outputs.append(value)
    return updated


def _unsupported_uses(missing: list[_Missing]) -> list[UnsupportedUse]:
    by_target: dict[str, list[torch.fx.Node]] = {}
    min_opsets: dict[str, int | None] = {}
    for target, node, min_opset in missing:
        by_target.setdefault(target, []).append(node)
        min_opsets[target] = min_opset
    return [
        UnsupportedUse(
            target,
            len(nodes),
            next(filter(None, map(source_line, nodes)), None),
            min_opsets[target],
            _COMPLEX_WHY if min_opsets[target] is None and any(map(involves_complex, nodes)) else None,
        )
        for target, nodes in by_target.items()
    ]


_COMPLEX_WHY = "on a complex tensor, which no rule for it handles (docs/complex.md lists the complex operators)"


def _carried(tensor: torch.Tensor) -> torch.Tensor:
    """A weight as the graph holds it: a complex one as its (real, imaginary) pairs."""
    return torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor


def _refuse_complex_io(val: Any, what: str) -> None:
    if isinstance(val, torch.Tensor) and val.is_complex():
        raise ComplexTensorError(
            f"the model's {what} is a complex tensor ({val.dtype}); ONNX runtimes have no complex "
            "kernels, so an exported graph carries complex values only inside. Hint: return "
            "torch.view_as_real(x) (or x.abs(), x.real and x.imag) and pass complex inputs the same way "
            "(torch.view_as_complex on a real (..., 2) input inside the model)."
        )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dynexport")
    except PackageNotFoundError:
        return "0+unknown"
