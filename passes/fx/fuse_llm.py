"""A decoder's attention, RMS norm and rotary embedding as whole ops, recognised on the captured
FX graph, where the ATen ops still say what they compute (opset 23 and later):

- ``rms_norm``: transformers' LlamaRMSNorm (Mistral, Qwen2, Gemma's ``1 + weight`` alike):
  ``scale * (x * rsqrt(mean(x**2, -1, keepdim) + eps)).to(dtype)``, x optionally cast to float32
  first -> ONNX RMSNormalization;
- ``rotary_embedding``: ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) =
  cat(-x2, x1)`` and cos/sin computed from ``cat(freqs, freqs)`` (so that their halves are
  equal: the op takes one half) -> ONNX RotaryEmbedding;
- ``attention``: ``scaled_dot_product_attention`` whose keys and values are the cache update
  ``cat([past, new], -2)`` and/or repeated to the query's head count (transformers' ``repeat_kv``:
  unsqueeze, expand, reshape) -> ONNX Attention with past_key/past_value inputs and
  present_key/present_value outputs, grouped-query from the head counts;
- ``attention_3d``, ``rotary_embedding_3d``: such an attention whose queries, keys and values
  are each a projection's heads split off its last axis (``x.view(b, s, heads, d).transpose(1,
  2)``, through a rotary embedding or not) and whose output is merged back the same way
  (``y.transpose(1, 2).reshape(b, s, heads * d)``) -> the same ops on the 3-D (batch, sequence,
  heads * head size) tensors, with their head counts as attributes (no Reshape or Transpose
  around them); the caches stay 4-D.

Every match checks all of its pattern (operators, arguments, shapes, and that no intermediate
result is read elsewhere) and is left alone otherwise: a fused op never stands for half a
pattern. The user's program is not changed: the pass rewrites a copy of its graph.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from dynexport.passes.fx import llm_ops  # noqa: F401  (defines the dynexport:: ops)

__all__ = ["fuse_llm_patterns"]

aten = torch.ops.aten
fused_ops = torch.ops.dynexport
Node = torch.fx.Node

_ASSERTS = frozenset({aten._assert_tensor_metadata.default, aten._assert_scalar.default})
_CASTS = frozenset({aten._to_copy.default, aten.to.dtype, aten.to.device, aten.to.dtype_layout})
_IDENTITIES = frozenset({aten.clone.default, aten.alias.default, aten.contiguous.default, aten.detach.default})
_REPEAT_RESHAPES = frozenset({aten.reshape.default, aten.view.default, aten._unsafe_view.default})
_NO_END = 2**63 - 1


def fuse_llm_patterns(program: torch.export.ExportedProgram, *, opset: int) -> torch.export.ExportedProgram:
    """``program`` with its decoder patterns replaced by dynexport's whole ops (a new program
    sharing the weights), or ``program`` itself when nothing matches or ``opset`` < 23."""
    if opset < 23:
        return program
    graph = _copied_graph(program.graph)
    renamed: dict[str, str] = {}
    fusions = (_fuse_rms_norms, _fuse_rotary_embeddings, _fuse_attentions, _fuse_head_layouts)
    fused = sum(fuse(graph, renamed) for fuse in fusions)
    if not fused:
        return program
    # Loop bodies and branches stay where they are: the new module reads its attributes from the old.
    module = torch.fx.GraphModule(program.graph_module, graph)
    signature = copy.deepcopy(program.graph_signature)
    for spec in signature.output_specs:
        if isinstance(spec.arg, torch.export.graph_signature.TensorArgument) and spec.arg.name in renamed:
            name = spec.arg.name
            while name in renamed:  # replaced by one fusion, then by a later one
                name = renamed[name]
            spec.arg = torch.export.graph_signature.TensorArgument(name)
    return program._update(module, signature)


def _copied_graph(original: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``original`` (node metadata shared, not copied)."""
    graph = torch.fx.Graph()
    graph._codegen = original._codegen
    graph.output(graph.graph_copy(original, {}))
    return graph


