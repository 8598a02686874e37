"""transformers' ``DynamicCache`` as an export input or output.

torch.export walks inputs and outputs with pytree, and transformers does not register its caches
there. While an export runs (and while an ``ONNXProgram`` is called), ``DynamicCache`` is a
pytree node with two children, ``key_cache`` and ``value_cache`` (each a list of one tensor per
layer): graph inputs are named ``cache_key_cache_0``, ..., outputs after their path in the
returned structure, and ``dynamic_shapes`` gives the cache as ``[[key specs per layer], [value
specs per layer]]``. The registration is undone afterwards, so dynexport leaves pytree as it found
it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

__all__ = ["caches_flattened"]

_CHILDREN = ("key_cache", "value_cache")


@contextlib.contextmanager
def caches_flattened(values: Any = None) -> Iterator[None]:
    """Make ``DynamicCache`` a pytree node within the block, when ``values`` (any nesting of
    lists, tuples and dicts; None: always) holds one and nothing registered it already."""
    cache_type = _dynamic_cache_type()
    wanted = cache_type is not None and (
        values is None or any(type(leaf) is cache_type for leaf in pytree.tree_leaves(values))
    )
    if not wanted or cache_type in pytree.SUPPORTED_NODES:
        yield
        return
    pytree._private_register_pytree_node(
        cache_type,
        _flatten,
        lambda children, context: _unflatten(cache_type, children),
        serialized_type_name=f"{cache_type.__module__}.{cache_type.__name__}",
        flatten_with_keys_fn=_flatten_with_keys,
    )
    fx_pytree.register_pytree_flatten_spec(cache_type, lambda cache, spec: _flatten(cache)[0])
    try:
        yield
    finally:
        pytree._deregister_pytree_node(cache_type)
        fx_pytree._deregister_pytree_flatten_spec(cache_type)


def _dynamic_cache_type() -> type | None:
    # Only a model that already imported transformers can hold its cache.
    cache_utils = sys.modules.get("transformers.cache_utils")
    return getattr(cache_utils, "DynamicCache", None)


def _flatten(cache: Any) -> tuple[list[list[Any]], None]:
    layers = cache.layers
    layer_type = sys.modules[type(cache).__module__].DynamicLayer
    if any(type(layer) is not layer_type for layer in layers):
        raise TypeError(
            "dynexport flattens a DynamicCache of full-attention layers only (DynamicLayer); this one "
            f"holds {sorted({type(layer).__name__ for layer in layers})}"
        )
    return [[layer.keys for layer in layers], [layer.values for layer in layers]], None


def _flatten_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], None]:
    children, context = _flatten(cache)
    return [(pytree.MappingKey(name), child) for name, child in zip(_CHILDREN, children)], context


def _unflatten(cache_type: type, children: list[list[Any]]) -> Any:
    # The layers take the leaves as they are (the constructor would concatenate them to empty
    # tensors): naming outputs unflattens placeholders that are no tensors.
    layer_type = sys.modules[cache_type.__module__].DynamicLayer
    cache = cache_type()
    cache.layers = []
    for keys, values in zip(*children):
        layer = layer_type()
        layer.keys, layer.values, layer.is_initialized = keys, values, True
        layer.device = getattr(keys, "device", None)
        cache.layers.append(layer)
    return cache
