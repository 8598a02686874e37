"""Passes over the translated onnx_ir model, run by :func:`optimize_model` in a fixed order:

1. ``dead_code.remove_dead_code``: nodes whose outputs nobody reads, unused initializers.
2. ``naming.make_names_unique``: every value name distinct, graph inputs and outputs untouched.
"""

from __future__ import annotations

import onnx_ir as ir

from dynexport.passes.onnx.dead_code import remove_dead_code
from dynexport.passes.onnx.naming import make_names_unique

__all__ = ["make_names_unique", "optimize_model", "remove_dead_code"]


def optimize_model(model: ir.Model, *, fold_constants: bool = True) -> None:
    """Optimize ``model`` in place."""
    del fold_constants  # folding passes join the pipeline with the optimizer issue
    remove_dead_code(model.graph)
    make_names_unique(model.graph)