# -- matching helpers --------------------------------------------------------------------------


def _users(node: Node) -> list[Node]:
    """The nodes that read ``node``, runtime metadata asserts aside."""
    return [user for user in node.users if user.target not in _ASSERTS]


def _only_user(node: Node) -> Node | None:
    users = _users(node)
    return users[0] if len(users) == 1 else None


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _same(a: object, b: object) -> bool:
    """Sizes (ints or SymInts) that are equal for every input the program accepts."""
    return statically_known_true(a == b) or str(a) == str(b)


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() and all(_same(x, y) for x, y in zip(a.shape, b.shape))


def _is_call(node: object, *targets) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def _argument(node: Node, index: int, name: str, default=None):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _source(node: object) -> object:
    """``node`` read through what returns its input unchanged: identities, same-dtype casts,
    full slices (the matcher's aliases)."""
    while isinstance(node, Node) and node.op == "call_function" and node.args:
        source = node.args[0]
        before, after = _val(source), _val(node)
        if before is None or after is None or not _same_shape(before, after) or before.dtype != after.dtype:
            return node
        full_slice = node.target is aten.slice.Tensor and _argument(node, 4, "step", 1) == 1
        if not (node.target in _IDENTITIES or node.target in _CASTS or full_slice):
            return node
        node = source
    return node


def _aliases_between(node: Node, source: object) -> list[Node]:
    """The alias nodes from ``node`` down to (not including) ``source``."""
    chain = []
    while node is not source:
        chain.append(node)
        node = node.args[0]
    return chain


def _is_last_axis(axis: object, rank: int) -> bool:
    return axis in (-1, rank - 1)


def _python_number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _replace(graph: torch.fx.Graph, old: Node, new: Node, renamed: dict[str, str]) -> None:
    new.meta = {**old.meta, **new.meta}
    old.replace_all_uses_with(new)
    renamed[old.name] = new.name


def _erase_unused(graph: torch.fx.Graph, nodes: list[Node]) -> None:
    """Erase those of ``nodes`` that nothing reads any more but metadata asserts."""
    remaining = set(nodes)
    while erasable := [node for node in remaining if not _users(node)]:
        for node in erasable:
            for check in list(node.users):
                graph.erase_node(check)
            graph.erase_node(node)
            remaining.discard(node)


def _fused_call(graph: torch.fx.Graph, before: Node, op: Callable, args: tuple, val: object) -> Node:
    with graph.inserting_before(before):
        node = graph.call_function(op, args)
    node.meta["val"] = val
    return node


# -- RMS norm ----------------------------------------------------------------------------------


def _fuse_rms_norms(graph: torch.fx.Graph, renamed: dict[str, str]) -> int:
    fused = 0
    for rsqrt in [n for n in graph.nodes if _is_call(n, aten.rsqrt.default)]:
        matched = _rms_norm(rsqrt)
        if matched is None:
            continue
        root, x, scale, epsilon, interior = matched
        node = _fused_call(graph, root, fused_ops.rms_norm.default, (x, scale, epsilon), root.meta["val"])
        _replace(graph, root, node, renamed)
        _erase_unused(graph, [root, *interior])
        fused += 1
    return fused


