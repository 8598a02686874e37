"""Capture a model as an ExportedProgram with torch.export, keeping symbolic shapes.

Strategies are tried in order (non-strict, strict, draft) and the first that succeeds wins;
when all fail, :class:`~dynexport.errors.CaptureError` carries each one's reason.

Dims declared dynamic stay dynamic even when the example size is 0 or 1: when an example holds
such a size, capture runs with size-oblivious reasoning for backed sizes, so torch.export does not
specialise a batch of 1. (Only then: size-oblivious reasoning turns some models' ``== 1`` checks
into guards that would otherwise not exist.)
"""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx.experimental._config as fx_config

from dynexport.decompositions import recurrent_ops_kept_whole
from dynexport.errors import CaptureError

__all__ = ["STRATEGIES", "as_module", "capture"]


def as_module(model: Any, args: tuple = ()) -> torch.nn.Module:
    """``model`` itself when it is an nn.Module; a module calling it when it is a function.

    The module's forward has the function's signature (positional ``args_0, args_1, ...`` for
    builtins, which have none) so torch.export names inputs and reads dynamic_shapes the same
    way as for the function.
    """
    if isinstance(model, torch.nn.Module):
        return model
    if not callable(model):
        raise TypeError(
            f"model must be an nn.Module, a function or a torch.export.ExportedProgram, "
            f"got {type(model).__name__}"
        )

    class FunctionModule(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return model(*args, **kwargs)

    # torch.export names placeholders after the forward signature: give it the function's.
    try:
        parameters = list(inspect.signature(model).parameters.values())
    except (TypeError, ValueError):  # builtins such as torch.exp have no Python signature
        parameters = [
            inspect.Parameter(f"args_{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(len(args))
        ]
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    FunctionModule.forward.__signature__ = inspect.Signature([self_param, *parameters])
    FunctionModule.__name__ = FunctionModule.__qualname__ = getattr(model, "__name__", "function")
    return FunctionModule()


def _non_strict(module, args, kwargs, dynamic_shapes):
    return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)


def _strict(module, args, kwargs, dynamic_shapes):
    return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=True)


def _draft(module, args, kwargs, dynamic_shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.draft_export(module, args, kwargs, dynamic_shapes=dynamic_shapes)


STRATEGIES: dict[str, Callable[..., torch.export.ExportedProgram]] = {
    "torch.export(strict=False)": _non_strict,
    "torch.export(strict=True)": _strict,
    "torch.export.draft_export": _draft,
}


def capture(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: Any,
) -> tuple[torch.export.ExportedProgram, str]:
    """Capture ``module`` and return the program with the name of the strategy that worked."""
    reasons: dict[str, BaseException] = {}
    oblivious = dynamic_shapes is not None and any(
        size in (0, 1)
        for leaf in torch.utils._pytree.tree_leaves((args, kwargs))
        if isinstance(leaf, torch.Tensor)
        for size in leaf.shape
    )
    for name, strategy in STRATEGIES.items():
        try:
            with _size_oblivious(oblivious), recurrent_ops_kept_whole():
                return strategy(module, args, kwargs, dynamic_shapes), name
        except Exception as error:  # every strategy's failure is reported together
            reasons[name] = error
            if _is_user_error(error):
                break
    hints = []
    if any(_SPLIT_INTO_UNKNOWN_COUNT.search(str(error)) for error in reasons.values()):
        hints.append(
            "The model splits a tensor into a number of pieces that depends on data or on a "
            "dynamic dim; torch.export needs that number fixed. Script the function that makes "
            "and uses the list (torch.jit.script): dynexport exports such a list as an ONNX "
            "sequence (docs/control_flow.md, Lists), or fix the number of pieces."
        )
    if oblivious:
        hints.append(
            "An example size of 0 or 1 on a dynamic dim lets model code that tests that size "
            "(e.g. `if batch == 1`) fix it; if a constraint on such a dim is violated, export "
            "with an example size of 2 or more."
        )
    raise CaptureError(reasons, " ".join(hints) or None) from next(iter(reasons.values()))


# torch's data-dependent guard errors say which function needed the number ("Caused by: ...").
_SPLIT_INTO_UNKNOWN_COUNT = re.compile(r"Caused by: \(.* in (split|unbind|chunk|tensor_split|split_with_sizes)\)")


def _is_user_error(error: Exception) -> bool:
    """Errors in the arguments themselves (a dynamic_shapes spec that does not match the inputs,
    a dim declared dynamic that the model fixes): every strategy would fail the same way."""
    from torch._dynamo.exc import UserError, UserErrorType

    return isinstance(error, UserError) and error.error_type in (
        UserErrorType.INVALID_INPUT,
        UserErrorType.CONSTRAINT_VIOLATION,
    )


@contextlib.contextmanager
def _size_oblivious(enabled: bool):
    if not enabled:
        yield
        return
    with fx_config.patch(backed_size_oblivious=True):
        yield


def _fake_quantize_shapes(self, *args):
    return torch.empty_like(self), torch.empty_like(self, dtype=torch.bool)


# torch has no meta kernels for fake quantization: its fake tensors run the real kernel instead,
# which only works for static shapes. The output and mask have the input's shape.
_META = torch.library.Library("aten", "IMPL")
for _op in (
    "fake_quantize_per_tensor_affine_cachemask",
    "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams",
    "fake_quantize_per_channel_affine_cachemask",
):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_op}", "Meta"):
        _META.impl(_op, _fake_quantize_shapes, "Meta")
