"""Give every value in a graph a distinct name."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["make_names_unique"]


def make_names_unique(graph: ir.Graph) -> None:
    """Rename values whose name is empty or already taken; inputs, outputs and initializers keep
    theirs (they are the model's interface and parameter paths)."""
    taken: set[str] = set()
    fixed = [*graph.inputs, *graph.outputs, *graph.initializers.values()]
    for value in fixed:
        taken.add(value.name)
    fixed_ids = {id(v) for v in fixed}
    for node in graph:
        for value in node.outputs:
            if id(value) in fixed_ids:
                continue
            name = value.name or f"{node.op_type}_out"
            if name in taken:
                base, suffix = name, 1
                while f"{base}_{suffix}" in taken:
                    suffix += 1
                name = f"{base}_{suffix}"
            value.name = name
            taken.add(name)
