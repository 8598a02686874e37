"""Renaming symbolic dims: every value's shape, in the graph, its subgraphs and its functions.

A dim is named by a name (``seq``) or an expression of names (``past + seq``, ``2*_h``): a name
renamed is renamed wherever it appears, and an expression given a name of its own takes it. The
names of one model name sizes: two dims of one name are one size, so a new name must not be one
the model already gives another dim.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import onnx_ir as ir

__all__ = ["dim_names", "rename_dims", "renamed"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def renamed(dim: str, mapping: Mapping[str, str]) -> str:
    """``dim`` (a name or an expression of names) with ``mapping`` applied."""
    if dim in mapping:
        return mapping[dim]
    return _NAME.sub(lambda name: mapping.get(name.group(0), name.group(0)), dim)


def dim_names(model: ir.Model) -> set[str]:
    """Every name the model's symbolic dims are written with."""
    return {name for dim in _symbolic_dims(model) for name in [dim, *_NAME.findall(dim)]}


def rename_dims(model: ir.Model, mapping: Mapping[str, str]) -> None:
    """Rename the symbolic dims of every value of ``model`` by ``mapping`` (module doc)."""
    for value in _values(model):
        shape = value.shape
        if shape is not None and any(isinstance(d, ir.SymbolicDim) and d.value is not None for d in shape):
            value.shape = ir.Shape([
                renamed(d.value, mapping) if isinstance(d, ir.SymbolicDim) and d.value is not None else d
                for d in shape
            ])


def _symbolic_dims(model: ir.Model) -> Iterator[str]:
    for value in _values(model):
        for dim in value.shape or ():
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                yield dim.value


def _values(model: ir.Model) -> Iterator[ir.Value]:
    for graph in [model.graph, *model.functions.values()]:
        yield from graph.inputs
        if isinstance(graph, ir.Graph):
            yield from graph.initializers.values()
        for node in ir.traversal.RecursiveGraphIterator(graph):
            yield from node.outputs
            for attribute in node.attributes.values():
                if attribute.type is ir.AttributeType.GRAPH:
                    yield from attribute.value.inputs
                elif attribute.type is ir.AttributeType.GRAPHS:
                    for subgraph in attribute.value:
                        yield from subgraph.inputs
