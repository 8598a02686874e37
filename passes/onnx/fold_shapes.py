"""Shape folding over symbolic dims.

The translator computes SymInts with ``Shape -> Squeeze -> arithmetic -> Concat`` chains. Here
each small int64 value gets its *contents*: a tuple of sympy expressions over the graph's dim
names (``batch``, ``seq + 1``), read from value shapes and carried through Shape, Size, Squeeze,
Unsqueeze, Concat, Gather, Slice, Cast, Identity, Add, Sub, Mul, ReduceProd and ReduceSum, and
through Div and Mod where they reduce exactly (``8 * h / 4``, ``8 * h % 4``). Then:

- a value whose contents are all integers becomes a constant;
- a value whose contents equal an earlier value's is replaced by it (``seq`` read from two
  tensors is one value);
- a ``Reshape`` target becomes a constant where each unknown dim is copied from the input
  (``0``) or inferred (``-1``); a ``Reshape`` or ``Expand`` that keeps its input's shape goes;
- a ``Concat`` of sizes read by ``Shape`` nodes that is a run of one tensor's dims becomes one
  ``Shape`` of that run (``Shape(x, 2, 4)`` for its sides read one by one).

Dims are compared by name: the translator names them after torch's symbolic shapes, where one
expression is one size. A dim without a name is never equal to anything.
"""

from __future__ import annotations

import itertools
import operator
import re

import numpy as np
import onnx_ir as ir
import sympy

from dynexport.passes.onnx.values import add_initializer, constant_array, replace_value

__all__ = ["fold_shapes"]

Contents = tuple  # tuple[sympy.Expr, ...]
_MAX_ELEMENTS = 64
_BROADCASTING = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And",
     "Or", "Where", "Max", "Min"}
)


class _Shapes:
    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.contents: dict[int, tuple[Contents, bool]] = {}  # id(value) -> (contents, is_scalar)
        self.first_with: dict[tuple[Contents, bool], ir.Value] = {}
        self._symbols: dict[str, sympy.Expr] = {}
        self._unknown = itertools.count()
        self.changed = 0

    def dim(self, value: ir.Value, d: int | ir.SymbolicDim) -> sympy.Expr:
        if isinstance(d, int):
            return sympy.Integer(d)
        if d.value is None:
            return sympy.Dummy(f"unknown{next(self._unknown)}")
        expr = self._symbols.get(d.value)
        if expr is None:
            names = {name: _size(name) for name in re.findall(r"[A-Za-z_]\w*", d.value)}
            try:
                expr = sympy.parse_expr(d.value, local_dict=names)
            except (sympy.SympifyError, SyntaxError, TypeError):
                expr = None
            if not isinstance(expr, sympy.Expr):
                expr = _size(d.value)
            self._symbols[d.value] = expr
        return expr

    def dims(self, value: ir.Value) -> Contents | None:
        if value.shape is None:
            return None
        return tuple(self.dim(value, d) for d in value.shape)

    def of(self, value: ir.Value | None) -> tuple[Contents, bool] | None:
        if value is None:
            return None
        known = self.contents.get(id(value))
        if known is not None:
            return known
        array = constant_array(value)
        if array is not None and array.dtype == np.int64 and array.ndim <= 1 and array.size <= _MAX_ELEMENTS:
            return tuple(sympy.Integer(int(x)) for x in array.reshape(-1)), array.ndim == 0
        return None


def _size(name: str) -> sympy.Symbol:
    # A dim is a nonnegative integer: 8 * h % 4 is 0.
    return sympy.Symbol(name, integer=True, nonnegative=True)