def _rms_norm(rsqrt: Node):
    """(root, x, scale, epsilon, interior nodes) when ``rsqrt`` is the middle of
    ``scale * (x32 * rsqrt(mean(x32**2, -1, keepdim=True) + eps)).to(x.dtype)`` with x32 x or
    x cast to float32 (either operand order of each product)."""
    plus = _source(rsqrt.args[0])
    if not _is_call(plus, aten.add.Tensor, aten.add.Scalar) or _only_user(plus) is None:
        return None
    mean, epsilon = plus.args[0], _python_number(plus.args[1])
    if epsilon is None or not _is_call(mean, aten.mean.dim) or _only_user(mean) is not plus:
        return None
    square = mean.args[0]
    if not _is_call(square, aten.pow.Tensor_Scalar) or square.args[1] != 2 or _only_user(square) is not mean:
        return None
    x32 = square.args[0]
    x32_val = _val(x32)
    if x32_val is None or x32_val.dtype != torch.float32:
        return None
    dims = _argument(mean, 1, "dim")
    if not (isinstance(dims, (list, tuple)) and len(dims) == 1 and _is_last_axis(dims[0], x32_val.dim())):
        return None
    if not _argument(mean, 2, "keepdim", False) or _argument(mean, 3, "dtype") is not None:
        return None
    product = _only_user(rsqrt)
    if not _is_call(product, aten.mul.Tensor) or set(product.args) != {x32, rsqrt}:
        return None
    x = _uncast(x32)
    x_val = _val(x)
    # The normalized value back in x's dtype (an alias when x is float32).
    normalized, interior = product, [product, rsqrt, plus, mean, square]
    user = _only_user(normalized)
    while user is not None and _is_call(user, *_CASTS) and _val(user).dtype == x_val.dtype:
        normalized, interior = user, [*interior, user]
        user = _only_user(normalized)
    if _val(normalized).dtype != x_val.dtype or not _is_call(user, aten.mul.Tensor) or len(user.args) != 2:
        return None
    scale = user.args[1] if user.args[0] is normalized else user.args[0]
    scale_val = _val(scale)
    hidden = x_val.shape[-1]
    if scale_val is None or scale_val.dim() != 1 or not _same(scale_val.shape[0], hidden):
        return None
    if scale_val.dtype != x_val.dtype or _val(user).dtype != x_val.dtype:
        return None
    if x is not x32:
        interior.append(x32)
    return user, x, scale, epsilon, interior


def _uncast(node: Node) -> Node:
    """x for ``x.float()`` (a cast to float32 from a float dtype), else ``node``."""
    source = _val(node.args[0]) if _is_call(node, *_CASTS) else None
    # Read by the square and the product only: else the cast is needed anyway.
    if source is not None and source.is_floating_point() and len(_users(node)) == 2:
        return node.args[0]
    return node


# -- rotary embedding --------------------------------------------------------------------------


def _fuse_rotary_embeddings(graph: torch.fx.Graph, renamed: dict[str, str]) -> int:
    fused = 0
    halves_of: dict[Node, Node] = {}  # every layer reads the same tables
    for add in [n for n in graph.nodes if _is_call(n, aten.add.Tensor)]:
        matched = _rotary(add)
        if matched is None:
            continue
        x, cos, sin, interior = matched
        halves = [halves_of.get(table) or halves_of.setdefault(table, _first_half(graph, table)) for table in (cos, sin)]
        node = _fused_call(graph, add, fused_ops.rotary_embedding.default, (x, *halves), add.meta["val"])
        _replace(graph, add, node, renamed)
        _erase_unused(graph, [add, *interior])
        fused += 1
    return fused


def _rotary(add: Node):
    """(x, cos, sin, interior nodes) when ``add`` is ``x * cos' + rotate_half(x) * sin'``
    with x (batch, heads, sequence, head size), cos' and sin' ``cos.unsqueeze(1)``,
    ``sin.unsqueeze(1)`` of (batch, sequence, head size) tables whose two halves are equal."""
    if len(add.args) != 2 or _argument(add, 2, "alpha", 1) != 1:
        return None
    for direct, rotated in (add.args, add.args[::-1]):
        matched = _rotary_terms(direct, rotated)
        if matched is not None:
            return matched
    return None


def _rotary_terms(direct: object, rotated: object):
    if not (_is_call(direct, aten.mul.Tensor) and _is_call(rotated, aten.mul.Tensor)):
        return None
    if _only_user(direct) is None or _only_user(rotated) is None:
        return None
    for half_turn, sin_u in (rotated.args, rotated.args[::-1]):
        x = _rotated_half_of(half_turn)
        if x is None or x not in direct.args:
            continue
        cos_u = direct.args[1] if direct.args[0] is x else direct.args[0]
        x_val = _val(x)
        cos, sin = _unsqueezed_table(cos_u, x_val), _unsqueezed_table(sin_u, x_val)
        if cos is None or sin is None:
            return None
        negated, first = half_turn.args[0]
        if _only_user(half_turn) is None:
            return None
        return x, cos, sin, [direct, rotated, half_turn, negated, first, negated.args[0], cos_u, sin_u]
    return None


