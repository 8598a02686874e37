"""transformers' cache objects as export inputs and outputs, and the names their tensors get.

torch.export walks inputs and outputs with pytree, and transformers does not register its caches
there. While an export runs (and while an ``ONNXProgram`` is called) these classes are pytree
nodes, and the registration is undone afterwards, so dynexport leaves pytree as it found it:

- ``DynamicCache``: two children, ``key_cache`` and ``value_cache``, each a list of one tensor
  per layer ``[batch, heads, past, head_dim]``; ``dynamic_shapes`` gives the cache as
  ``[[key specs per layer], [value specs per layer]]``. Its layers may mix full attention and
  sliding windows (Gemma 2 and 3, GPT-OSS): a sliding-window layer's tensors hold its last
  ``min(seen, window - 1)`` tokens, and the count of tokens it has seen, which transformers keeps
  in a Python int, is a full-attention layer's past length (:func:`sliding_windows_sized_by_keys`);
  in a cache of sliding-window layers alone, the layer's own (:func:`check_sliding_window_dims`).
- a hybrid decoder's ``DynamicCache``, whose layers also keep states of a fixed size
  (``LinearAttentionLayer``: LFM2's convolutions, Qwen3-Next's linear attention;
  ``LinearAttentionAndFullAttentionLayer``; ``DummyLayer``, holding nothing): four children,
  ``key_cache`` and ``value_cache`` of its attention layers, ``conv_states`` and
  ``recurrent_states`` of the others (one tensor per state held); ``dynamic_shapes`` is
  ``[[keys], [values], [conv states], [recurrent states]]``. Whether a layer has a previous state,
  on which the model branches between a prompt and a step, is kept in the tree spec with the
  layer kinds (:func:`_flatten_state_layers`).
- ``StaticCache``: ``key_cache``, ``value_cache`` (``[batch, heads, max_cache_len, head_dim]``)
  and ``cumulative_length`` (one 0-d int64 tensor per layer: the tokens written so far);
  ``dynamic_shapes`` is ``[[keys], [values], [lengths]]``.
- ``EncoderDecoderCache``: ``self_attention_cache`` and ``cross_attention_cache``, each one of
  the above; ``dynamic_shapes`` is ``[self-attention specs, cross-attention specs]``.

While capturing (:func:`first_fills_kept`), a ``DynamicLayer``'s first update keeps the keys and
values it is given instead of concatenating them to an empty tensor, as transformers does, and a
``LinearAttentionLayer``'s first conv fill does without transformers' branch on a prompt shorter
than the convolution.

The ONNX graph names a cache's tensors as onnxruntime-genai and optimum do
(:func:`cache_leaf_names`): ``past_key_values.<layer>.key`` / ``.value`` for a cache among the
inputs, ``present.<layer>.key`` / ``.value`` for one among the outputs, with ``.decoder`` /
``.encoder`` before ``.key`` in an encoder-decoder cache; a hybrid decoder's states are
``<prefix>.<layer>.conv_state`` and ``.recurrent_state``, as onnxruntime-genai names them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

__all__ = [
    "CACHE_INPUT_PREFIX", "CACHE_OUTPUT_PREFIX", "UnflattenableCache", "cache_leaf_names", "caches_flattened",
    "check_cache_shapes", "check_sliding_window_dims", "first_fills_kept", "is_cache", "sliding_windows_sized_by_keys",
]

CACHE_INPUT_PREFIX = "past_key_values"
CACHE_OUTPUT_PREFIX = "present"

_LAYER_CHILDREN = {"DynamicCache": ("key_cache", "value_cache"),
                   "StaticCache": ("key_cache", "value_cache", "cumulative_length")}
_ENCODER_DECODER_CHILDREN = ("self_attention_cache", "cross_attention_cache")
_LAYER_TYPE = {"DynamicCache": "DynamicLayer", "StaticCache": "StaticLayer"}
# The part of an encoder-decoder cache each child is, in the ecosystem's names.
_ENCODER_DECODER_PARTS = {"self_attention_cache": "decoder", "cross_attention_cache": "encoder"}
_TENSOR_KINDS = {"key_cache": "key", "value_cache": "value"}


class UnflattenableCache(TypeError):
    """A cache object dynexport cannot make graph inputs or outputs of: every capture strategy
    meets it alike, so capture stops at the first."""


@contextlib.contextmanager
def caches_flattened(values: Any = None) -> Iterator[None]:
    """Make transformers' ``DynamicCache``, ``StaticCache`` and ``EncoderDecoderCache`` pytree
    nodes within the block: those that nothing registered already, when ``values`` (any nesting
    of lists, tuples and dicts; None: always) holds a cache."""
    cache_types = _cache_types()
    wanted = bool(cache_types) and (
        values is None or any(type(leaf) in cache_types.values() for leaf in pytree.tree_leaves(values))
    )
    registered = []
    try:
        if wanted:
            for name, cache_type in cache_types.items():
                if cache_type in pytree.SUPPORTED_NODES:
                    continue
                _register(name, cache_type)
                registered.append(cache_type)
        yield
    finally:
        for cache_type in registered:
            pytree._deregister_pytree_node(cache_type)
            fx_pytree._deregister_pytree_flatten_spec(cache_type)


@contextlib.contextmanager
def first_fills_kept() -> Iterator[None]:
    """Within the block (a capture), a ``DynamicLayer``'s first update keeps the keys and values
    it is given rather than concatenating them to the empty tensor it starts with: the same
    values, without one traced concatenation per layer and tensor on symbolic shapes (about a
    second for a 30-layer ``DynamicCache`` built from key/value pairs). And a
    ``LinearAttentionLayer``'s first conv fill (a prompt) keeps the last ``kernel`` positions of
    its inputs after ``kernel`` zeros, without transformers' branch on a prompt shorter than the
    kernel, which fixed LFM2's plain call to ``seq >= 3`` (:func:`_conv_fills_unpadded`). The
    eager model is left as it is."""
    with _dynamic_first_fills_kept(), _conv_fills_unpadded():
        yield


def _dynamic_first_fills_kept() -> contextlib.AbstractContextManager[None]:

    def replacements(layer_type: type) -> dict[str, Any]:
        original = layer_type.update

        def update(self: Any, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if type(self) is not layer_type or self.is_initialized:
                return original(self, key_states, value_states, *args, **kwargs)
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states
            return self.keys, self.values

        return {"update": update}

    return _layer_methods_replaced("DynamicLayer", ("update",), replacements)


def _conv_fills_unpadded() -> contextlib.AbstractContextManager[None]:
    """Within the block, a ``LinearAttentionLayer``'s first ``update_conv_state`` of a known
    kernel stores the last ``kernel`` positions of ``zeros(kernel) + inputs`` (what transformers
    stores on either side of its branch on ``inputs < kernel``) and returns the inputs as given:
    transformers returns them left-padded to the kernel when shorter, which the models' causal
    convolutions (LFM2's, Qwen3-Next's: zero padding of ``kernel - 1``, the last ``seq`` outputs
    kept) read alike."""

    def replacements(layer_type: type) -> dict[str, Any]:
        original = layer_type.update_conv_state

        def update_conv_state(self: Any, conv_states: torch.Tensor, state_idx: int = 0,
                              conv_kernel_size: int | None = None, **kwargs: Any) -> torch.Tensor:
            size = conv_kernel_size if conv_kernel_size is not None else self.conv_kernel_size[state_idx]
            if self.record_past or self.has_previous_state[state_idx] or size is None:
                return original(self, conv_states, state_idx, conv_kernel_size=conv_kernel_size, **kwargs)
            if not self.is_conv_states_initialized[state_idx]:
                self.lazy_initialization(conv_states=conv_states, state_idx=state_idx, conv_kernel_size=size)
            self.has_previous_state[state_idx] = True
            zeros = conv_states.new_zeros(*conv_states.shape[:-1], size)
            self.conv_states[state_idx].copy_(torch.cat([zeros, conv_states], dim=-1)[..., -size:])
            return conv_states

        return {"update_conv_state": update_conv_state}

    return _layer_methods_replaced("LinearAttentionLayer", ("update_conv_state",), replacements)


def sliding_windows_sized_by_keys() -> contextlib.AbstractContextManager[None]:
    """Within the block (a capture), a ``DynamicSlidingWindowLayer`` sizes its attention mask from
    the keys it holds, not from its token count: it holds ``min(seen, window - 1)`` past tokens,
    so its mask covers ``held + new`` keys from position ``seen - held``, which is what
    transformers computes by branching on ``seen >= window`` (a branch that would fix the graph
    to one side of the window). The eager model is left as it is."""

    def replacements(layer_type: type) -> dict[str, Any]:
        original_sizes, original_update = layer_type.get_mask_sizes, layer_type.update

        def get_mask_sizes(self: Any, query_length: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if type(self) is not layer_type or not self.is_initialized:
                return original_sizes(self, query_length, *args, **kwargs)
            held = self.keys.shape[-2]
            return held + query_length, self.cumulative_length - held

        def update(self: Any, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if type(self) is not layer_type or not self.is_initialized or self.record_past:
                return original_update(self, key_states, value_states, *args, **kwargs)
            self.cumulative_length += key_states.shape[-2]
            keys = torch.cat([self.keys, key_states], dim=-2)
            values = torch.cat([self.values, value_states], dim=-2)
            kept = torch.sym_min(keys.shape[-2], self.sliding_window - 1)
            self.keys = keys.narrow(-2, keys.shape[-2] - kept, kept)
            self.values = values.narrow(-2, values.shape[-2] - kept, kept)
            return keys, values

        return {"get_mask_sizes": get_mask_sizes, "update": update}

    return _layer_methods_replaced("DynamicSlidingWindowLayer", ("get_mask_sizes", "update"), replacements)


@contextlib.contextmanager
def _layer_methods_replaced(
    type_name: str, names: tuple[str, ...], replacements: Callable[[type], dict[str, Any]]
) -> Iterator[None]:
    """Within the block, transformers' cache layer class ``type_name`` has the methods ``names``
    that ``replacements(layer_class)`` makes; none is replaced where transformers is not imported
    or the class does not define each of them itself (another transformers version)."""
    layer_type = getattr(sys.modules.get("transformers.cache_utils"), type_name, None)
    if layer_type is None or not set(names) <= set(vars(layer_type)):
        yield
        return
    originals = {name: vars(layer_type)[name] for name in names}
    for name, method in replacements(layer_type).items():
        setattr(layer_type, name, method)
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(layer_type, name, method)


def check_cache_shapes(dynamic_shapes: Any, bound: Mapping[str, Any]) -> None:
    """Refuse a ``dynamic_shapes`` entry of a cache argument that gives another number of lists
    than the cache flattens to (torch.export's own message, ``Node arity mismatch``, names
    neither the argument nor the lists).

    Raises:
        ValueError: the entry's lists, and the ones the cache holds.
    """
    if isinstance(dynamic_shapes, Mapping):
        pairs = [(name, dynamic_shapes.get(name), value) for name, value in bound.items()]
    elif isinstance(dynamic_shapes, (list, tuple)):
        pairs = [(name, spec, value) for (name, value), spec in zip(bound.items(), dynamic_shapes)]
    else:
        return
    for name, spec, value in pairs:
        if not is_cache(value) or not isinstance(spec, (list, tuple)):
            continue
        with caches_flattened(value):
            keyed, _ = pytree.SUPPORTED_NODES[type(value)].flatten_with_keys_fn(value)
        children = [key.key for key, _ in keyed]
        if len(spec) != len(children):
            lists = ", ".join(f"[{child}]" for child in children)
            raise ValueError(
                f"dynamic_shapes[{name!r}] gives {len(spec)} lists for a {type(value).__name__} that flattens to "
                f"{len(children)}: [{lists}], each with one spec per layer that holds it (docs/llm.md)"
            )


def check_sliding_window_dims(declared: Iterable[tuple[str, int, Any, Any]], values: Any) -> None:
    """Refuse the past lengths of a ``DynamicCache``'s sliding-window layers the graph cannot be
    right at. ``declared`` is ``(path, axis, dim, tensor)`` per declared axis of ``values``' tensors.

    A sliding-window layer holds ``min(seen, window - 1)`` past tokens, a full-attention layer all
    ``seen``: one dim for both would declare the graph valid only while ``seen < window``, and
    capture would read the sliding window's past position as 0. A cache of sliding-window layers
    alone (Mistral's default) has no length to read ``seen`` from: the graph takes it to be the
    tokens held, which is right only while the window is not full, so the past length must stay
    below ``window - 1``.

    Raises:
        ValueError: a sliding-window layer's axis 2 has the dim of a full-attention layer's, or,
            in a cache without full-attention layers, may reach ``window - 1``.
    """
    declared = list(declared)
    windows: dict[int, int | None] = {}  # id of a layer's keys or values: the layer's window
    alone: dict[int, int] = {}  # the same, in a cache of sliding-window layers alone: its past length
    for cache in pytree.tree_leaves(values, is_leaf=is_cache):
        parts = [cache.self_attention_cache, cache.cross_attention_cache] if hasattr(cache, "self_attention_cache") else [cache]
        for part in parts:
            layers = getattr(part, "layers", ())
            part_windows = [_sliding_window(layer) for layer in layers]
            for layer, window in zip(layers, part_windows):
                if not isinstance(getattr(layer, "keys", None), torch.Tensor):
                    continue  # a layer of states (LinearAttentionLayer), or a DummyLayer
                windows[id(layer.keys)] = windows[id(layer.values)] = window
                if part_windows and all(part_windows) and isinstance(layer.keys, torch.Tensor):
                    alone[id(layer.keys)] = alone[id(layer.values)] = layer.keys.shape[-2]
    past = [(dim, windows[id(tensor)]) for _, axis, dim, tensor in declared
            if axis == 2 and id(tensor) in windows and isinstance(dim, torch.export.Dim)]
    full = {dim.__name__ for dim, window in past if window is None}
    for dim, window in past:
        if window is not None and dim.__name__ in full:
            raise ValueError(
                f"dynamic_shapes gives a DynamicCache's sliding-window layers (window {window}) the past length of its "
                f"full-attention layers, {dim.__name__}: a sliding-window layer holds at most {window - 1} past tokens "
                "(the model drops older ones) where a full-attention layer holds them all. Give the sliding-window "
                f"layers' keys and values a dim of their own: Dim('{dim.__name__}_window', min=0, max={window - 1})"
            )
    declared_past = {id(tensor): dim for _, axis, dim, tensor in declared if axis == 2}
    for tensor_id, held in alone.items():
        window, dim = windows[tensor_id], declared_past.get(tensor_id)
        if dim is None or isinstance(dim, int):
            too_long = held > window - 2
        else:
            too_long = not isinstance(dim, torch.export.Dim) or dim.max > window - 2
        if too_long:
            name = getattr(dim, "__name__", "past")
            raise ValueError(
                f"a DynamicCache whose layers all keep a sliding window ({window} tokens) counts the tokens it has "
                "seen in a Python int, which its tensors do not carry: the graph takes them to be the tokens held, "
                f"right only while the window is not full, at a past length of at most {window - 2}. Declare the "
                f"past length Dim('{name}', min=0, max={window - 2})"
                + ("" if dim is None or isinstance(dim, int) else f" (it is {dim!r})")
                + f", with an example past of at most {window - 2}"
            )


def _sliding_window(layer: Any) -> int | None:
    return getattr(layer, "sliding_window", None) if type(layer).__name__ == "DynamicSlidingWindowLayer" else None


def is_cache(value: Any) -> bool:
    """Whether ``value`` is one of the transformers caches dynexport flattens."""
    return type(value) in _cache_types().values()


def cache_leaf_names(spec: pytree.TreeSpec | None, prefix: str) -> dict[int, str]:
    """The ecosystem's names for the cache tensors among the leaves of ``spec`` (a call's or a
    result's tree spec), by leaf position: ``<prefix>.<layer>.key`` and so on (module doc).
    Only the first cache of the tree is named; a StaticCache's written lengths are named
    ``<prefix>.<layer>.cumulative_length``."""
    if spec is None:
        return {}
    names: dict[int, str] = {}
    _name_first_cache(spec, 0, prefix, names)
    return names


def _name_first_cache(spec: pytree.TreeSpec, first_leaf: int, prefix: str, names: dict[int, str]) -> bool:
    kind = _cache_kind(spec.type)
    if kind is not None:
        _name_cache(spec, kind, first_leaf, prefix, "", names)
        return True
    position = first_leaf
    for child in spec.children():
        if _name_first_cache(child, position, prefix, names):
            return True
        position += child.num_leaves
    return False


def _name_cache(spec: pytree.TreeSpec, kind: str, first_leaf: int, prefix: str, part: str, names: dict[int, str]) -> None:
    position = first_leaf
    if kind == "EncoderDecoderCache":
        for child_name, child in zip(_ENCODER_DECODER_CHILDREN, spec.children()):
            child_kind = _cache_kind(child.type)
            if child_kind is not None:
                _name_cache(child, child_kind, position, prefix, f".{_ENCODER_DECODER_PARTS[child_name]}", names)
            position += child.num_leaves
        return
    if kind == "DynamicCache" and spec.num_children == len(_STATE_CHILDREN):
        for child, layer_names in zip(spec.children(), _state_layer_names(spec.context).values()):
            for offset, layer_name in enumerate(layer_names):
                names[position + offset] = f"{prefix}.{layer_name}"
            position += child.num_leaves
        return
    for child_name, child in zip(_LAYER_CHILDREN[kind], spec.children()):
        tensor = _TENSOR_KINDS.get(child_name, child_name)
        for layer in range(child.num_leaves):
            names[position + layer] = f"{prefix}.{layer}{part}.{tensor}"
        position += child.num_leaves


def _cache_kind(node_type: Any) -> str | None:
    for name, cache_type in _cache_types().items():
        if node_type is cache_type:
            return name
    return None


def _cache_types() -> dict[str, type]:
    # Only a model that already imported transformers can hold its caches.
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        return {}
    return {name: getattr(cache_utils, name) for name in (*_LAYER_CHILDREN, "EncoderDecoderCache") if hasattr(cache_utils, name)}


def _register(name: str, cache_type: type) -> None:
    if name == "EncoderDecoderCache":
        children_names = _ENCODER_DECODER_CHILDREN

        def flatten(cache: Any) -> tuple[list[Any], Any]:
            return _flatten_encoder_decoder(cache)

        def unflatten(children: list[Any], context: Any) -> Any:
            return _unflatten_encoder_decoder(cache_type, children)
    else:
        children_names = _LAYER_CHILDREN[name]
        layer_type = getattr(sys.modules[cache_type.__module__], _LAYER_TYPE[name])

        def flatten(cache: Any) -> tuple[list[Any], Any]:
            return _flatten_layers(cache, name, layer_type)

        def unflatten(children: list[Any], context: Any) -> Any:
            return _unflatten_layers(cache_type, layer_type, children, context)

    def flatten_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], Any]:
        children, context = flatten(cache)
        keys = _STATE_CHILDREN if len(children) == len(_STATE_CHILDREN) else children_names
        return [(pytree.MappingKey(key), child) for key, child in zip(keys, children)], context

    pytree._private_register_pytree_node(
        cache_type, flatten, unflatten,
        serialized_type_name=f"{cache_type.__module__}.{cache_type.__name__}",
        flatten_with_keys_fn=flatten_with_keys,
    )
    fx_pytree.register_pytree_flatten_spec(cache_type, lambda cache, spec: flatten(cache)[0])


def _flatten_layers(cache: Any, name: str, layer_type: type) -> tuple[list[list[Any]], Any]:
    layers = cache.layers
    if name == "DynamicCache" and any(type(layer).__name__ in _STATE_LAYERS for layer in layers):
        return _flatten_state_layers(cache)
    sliding_type = _sliding_layer_type(layer_type) if name == "DynamicCache" else None
    accepted = (layer_type, sliding_type)
    if any(type(layer) not in accepted for layer in layers):
        raise _unflattenable(name, layers)
    if any(not layer.is_initialized for layer in layers):
        raise ValueError(
            f"a {name} whose layers hold no tensors yet cannot be an export input or output: fill it "
            + ("(an empty cache: tensors of shape [batch, heads, 0, head_dim], as "
               "DynamicCache([(keys, values)] * layers) makes)" if name == "DynamicCache"
               else "with cache.early_initialization(batch_size, num_heads, head_dim, dtype, device)")
        )
    children = [[layer.keys for layer in layers], [layer.values for layer in layers]]
    if name == "StaticCache":
        children.append([layer.cumulative_length for layer in layers])
        return children, tuple(layer.max_cache_len for layer in layers)
    windows = tuple(layer.sliding_window if type(layer) is sliding_type else None for layer in layers)
    if not any(windows):
        return children, None
    if any(layer.record_past for layer, window in zip(layers, windows) if window):
        raise UnflattenableCache(
            "a DynamicCache recording its sliding-window layers' past (activate_past_recording, for assisted "
            "decoding) cannot be an export input: pass one that does not record"
        )
    return children, windows


def _unflatten_layers(cache_type: type, layer_type: type, children: list[list[Any]], context: Any) -> Any:
    # The layers take the leaves as they are (the constructor would allocate or concatenate
    # tensors): naming outputs unflattens placeholders that are no tensors.
    if len(children) == len(_STATE_CHILDREN):
        return _unflatten_state_layers(cache_type, children, context)
    cache = cache_type.__new__(cache_type)
    static = len(children) == 3
    windows = context if not static and context is not None else (None,) * len(children[0])
    layers = []
    for index, tensors in enumerate(zip(*children)):
        if static:
            layer = layer_type(max_cache_len=context[index])
        elif windows[index]:
            layer = _sliding_layer_type(layer_type)(sliding_window=windows[index])
        else:
            layer = layer_type()
        layer.keys, layer.values = tensors[:2]
        if static:
            layer.cumulative_length = tensors[2]
        layer.is_initialized = True
        layer.device = getattr(layer.keys, "device", None)
        if isinstance(layer.keys, torch.Tensor) and static:
            layer.batch_size, layer.num_heads, _, layer.k_head_dim = layer.keys.shape
            layer.v_head_dim = layer.values.shape[-1]
        layers.append(layer)
    if any(windows):
        # A sliding-window layer has seen as many tokens as a full-attention layer holds; with
        # no such layer, as many as it holds itself (check_sliding_window_dims: while its
        # window is not full).
        seen = next((layer.keys for layer, window in zip(layers, windows) if not window), None)
        for layer, window in zip(layers, windows):
            if window:
                held = layer.keys if seen is None else seen
                layer.cumulative_length = held.shape[-2] if isinstance(held, torch.Tensor) else 0
    if layers:
        super(cache_type, cache).__init__(layers=layers)
    else:  # a DynamicCache that holds no layer yet adds them as the model fills it
        super(cache_type, cache).__init__(layer_class_to_replicate=layer_type)
    return cache


def _sliding_layer_type(layer_type: type) -> type | None:
    return getattr(sys.modules[layer_type.__module__], "DynamicSlidingWindowLayer", None)


# A DynamicCache holding layers of these kinds (hybrid decoders: LFM2's convolutions, Qwen3-Next's
# linear attention, Mamba's state spaces) flattens to four lists: the keys and values of its
# attention layers, then the conv states and recurrent states of its other layers.
_STATE_LAYERS = ("LinearAttentionLayer", "LinearAttentionAndFullAttentionLayer", "DummyLayer")
_ATTENTION_LAYERS = ("DynamicLayer", "LinearAttentionAndFullAttentionLayer")
_STATE_CHILDREN = ("key_cache", "value_cache", "conv_states", "recurrent_states")


def _unflattenable(name: str, layers: list[Any]) -> UnflattenableCache:
    kinds = ("full-attention and sliding-window layers, or of full-attention layers and layers of states "
             f"({', '.join(_STATE_LAYERS)})" if name == "DynamicCache" else "full-attention layers")
    return UnflattenableCache(
        f"dynexport flattens a {name} of {kinds} only; this one holds "
        f"{sorted({type(layer).__name__ for layer in layers})}. Export the model without a cache: "
        "use_cache=False, and no cache argument"
    )


def _flatten_state_layers(cache: Any) -> tuple[list[list[Any]], tuple]:
    """The four lists of a DynamicCache with state layers, and per layer ``(kind, conv kernel
    size or None per state, recurrent state held per state, has_previous_state per state)``:
    what the model branches on (a prompt or a step), kept in the tree spec."""
    layers = cache.layers
    if {type(layer).__name__ for layer in layers} - {*_STATE_LAYERS, *_ATTENTION_LAYERS}:
        raise _unflattenable("DynamicCache", layers)
    keys, values, convs, recurrents, layout = [], [], [], [], []
    for layer in layers:
        kind = type(layer).__name__
        if kind in _ATTENTION_LAYERS:
            if not layer.is_initialized:
                raise ValueError(
                    "a DynamicCache whose attention layers hold no tensors yet cannot be an export input or output: "
                    "fill it (a prompt's cache, as the model returns it)"
                )
            keys.append(layer.keys)
            values.append(layer.values)
        if kind == "DummyLayer" or not hasattr(layer, "conv_states"):
            layout.append((kind, (), (), ()))
            continue
        if layer.record_past:
            raise UnflattenableCache(
                "a DynamicCache recording its linear-attention layers' past (activate_past_recording, for assisted "
                "decoding) cannot be an export input: pass one that does not record"
            )
        states = range(layer.number_of_states)
        conv_sizes = tuple(layer.conv_kernel_size[i] if layer.is_conv_states_initialized[i] else None for i in states)
        recurrent = tuple(bool(layer.is_recurrent_states_initialized[i]) for i in states)
        convs += [layer.conv_states[i] for i in states if conv_sizes[i] is not None]
        recurrents += [layer.recurrent_states[i] for i in states if recurrent[i]]
        layout.append((kind, conv_sizes, recurrent, tuple(bool(layer.has_previous_state[i]) for i in states)))
    return [keys, values, convs, recurrents], tuple(layout)


def _unflatten_state_layers(cache_type: type, children: list[list[Any]], layout: tuple) -> Any:
    cache_utils = sys.modules[cache_type.__module__]
    keys, values, convs, recurrents = (iter(child) for child in children)
    layers = []
    for kind, conv_sizes, recurrent, previous in layout:
        layer_class = getattr(cache_utils, kind)
        layer = layer_class() if not conv_sizes else layer_class(number_of_states=len(conv_sizes))
        if kind in _ATTENTION_LAYERS:
            layer.keys, layer.values = next(keys), next(values)
            layer.is_initialized = True
            layer.device = getattr(layer.keys, "device", None)
        for state, size in enumerate(conv_sizes):
            if size is not None:
                layer.conv_states[state] = next(convs)
                layer.conv_kernel_size[state] = size
                layer.is_conv_states_initialized[state] = True
            if recurrent[state]:
                layer.recurrent_states[state] = next(recurrents)
                layer.is_recurrent_states_initialized[state] = True
            layer.has_previous_state[state] = previous[state]
        held = [*layer.conv_states.values(), *layer.recurrent_states.values()] if conv_sizes else []
        first = next((state for state in held if isinstance(state, torch.Tensor)), None)
        if first is not None:
            layer.dtype, layer.device = first.dtype, first.device
        layers.append(layer)
    cache = cache_type.__new__(cache_type)
    super(cache_type, cache).__init__(layers=layers)
    return cache


def _state_layer_names(layout: tuple) -> dict[str, list[str]]:
    """Per child of a DynamicCache with state layers, the name of each of its tensors after the
    prefix: ``<layer>.key``, ``<layer>.conv_state`` (``<layer>.conv_state.<state>`` where a layer
    holds several)."""
    names: dict[str, list[str]] = {child: [] for child in _STATE_CHILDREN}
    for index, (kind, conv_sizes, recurrent, _) in enumerate(layout):
        if kind in _ATTENTION_LAYERS:
            names["key_cache"].append(f"{index}.key")
            names["value_cache"].append(f"{index}.value")
        several = len(conv_sizes) > 1
        for state, size in enumerate(conv_sizes):
            suffix = f".{state}" if several else ""
            if size is not None:
                names["conv_states"].append(f"{index}.conv_state{suffix}")
            if recurrent[state]:
                names["recurrent_states"].append(f"{index}.recurrent_state{suffix}")
    return names


def _flatten_encoder_decoder(cache: Any) -> tuple[list[Any], None]:
    return [cache.self_attention_cache, cache.cross_attention_cache], None


def _unflatten_encoder_decoder(cache_type: type, children: list[Any]) -> Any:
    cache = cache_type.__new__(cache_type)
    cache.self_attention_cache, cache.cross_attention_cache = children
    # As the constructor decides: a cross-attention layer holding keys is reused, not recomputed.
    cache.is_updated = {
        index: isinstance(layer.keys, torch.Tensor) and bool(layer.keys.shape[-2] > 0)
        for index, layer in enumerate(cache.cross_attention_cache.layers)
    }
    return cache
