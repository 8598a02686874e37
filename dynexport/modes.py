"""What model code sees while it is exported: the training mode, ``is_in_onnx_export()``, and
shapes as tensors that stay symbolic.

``torch.onnx.TrainingMode`` is accepted as is. During an export, ``dynexport.is_in_onnx_export()``
and ``torch.onnx.is_in_onnx_export()`` return True (the latter is swapped for the duration of the
export, so code that calls it through the ``torch.onnx`` module sees it; code that imported the
function object itself before the export does not).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.onnx import TrainingMode

__all__ = [
    "TrainingMode",
    "attributes_added_removed",
    "exporting",
    "is_in_onnx_export",
    "select_model_mode_for_export",
    "shape_as_tensor",
]

_state = threading.local()


def is_in_onnx_export() -> bool:
    """True while dynexport is exporting a model (for model code that behaves differently)."""
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def exporting() -> Iterator[None]:
    """Mark the current thread as exporting, for ``is_in_onnx_export`` and torch.onnx's."""
    original = torch.onnx.is_in_onnx_export
    _state.depth = getattr(_state, "depth", 0) + 1
    torch.onnx.is_in_onnx_export = is_in_onnx_export
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0:
            torch.onnx.is_in_onnx_export = original


@contextlib.contextmanager
def select_model_mode_for_export(model: torch.nn.Module, mode: TrainingMode) -> Iterator[None]:
    """Put ``model`` in eval mode (``TrainingMode.EVAL``), train mode (``TRAINING``) or leave it
    (``PRESERVE``) for the duration; every submodule's own flag is restored afterwards."""
    if not isinstance(mode, TrainingMode):
        raise TypeError(f"training must be a torch.onnx.TrainingMode, got {mode!r}")
    if mode is TrainingMode.PRESERVE or not isinstance(model, torch.nn.Module):
        yield
        return
    flags = [(module, module.training) for module in model.modules()]
    try:
        model.train(mode is TrainingMode.TRAINING)
    except NotImplementedError:  # ExportedProgram.module() refuses train(); its flags still count
        for module, _ in flags:
            module.training = mode is TrainingMode.TRAINING
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


# nn.Module's dicts of forward hooks, keyed by the id of each registration.
_FORWARD_HOOKS = (
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


@contextlib.contextmanager
def attributes_added_removed(module: torch.nn.Module) -> Iterator[None]:
    """Within the block (one capture attempt), leave every submodule of ``module`` with the
    attributes it had. torch.export puts back the attributes forward replaced or mutated (a
    snapshot of each), not those forward added: a module that caches what it computed from its
    first input (ultralytics' Detect head: ``self.shape``, ``self.anchors``) would keep the
    capture's fake tensors, and the next attempt (another strategy, or a capture after a dim
    refinement) or eager call would read them as its cache. The added ones are removed here; the
    others are torch.export's to restore (putting back the original objects would bring back
    what forward wrote into them, e.g. timm LeViT's ``attention_bias_cache`` dict). Forward hooks
    forward registered are removed too, which torch.export leaves: transformers installs its
    output-recording hooks on the first call and marks the model with an attribute; without
    the mark, the next call would install them again and record every hidden state twice."""
    saved = [
        (submodule, set(submodule.__dict__), {hooks: set(getattr(submodule, hooks)) for hooks in _FORWARD_HOOKS})
        for submodule in module.modules()
    ]
    try:
        yield
    finally:
        for submodule, names, hook_ids in saved:
            for name in submodule.__dict__.keys() - names:
                del submodule.__dict__[name]
            for hooks, ids in hook_ids.items():
                registered = getattr(submodule, hooks)
                for hook_id in registered.keys() - ids:
                    del registered[hook_id]


def shape_as_tensor(x: torch.Tensor) -> torch.Tensor:
    """``x``'s shape as a 1-D int64 tensor that stays symbolic in the exported graph (unlike
    ``torch.tensor(x.shape)``, which torch.export bakes in)."""
    if x.dim() == 0:
        return torch.zeros(0, dtype=torch.int64, device=x.device)
    return torch.stack([torch.scalar_tensor(size, dtype=torch.int64, device=x.device) for size in x.shape])