def _rotated_half_of(node: object) -> Node | None:
    """x when ``node`` is ``cat([-x[..., d/2:], x[..., :d/2]], -1)`` of a 4-D x with an even
    static last dim d."""
    if not _is_call(node, aten.cat.default) or len(node.args[0]) != 2 or _val(node) is None:
        return None
    if not _is_last_axis(_argument(node, 1, "dim", 0), _val(node).dim()):
        return None
    negated, first = node.args[0]
    if not _is_call(negated, aten.neg.default) or _only_user(first) is not node or _only_user(negated) is not node:
        return None
    second = negated.args[0]
    if not (_is_call(first, aten.slice.Tensor) and _is_call(second, aten.slice.Tensor)):
        return None
    x = first.args[0]
    x_val = _val(x)
    if second.args[0] is not x or x_val is None or x_val.dim() != 4 or not isinstance(x_val.shape[-1], int):
        return None
    half = x_val.shape[-1] // 2
    if x_val.shape[-1] % 2 or _only_user(second) is not negated:
        return None
    if not (_slices(first, x_val.dim(), 0, half) and _slices(second, x_val.dim(), half, x_val.shape[-1])):
        return None
    return x


def _slices(node: Node, rank: int, start: int, end: int) -> bool:
    """Whether ``node`` is ``x[..., start:end]`` (an end past x's last element counts as it)."""
    axis, begin, stop = _argument(node, 1, "dim", 0), _argument(node, 2, "start"), _argument(node, 3, "end")
    stop = _NO_END if stop is None else stop
    return _is_last_axis(axis, rank) and (begin or 0) == start and _argument(node, 4, "step", 1) == 1 and (
        stop == end or (end == _val(node.args[0]).shape[-1] and isinstance(stop, int) and stop >= end)
    )


def _unsqueezed_table(node: object, x_val: torch.Tensor) -> Node | None:
    """The (batch or 1, sequence, head size) table of ``node`` = ``table.unsqueeze(1)`` when
    the table's two halves along the last axis are equal by construction."""
    if not _is_call(node, aten.unsqueeze.default) or node.args[1] != 1 or _val(node) is None:
        return None
    table = node.args[0]
    table_val = _val(table)
    if table_val is None or table_val.dim() != 3 or table_val.dtype != x_val.dtype:
        return None
    batch, sequence, size = table_val.shape
    if not ((batch == 1 or _same(batch, x_val.shape[0])) and _same(sequence, x_val.shape[2]) and _same(size, x_val.shape[3])):
        return None
    return table if _repeats_its_halves(table) else None


def _repeats_its_halves(node: object) -> bool:
    """Whether ``node``'s last axis is ``cat([t, t])`` of one t, through elementwise functions
    of one tensor (cos, sin, a cast, a product with a number)."""
    while isinstance(node, Node):
        if _is_call(node, aten.cat.default):
            parts = node.args[0]
            return len(parts) == 2 and parts[0] is parts[1] and _is_last_axis(_argument(node, 1, "dim", 0), _val(node).dim())
        elementwise = _is_call(node, aten.cos.default, aten.sin.default, *_CASTS, *_IDENTITIES)
        by_number = _is_call(node, aten.mul.Tensor, aten.div.Tensor) and _python_number(node.args[1]) is not None
        if not (elementwise or by_number):
            return False
        node = node.args[0]
    return False