def fold_shapes(graph: ir.Graph) -> int:
    """Fold and unify shape computations in ``graph``; return how many values changed."""
    shapes = _Shapes(graph)
    for node in list(graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in _BROADCASTING:
            _infer_broadcast_shape(shapes, node)
        if node.op_type == "Reshape":
            _simplify_reshape(shapes, node)  # and a reshaped size keeps its contents, below
        if node.op_type == "Expand":
            _simplify_expand(shapes, node)
            continue
        if len(node.outputs) != 1:
            continue
        result = _contents(shapes, node)
        if result is None:
            continue
        output = node.outputs[0]
        if node.op_type == "Concat":
            output = _as_one_shape(shapes, node, result[0]) or output
        _settle(shapes, output, result)
    return shapes.changed


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _settle(shapes: _Shapes, output: ir.Value, result: tuple[Contents, bool]) -> None:
    contents, scalar = result
    if any(e.is_Integer and not _INT64_MIN <= int(e) <= _INT64_MAX for e in contents):
        return  # int64 arithmetic wraps there (bit tricks on -2**63): onnx's runtime computes it
    if all(e.is_Integer for e in contents):
        array = np.array([int(e) for e in contents], dtype=np.int64)
        constant = add_initializer(shapes.graph, array.reshape(()) if scalar else array, output.name or "shape")
        if replace_value(output, constant):
            shapes.changed += 1
        else:
            del shapes.graph.initializers[constant.name]
        return
    shapes.contents[id(output)] = result
    earlier = shapes.first_with.get(result)
    if earlier is None:
        shapes.first_with[result] = output
    elif replace_value(output, earlier):
        shapes.changed += 1


def _contents(shapes: _Shapes, node: ir.Node) -> tuple[Contents, bool] | None:
    op, inputs, attrs = node.op_type, node.inputs, node.attributes
    if not inputs or inputs[0] is None:
        return None
    if op == "Shape":
        dims = shapes.dims(inputs[0])
        if dims is None:
            return None
        start = attrs["start"].as_int() if "start" in attrs else 0
        end = attrs["end"].as_int() if "end" in attrs else len(dims)
        return dims[slice(*_clamp(start, end, len(dims)))], False
    if op == "Size":
        dims = shapes.dims(inputs[0])
        return None if dims is None else ((sympy.Mul(*dims),), True)
    if op == "Identity" or (op == "Cast" and attrs["to"].as_int() == ir.DataType.INT64):
        return shapes.of(inputs[0])
    first = shapes.of(inputs[0])
    if first is None:
        return None
    contents, scalar = first
    if op == "Squeeze":
        return (contents, True) if len(contents) == 1 and not scalar else None
    if op == "Unsqueeze":
        axes = shapes.of(inputs[1]) if len(inputs) > 1 else None
        return (contents, False) if scalar and axes is not None and tuple(axes[0]) in ((0,), (-1,)) else None
    if op == "Reshape":
        target = shapes.of(inputs[1])
        if target is not None and tuple(target[0]) in ((-1,), (len(contents),)):
            return contents, False
        return (contents, True) if target is not None and target[0] == () and len(contents) == 1 else None
    if op == "Concat":
        parts = [shapes.of(v) for v in inputs]
        if any(p is None or p[1] for p in parts):
            return None
        return tuple(e for p in parts for e in p[0]), False
    if op == "Gather":
        indices = constant_array(inputs[1])
        if indices is None or scalar or indices.ndim > 1 or (attrs["axis"].as_int() if "axis" in attrs else 0) != 0:
            return None
        if any(not -len(contents) <= int(i) < len(contents) for i in indices.reshape(-1)):
            return None
        picked = tuple(contents[int(i)] for i in indices.reshape(-1))
        return picked, indices.ndim == 0
    if op == "Slice":
        params = [constant_array(v) if v is not None else None for v in inputs[1:]]
        if scalar or any(p is None for p in params[:2]) or any(p is None for v, p in zip(inputs[3:], params[2:]) if v is not None):
            return None
        starts, ends = params[0], params[1]
        axes = params[2] if len(params) > 2 and params[2] is not None else np.array([0])
        steps = params[3] if len(params) > 3 and params[3] is not None else np.array([1])
        if starts.size != 1 or int(axes.reshape(-1)[0]) not in (0, -1):
            return None
        return contents[int(starts[0]) : int(ends[0]) : int(steps[0])], False
    if op in ("Add", "Sub", "Mul", "Div", "Mod"):
        second = shapes.of(inputs[1])
        if second is None or (op == "Mod" and "fmod" in attrs and attrs["fmod"].as_int()):
            return None
        return _elementwise(op, first, second)
    if op in ("ReduceProd", "ReduceSum") and not scalar and _reduces_everything(node):
        # A product of sizes: flatten's and view's merged dims (16 * batch).
        whole = sympy.Mul(*contents) if op == "ReduceProd" else sympy.Add(*contents)
        keepdims = attrs["keepdims"].as_int() if "keepdims" in attrs else 1
        return (sympy.expand(whole),), not keepdims
    return None


def _as_one_shape(shapes: _Shapes, concat: ir.Node, contents: Contents) -> ir.Value | None:
    """One Shape of a tensor's run of dims standing for ``concat`` of sizes read by Shape nodes
    (``Shape(x, 2, 3)``, ``Shape(x, 3, 4)``: an image's sides to resize another to), where that
    run of dims of a tensor they read is the ``contents``; its value, or None where none is."""
    readers = [value.producer() for value in concat.inputs]
    if len(readers) < 2 or any(r is None or r.op_type != "Shape" for r in readers):
        return None
    for tensor in dict.fromkeys(r.inputs[0] for r in readers):
        dims = shapes.dims(tensor)
        starts = [] if dims is None else range(len(dims) - len(contents) + 1)
        start = next((i for i in starts if dims[i : i + len(contents)] == contents), None)
        if start is None:
            continue
        end = start + len(contents)
        shape = ir.Node("", "Shape", [tensor], [ir.AttrInt64("start", start), ir.AttrInt64("end", end)])
        shapes.graph.insert_before(concat, shape)
        if replace_value(concat.outputs[0], shape.outputs[0]):
            shapes.changed += 1
            return shape.outputs[0]
        shapes.graph.remove(shape)
        return None
    return None


def _reduces_everything(node: ir.Node) -> bool:
    """Whether a reduction of a 1-D value reduces its one axis (no axes, or axis 0)."""
    axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if len(node.inputs) > 1 and node.inputs[1] is not None and axes is None:
        return False
    if axes is None and "axes" in node.attributes:
        axes = np.array(node.attributes["axes"].as_ints())
    if axes is None or axes.size == 0:
        noop = node.attributes["noop_with_empty_axes"].as_int() if "noop_with_empty_axes" in node.attributes else 0
        return not noop
    return set(axes.reshape(-1).tolist()) <= {0, -1}


def _clamp(start: int, end: int, rank: int) -> tuple[int, int]:
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return start, end


def _elementwise(op: str, a: tuple[Contents, bool], b: tuple[Contents, bool]) -> tuple[Contents, bool] | None:
    (x, x_scalar), (y, y_scalar) = a, b
    if len(x) != len(y):
        if len(x) == 1:
            x = x * len(y)
        elif len(y) == 1:
            y = y * len(x)
        else:
            return None
    combine = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Div": _exact_quotient, "Mod": _remainder}[op]
    results = tuple(combine(p, q) for p, q in zip(x, y))
    if any(r is None for r in results):
        return None
    return tuple(sympy.expand(r) for r in results), x_scalar and y_scalar


def _exact_quotient(p: sympy.Expr, q: sympy.Expr) -> sympy.Expr | None:
    """``p / q`` where it is an integer at every size (ONNX's integer Div truncates, and only
    an exact quotient is the same truncated or floored: 8 * h / 4 is 2 * h); else None."""
    if q == 0:
        return None
    quotient = sympy.cancel(p / q)
    return quotient if quotient.is_integer else None


def _remainder(p: sympy.Expr, q: sympy.Expr) -> sympy.Expr | None:
    """``p mod q`` with the divisor's sign, as ONNX's Mod (fmod=0) computes it on integers; None
    where it does not reduce to an expression free of Mod (8 * h % 4 is 0, h % 4 stays)."""
    if q == 0:
        return None
    remainder = sympy.Mod(p, q)
    return None if remainder.has(sympy.Mod) else remainder


def _infer_broadcast_shape(shapes: _Shapes, node: ir.Node) -> None:
    """Give an unannotated elementwise result the broadcast of its inputs' shapes."""
    output = node.outputs[0]
    if output.shape is not None or any(v is None or v.shape is None for v in node.inputs):
        return
    rank = max(len(v.shape) for v in node.inputs)
    dims = []
    for i in range(rank):
        candidates = {
            d for v in node.inputs for d in [v.shape[i - rank + len(v.shape)] if i - rank + len(v.shape) >= 0 else 1]
            if d != 1
        }
        if not candidates:
            dims.append(1)
        elif len(candidates) == 1 and not (isinstance(d := next(iter(candidates)), ir.SymbolicDim) and d.value is None):
            dims.append(d)
        else:
            return
    output.shape = ir.Shape(dims)


def _simplify_reshape(shapes: _Shapes, node: ir.Node) -> None:
    data, target_value = node.inputs[0], node.inputs[1]
    target, dims = shapes.of(target_value), shapes.dims(data)
    if dims is not None and _skip_inner_reshape(shapes, node):
        return
    if target is None or dims is None or target[1]:
        return
    allow_zero = node.attributes["allowzero"].as_int() if "allowzero" in node.attributes else 0
    entries = list(target[0])
    if any(e == 0 for e in entries) and allow_zero:
        return
    resolved = [dims[i] if e == 0 else e for i, e in enumerate(entries)]
    if resolved == list(dims) and len(resolved) == len(dims):
        if replace_value(node.outputs[0], data):
            shapes.changed += 1
        return
    if all(e.is_Integer for e in target[0]) and not allow_zero:
        return
    new = _constant_target(resolved, dims)
    if new is not None:
        _retarget(shapes, node, data, new)


def _skip_inner_reshape(shapes: _Shapes, node: ir.Node) -> bool:
    """Reshape(Reshape(x, t1), t2) as one Reshape of x, where the outer's result shape is known
    and makes a constant target against x's dims (LeViT's [16 * batch, 256] -> [batch, 16, 256]
    -> [batch, 16, 4, 64] is [-1, 16, 4, 64]); return whether it did."""
    inner = node.inputs[0].producer()
    if inner is None or inner.op_type != "Reshape" or len(node.inputs[0].uses()) != 1 or node.inputs[0].is_graph_output():
        return False
    source, result = inner.inputs[0], shapes.dims(node.outputs[0])
    source_dims = shapes.dims(source) if source is not None else None
    if result is None or source_dims is None or any(isinstance(e, sympy.Dummy) for e in result):
        return False
    new = _constant_target(list(result), source_dims)
    if new is None:
        return False
    _retarget(shapes, node, source, new)
    return True


def _constant_target(resolved: list[sympy.Expr], dims: Contents) -> list[int] | None:
    """A constant Reshape target from ``dims`` to ``resolved``: known sizes, ``0`` for a dim equal
    to the input's at its place, ``-1`` for one other; None where that cannot be written."""
    new = []
    for i, e in enumerate(resolved):
        if e.is_Integer:
            new.append(int(e))
        elif i < len(dims) and e == dims[i]:
            new.append(0)
        else:
            new.append(None)
    unknown = [i for i, e in enumerate(new) if e is None]
    if len(unknown) > 1 or (unknown and -1 in new):
        return None
    if unknown and (any(e <= 0 for e in new if e is not None)):
        return None  # -1 is only safe to infer next to known, nonzero sizes
    if unknown:
        new[unknown[0]] = -1
    return new


def _retarget(shapes: _Shapes, node: ir.Node, data: ir.Value, target: list[int]) -> None:
    constant = add_initializer(shapes.graph, np.array(target, dtype=np.int64), f"{node.outputs[0].name or 'reshape'}_shape")
    node.replace_input_with(0, data)
    node.replace_input_with(1, constant)
    node.attributes.pop("allowzero", None)
    shapes.changed += 1


def _simplify_expand(shapes: _Shapes, node: ir.Node) -> None:
    data, target_value = node.inputs[0], node.inputs[1]
    target, dims = shapes.of(target_value), shapes.dims(data)
    if target is None or dims is None or target[1] or all(e.is_Integer for e in target[0]):
        return
    entries = list(target[0])
    offset = len(entries) - len(dims)
    for i in range(max(0, offset), len(entries)):
        if entries[i] == dims[i - offset]:
            entries[i] = sympy.Integer(1)
    if not all(e.is_Integer for e in entries):
        return
    if all(e == 1 for e in entries) and offset <= 0:
        if replace_value(node.outputs[0], data):
            shapes.changed += 1
        return
    constant = add_initializer(shapes.graph, np.array([int(e) for e in entries], dtype=np.int64), "expand_shape")
    node.replace_input_with(1, constant)
    shapes.changed += 1
