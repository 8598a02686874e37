"""Give every value in a graph a distinct name."""

from __future__ import annotations

from collections.abc import Collection

import onnx_ir as ir

__all__ = ["make_names_unique", "unique_name"]


def unique_name(name: str, taken: Collection[str]) -> str:
    """``name``, or the first of ``name_1``, ``name_2``, ... not in ``taken``."""
    unique, suffix = name, 0
    while unique in taken:
        suffix += 1
        unique = f"{name}_{suffix}"
    return unique


def make_names_unique(graph: ir.Graph) -> None:
    """Rename values whose name is empty or already taken, in ``graph`` and its subgraphs (whose
    names must differ from every enclosing graph's); the main graph's inputs, outputs and
    initializers keep theirs (they are the model's interface and parameter paths)."""
    fixed = [*graph.inputs, *graph.outputs, *graph.initializers.values()]
    taken = {value.name for value in fixed}
    _rename(graph, taken, {id(v) for v in fixed})


def _rename(graph: ir.Graph, taken: set[str], fixed_ids: set[int]) -> None:
    for node in graph:
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                subgraphs = [attribute.value]
            elif attribute.type == ir.AttributeType.GRAPHS:
                subgraphs = list(attribute.value)
            else:
                continue
            for subgraph in subgraphs:
                for value in [*subgraph.inputs, *subgraph.initializers.values()]:
                    _give_unique_name(value, value.name or "input", taken)
                _rename(subgraph, taken, fixed_ids)
        for value in node.outputs:
            if id(value) not in fixed_ids:
                _give_unique_name(value, value.name or f"{node.op_type}_out", taken)


def _give_unique_name(value: ir.Value, name: str, taken: set[str]) -> None:
    value.name = unique_name(name, taken)
    taken.add(value.name)