def _first_half(graph: torch.fx.Graph, table: Node) -> Node:
    """The first half of ``table`` (``_repeats_its_halves``): its elementwise chain computed again
    from the repeated half ``t`` instead of from ``cat([t, t])``, with no cat and no slice left."""
    chain = [table]
    while not _is_call(chain[-1], aten.cat.default):
        chain.append(chain[-1].args[0])
    node = chain.pop().args[0][0]
    val = _val(table)
    # Right after the table (computed in the graph: a cos or sin), so that every layer may read it.
    place = table
    for step in reversed(chain):
        args = (node, *step.args[1:])
        with graph.inserting_after(place), val.fake_mode:
            node = graph.call_function(step.target, args, step.kwargs)
            node.meta["val"] = step.target(*(_val(a) if isinstance(a, Node) else a for a in args), **step.kwargs)
        place = node
    return node


# -- attention ---------------------------------------------------------------------------------


def _fuse_attentions(graph: torch.fx.Graph, renamed: dict[str, str]) -> int:
    fused = 0
    for sdpa in [n for n in graph.nodes if _is_call(n, aten.scaled_dot_product_attention.default)]:
        matched = _attention(sdpa)
        if matched is None:
            continue
        query, mask, scale, is_causal, key, value, interior = matched
        key_val, value_val = (_val(update) if update is not None else _val(new) for new, _, update in (key, value))
        args = (query, key[0], value[0], mask, key[1], value[1], scale, is_causal)
        node = _fused_call(graph, sdpa, fused_ops.attention.default, args, (_val(sdpa), key_val, value_val))
        node.meta = {**sdpa.meta, **node.meta}
        for index, replaced in enumerate((sdpa, key[2], value[2])):
            if replaced is not None:
                with graph.inserting_before(sdpa):
                    item = graph.call_function(operator.getitem, (node, index))
                item.meta["val"] = _val(replaced)
                _replace(graph, replaced, item, renamed)
                interior.append(replaced)
        _erase_unused(graph, [sdpa, *interior])
        fused += 1
    return fused


def _attention(sdpa: Node):
    """(query, mask, scale, is_causal, (key, past key, update), (value, ...), interior nodes)
    when ``sdpa``'s keys and values come from the same kind of cache update and head repeat,
    and the result changes something (a cache update or repeated heads)."""
    query, key, value = sdpa.args[:3]
    mask = _argument(sdpa, 3, "attn_mask")
    dropout, is_causal = _argument(sdpa, 4, "dropout_p", 0.0), _argument(sdpa, 5, "is_causal", False)
    scale = sdpa.kwargs.get("scale")
    query_val = _val(query)
    if dropout != 0 or query_val is None or query_val.dim() != 4 or not isinstance(query_val.shape[1], int):
        return None
    sides = [_cached_heads(side, query_val) for side in (key, value)]
    if None in sides:
        return None
    (key_new, key_past, key_update, key_interior), (value_new, value_past, value_update, value_interior) = sides
    if (key_past is None) != (value_past is None) or (key_update is None) != (value_update is None):
        return None
    if key_past is None and not key_interior:
        return None  # plain attention: the aten rule translates it as it is
    if key_past is not None and is_causal:
        return None  # causal alignment with a past differs between runtimes
    kv_heads = _val(key_new).shape[1]
    if not isinstance(kv_heads, int) or kv_heads != _val(value_new).shape[1] or query_val.shape[1] % kv_heads:
        return None
    batch = query_val.shape[0]
    if not all(_same(_val(t).shape[0], batch) for t in (key_new, value_new, key_past, value_past) if t is not None):
        return None
    if any(_val(update) is not None and not _later_users_only(update, sdpa) for update in (key_update, value_update)):
        return None
    return (query, mask, scale, is_causal, (key_new, key_past, key_update), (value_new, value_past, value_update),
            key_interior + value_interior)


def _cached_heads(node: Node, query_val: torch.Tensor):
    """(new, past, cache update node, interior nodes) for ``node`` = ``repeat_kv(cat([past, new], -2))``,
    either part optional; None for something else that cannot be read as that."""
    source, interior = _unrepeated(node, query_val)
    if source is None:
        return None
    val = _val(source)
    if val is None or val.dim() != 4:
        return None
    if _is_call(source, aten.cat.default) and len(source.args[0]) == 2 and _argument(source, 1, "dim", 0) in (-2, 2):
        past, new = source.args[0]
        if all(_val(t) is not None and _val(t).dim() == 4 for t in (past, new)) and _val(past).dtype == val.dtype:
            return new, past, source, interior
    return source, None, None, interior


def _unrepeated(node: Node, query_val: torch.Tensor) -> tuple[Node | None, list[Node]]:
    """(x, the repeat's nodes) for ``node`` = transformers' ``repeat_kv(x, n)``:
    ``x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)`` (full slices between them
    allowed); (node, []) when ``node`` is no repeat; (None, []) for a repeat it cannot read."""
    if not _is_call(node, *_REPEAT_RESHAPES):
        return node, []
    expand = _source(node.args[0])
    if not _is_call(expand, aten.expand.default):
        return node, []
    unsqueeze = _source(expand.args[0])
    if not _is_call(unsqueeze, aten.unsqueeze.default) or unsqueeze.args[1] != 2:
        return node, []
    x = _source(unsqueeze.args[0])
    repeat = [node, *_aliases_between(node.args[0], expand), expand,
              *_aliases_between(expand.args[0], unsqueeze), unsqueeze, *_aliases_between(unsqueeze.args[0], x)]
    if any(_only_user(n) is None for n in repeat):
        return None, []
    x_val, expanded, result = _val(x), _val(expand), _val(node)
    if x_val is None or x_val.dim() != 4 or expanded.dim() != 5 or result.dim() != 4:
        return None, []
    b, h, s, d = x_val.shape
    n = expanded.shape[2]
    if not (isinstance(h, int) and isinstance(n, int)):
        return None, []
    if not all(_same(a, e) for a, e in zip((b, h, s, d), (expanded.shape[0], expanded.shape[1], *expanded.shape[3:]))):
        return None, []
    if not (_same(result.shape[0], b) and result.shape[1] == h * n and _same(result.shape[2], s) and _same(result.shape[3], d)):
        return None, []
    return x, repeat


def _later_users_only(node: Node, sdpa: Node) -> bool:
    """Whether every reader of ``node`` comes after ``sdpa`` in the graph (the fused op, put
    where ``sdpa`` is, computes the cache update they read)."""
    later = set()
    following = sdpa.next
    while following.op != "root":
        later.add(following)
        following = following.next
    return all(user in later or _in_repeat_of(user, sdpa) for user in _users(node))


def _in_repeat_of(node: Node, sdpa: Node) -> bool:
    while node is not sdpa:
        users = _users(node)
        if len(users) != 1 or users[0].op != "call_function":
            return False
        node = users[0]
    return True


# -- heads along the hidden axis ---------------------------------------------------------------


def _fuse_head_layouts(graph: torch.fx.Graph, renamed: dict[str, str]) -> int:
    fused = 0
    for attention in [n for n in graph.nodes if _is_call(n, fused_ops.attention.default)]:
        matched = _attention_over_hidden(attention)
        if matched is None:
            continue
        sides, merged, interior = matched
        inputs = []
        for x, heads, rotary in sides:
            if rotary is not None:
                x = _fused_call(graph, attention, fused_ops.rotary_embedding_3d.default, (x, *rotary.args[1:], heads),
                                _val(x))
                x.meta = {**rotary.meta, **x.meta}
            inputs.append(x)
        items = _items(attention)
        # Without a past the op's keys and values are the new ones (unread: see _attention_over_hidden).
        presents = [_val(items[i]) if i in items else _val(attention.args[i]) for i in (1, 2)]
        heads = (sides[0][1], sides[1][1])
        node = _fused_call(graph, attention, fused_ops.attention_3d.default, (*inputs, *attention.args[3:], *heads),
                           (_val(merged), *presents))
        node.meta = {**attention.meta, **node.meta}
        for index, replaced in ((0, merged), (1, items.get(1)), (2, items.get(2))):
            if replaced is not None:
                with graph.inserting_before(attention):
                    item = graph.call_function(operator.getitem, (node, index))
                item.meta["val"] = _val(replaced)
                _replace(graph, replaced, item, renamed)
        _erase_unused(graph, [merged, *items.values(), attention, *interior])
        fused += 1
    return fused


def _items(node: Node) -> dict[int, Node]:
    return {user.args[1]: user for user in node.users if user.target is operator.getitem}


def _attention_over_hidden(attention: Node):
    """(((x, heads, rotary node or None) for the query, key and value), the merged output,
    interior nodes) when each of ``attention``'s query, key and value is ``split(x)`` or
    ``rotary_embedding(split(x))`` of a 3-D x, read by nothing else, and its output is read
    only through the merge back to 3-D (see :func:`_split_heads_of`, :func:`_merged_heads`)."""
    items = _items(attention)
    if set(items) - {0, 1, 2} or len(items) != len(attention.users):
        return None
    if attention.args[4] is None and any(_users(items[i]) for i in (1, 2) if i in items):
        return None  # the 4-D new keys and values read without a cache: not worth a Reshape
    sides, interior = [], []
    for x in attention.args[:3]:
        rotary = x if _is_call(x, fused_ops.rotary_embedding.default) else None
        if rotary is not None:
            if _only_user(rotary) is not attention:
                return None
            interior.append(rotary)
            x = rotary.args[0]
        split = _split_heads_of(x, attention if rotary is None else rotary)
        if split is None:
            return None
        sides.append((split[0], _val(x).shape[1], rotary))
        interior += split[1]
    if 0 not in items:
        return None
    merged = _merged_heads(items[0])
    if merged is None:
        return None
    return sides, merged[0], interior + merged[1]


def _split_heads_of(node: Node, reader: Node) -> tuple[Node, list[Node]] | None:
    """(x, the split's nodes) when ``node`` is ``x.view(b, s, heads, d).transpose(1, 2)`` of x
    (b, s, heads * d), read by ``reader`` alone: the heads are x's last axis' consecutive
    slices, as the 3-D forms of RotaryEmbedding and Attention read them."""
    if not _is_call(node, aten.transpose.int) or _only_user(node) is not reader:
        return None
    if sorted(d % 4 for d in node.args[1:3]) != [1, 2]:
        return None
    view = node.args[0]
    if not _is_call(view, *_REPEAT_RESHAPES) or _only_user(view) is not node:
        return None
    x = view.args[0]
    x_val, split_val = _val(x), _val(view)
    if x_val is None or split_val is None or x_val.dim() != 3 or split_val.dim() != 4:
        return None
    b, s, heads, size = split_val.shape
    if not (isinstance(heads, int) and isinstance(size, int) and _same(x_val.shape[2], heads * size)):
        return None
    if not (_same(x_val.shape[0], b) and _same(x_val.shape[1], s)):
        return None
    return x, [node, view]


def _merged_heads(output: Node) -> tuple[Node, list[Node]] | None:
    """(the merged node, the nodes before it) when ``output`` (b, heads, s, d) is read only by
    ``output.transpose(1, 2).reshape(b, s, heads * d)``, with reshapes to its own shape and
    identities on the way."""
    interior, node = [], output
    while (user := _only_user(node)) is not None and _is_call(user, *_REPEAT_RESHAPES, *_IDENTITIES):
        if not _same_shape(_val(user), _val(output)):
            break
        interior.append(user)
        node = user
    transpose = _only_user(node)
    if not _is_call(transpose, aten.transpose.int) or sorted(d % 4 for d in transpose.args[1:3]) != [1, 2]:
        return None
    interior.append(transpose)
    node = transpose
    while (user := _only_user(node)) is not None and _is_call(user, *_IDENTITIES):
        interior.append(user)
        node = user
    merge = _only_user(node)
    if not _is_call(merge, *_REPEAT_RESHAPES):
        return None
    b, heads, s, size = _val(output).shape
    merged_val = _val(merge)
    if merged_val is None or merged_val.dim() != 3 or not isinstance(heads, int) or not isinstance(size, int):
        return None
    expected = (b, s, heads * size)
    if not all(_same(got, want) for got, want in zip(merged_val.shape, expected)):
        return None
    return merge, interior
