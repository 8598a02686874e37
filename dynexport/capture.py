"""Capture a model as an ExportedProgram with torch.export, keeping symbolic shapes.

Strategies are tried in order (non-strict, strict, draft) and the first that succeeds soundly
wins. draft_export's graph counts only when its report lists no problem: a problem means a value
of the example inputs (a data-dependent branch or trip count, a shape guard, an operator's output
shape) was built into the graph, which would then be wrong at other inputs. When torch.export
cannot capture a module soundly and the module's code calls TorchScript, the module is scripted
(``torch.jit.script``) and goes through the TorchScript front end, with a warning. Otherwise
:class:`~dynexport.errors.CaptureError` carries each strategy's reason, draft_export's problems
one by one with their model line and fix.

With ``trace_layers_once``, a module holding a ``ModuleList`` of like layers (a transformer's) is
first captured non-strict with only two of them traced and the others copied in the graph
(:mod:`dynexport.repeated_layers`); when any of that module's checks fails, the strategies above
capture it in full.

Dims declared dynamic stay dynamic even when the example size is 0 or 1: when a dim declared
dynamic has such an example size, capture runs with size-oblivious reasoning for backed sizes, so
torch.export does not specialise a batch of 1. Only then: size-oblivious reasoning turns some
models' ``== 1`` checks into guards that would otherwise not exist, and turned on by a static
dim of size 1 (a multi-query attention's one key-value head) it bounded a cached decoder's new
tokens to 2 and more (Falcon, GPT-BigCode, DeepSeek-V3). The ``min=2`` torch then asks for is
captured with but not enforced (:mod:`dynexport.dim_refinement`), as any capture assumes it.

Tracing is not thread-safe in torch: torch.export, make_fx and Dynamo share process-wide state
(the FX tracing flag, Dynamo's config and caches). :func:`exclusive_tracing` serializes every
dynexport export, and the torch.compile backend's builds, with each other and with Dynamo's own
compilations.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import io
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch._dynamo.exc import UserError, UserErrorType
from torch._logging.structured import INTERN_TABLE
from torch.export._draft_export import FailureType

from dynexport import torchscript
from dynexport.affine_grids import affine_grids_of_symbolic_sizes
from dynexport.contiguous_views import contiguous_views_direct
from dynexport.decompositions import recurrent_ops_kept_whole
from dynexport.detection import detection_code_capturable
from dynexport.dim_names import dynamic_dims_sized_0_or_1, hinted_axes, hinted_minimums
from dynexport.errors import FLOAT_SIZE_ARITHMETIC, INTEGER_SIZES_HINT, CaptureError
from dynexport.even_chunks import even_chunks_as_splits
from dynexport.grouped_attention import causality_decided, grouped_attention_whole
from dynexport.guard_audit import UncheckedGuards, check_guards_hold
from dynexport.model_caches import UnflattenableCache, first_fills_kept, sliding_windows_sized_by_keys
from dynexport.modes import attributes_added_removed
from dynexport.multiples import MultipleRequired, multiples_refined_early
from dynexport.pinned_dims import warn_if_dims_pinned
from dynexport.quantized_modules import QuantizedCaptureError, quantized_modules_as_float
from dynexport.repeated_layers import layers_traced_once, repeated_layers, replicated
from dynexport.shared_dims import shared_dims_traced_as_one
from dynexport.signature import bind_arguments
from dynexport.symbolic_pools import max_pool1d_of_symbolic_sizes

__all__ = ["STRATEGIES", "UnsoundCapture", "as_module", "capture", "check_given", "exclusive_tracing", "keyword_arguments_named", "serialized"]


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


@contextlib.contextmanager
def keyword_arguments_named(module: torch.nn.Module, kwargs: dict) -> Iterator[None]:
    """Within the block, ``module.forward`` names each keyword argument its ``**kwargs`` takes
    (transformers 5 takes a ``past_key_values=`` cache so): torch.export reads dynamic_shapes
    by those names then, where it fails on a ``**kwargs`` entry (``Must provide a tree_name``).
    The module's class is not changed: its instance gets a ``forward`` of that signature."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    keywords = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    named = {p.name for p in parameters}
    taken = [name for name in kwargs if name not in named]
    if not keywords or not taken or "forward" in vars(module):
        yield
        return
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    explicit = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in taken]
    forward.__signature__ = inspect.Signature([p for p in parameters if p not in keywords] + explicit)
    module.forward = forward
    try:
        yield
    finally:
        del module.forward


@contextlib.contextmanager
def _partial_graphs_unprinted() -> Iterator[None]:
    """torch.export prints the graph it traced up to a failure to stderr: hundreds of lines for
    a transformer, once for each strategy tried, above the error dynexport raises, which names
    the model line. stderr is held while capturing and written out after, without those graphs."""
    held = _Writes()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        sys.stderr.write("".join(_without_partial_graphs(held.chunks)))


class _Writes(io.TextIOBase):
    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []

    def write(self, text: str) -> int:
        self.chunks.append(text)
        return len(text)


def _without_partial_graphs(chunks: list[str]) -> Iterator[str]:
    """``chunks`` less each FX graph's source and the newline ``print`` wrote after it."""
    after_graph = False
    for chunk in chunks:
        if chunk.lstrip().startswith(("def forward(self", "class GraphModule(")):
            after_graph = True
            continue
        if not (after_graph and chunk == "\n"):
            yield chunk
        after_graph = False


def _non_strict(module, args, kwargs, dynamic_shapes):
    return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)


def _strict(module, args, kwargs, dynamic_shapes):
    return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=True)


def _draft(module, args, kwargs, dynamic_shapes):
    with warnings.catch_warnings(), _draft_logs_silenced():
        warnings.simplefilter("ignore")
        program = torch.export.draft_export(module, args, kwargs, dynamic_shapes=dynamic_shapes)
    # draft_export returns its graph whatever it had to assume; only the report it attaches says.
    if program._report.failures:
        raise UnsoundCapture(program._report)
    return program


_NON_STRICT = "torch.export(strict=False)"
STRATEGIES: dict[str, Callable[..., torch.export.ExportedProgram]] = {
    _NON_STRICT: _non_strict,
    "torch.export(strict=True)": _strict,
    "torch.export.draft_export": _draft,
}


# Dynamo's own lock around its compilations (re-entrant): holding it also keeps Dynamo from
# compiling a frame in another thread while this one traces.
_TRACING_LOCK = torch._dynamo.convert_frame.compile_lock


@contextlib.contextmanager
def exclusive_tracing() -> Iterator[None]:
    """Hold torch's tracing machinery for the current thread. While a thread traces, torch's FX
    tracing flag is set for the whole process: another thread that calls a ``torch.compile``d
    function then runs it eagerly instead of failing ("Detected that you are using FX to
    symbolically trace a dynamo-optimized function")."""
    with _TRACING_LOCK, torch._dynamo.config.patch(error_on_nested_fx_trace=False):
        yield


def serialized(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run under :func:`exclusive_tracing`: one at a time in the process."""

    @functools.wraps(function)
    def run_exclusively(*args: Any, **kwargs: Any) -> Any:
        with exclusive_tracing():
            return function(*args, **kwargs)

    return run_exclusively


def capture(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: Any,
    *,
    trace_layers_once: bool = False,
) -> tuple[torch.export.ExportedProgram, str]:
    """Capture ``module`` and return the program with the name of the strategy that worked.

    ``trace_layers_once``: first try capturing a ``ModuleList`` of like layers by tracing two
    of them and copying the last one for the others (dynexport/repeated_layers.py); whenever one
    of its checks fails, the strategies below capture the model in full.

    Raises:
        CaptureError: no strategy captured the model soundly.
    """
    reasons: dict[str, BaseException] = {}
    oblivious = dynamic_dims_sized_0_or_1(dynamic_shapes, bind_arguments(module.forward, args, kwargs))
    if trace_layers_once:
        with _partial_graphs_unprinted():
            captured = _captured_tracing_layers_once(module, args, kwargs, dynamic_shapes, oblivious)
        if captured is not None:
            return captured
    for name, strategy in STRATEGIES.items():
        if strategy is _draft and isinstance(reasons.get(_NON_STRICT), UncheckedGuards):
            continue  # draft_export traces as non-strict capture does: the same unchecked guards
        try:
            with _capture_patches(module, oblivious, dynamic_shapes), _partial_graphs_unprinted():
                program = strategy(module, args, kwargs, dynamic_shapes)
            check_guards_hold(program, hinted_minimums(dynamic_shapes))
        except Exception as error:  # every strategy's failure is reported together
            reasons[name] = error
            if _fails_every_strategy(error):
                break
        else:
            warn_if_dims_pinned(program, module, args, kwargs)
            return program, name
    # A scripted function run by torch.export fixes the sizes it reads (`range(x.size(0))`): a
    # violated constraint that the TorchScript front end, which keeps the size symbolic, avoids.
    last = list(reasons.values())[-1]
    if not _is_user_error(last, UserErrorType.INVALID_INPUT) and _calls_torchscript(module):
        try:
            program, strategy = _scripted(module, args, kwargs, dynamic_shapes)
        except Exception as error:
            reasons[_SCRIPTED] = _innermost_reason(error)
        else:
            first, reason = next(iter(reasons.items()))
            warnings.warn(
                f"{type(module).__name__} was captured through {strategy}: torch.export could "
                f"not capture it soundly ({first}: {_first_line(reason)}), and its code calls "
                "TorchScript, whose loops and branches become ONNX Loop and If",
                stacklevel=4,  # capture <- dynamic-shape refinement <- export <- the user's call
            )
            return program, strategy
    raise _capture_error(reasons, oblivious) from next(iter(reasons.values()))


@contextlib.contextmanager
def _capture_patches(module: torch.nn.Module, oblivious: bool, dynamic_shapes: Any) -> Iterator[None]:
    """What every capture attempt runs under (each patch for the capture only)."""
    with (
        _size_oblivious(oblivious),
        contiguous_views_direct(),
        multiples_refined_early(hinted_axes(dynamic_shapes)),
        recurrent_ops_kept_whole(),
        detection_code_capturable(),
        grouped_attention_whole(),
        causality_decided(),
        shared_dims_traced_as_one(),
        even_chunks_as_splits(),
        affine_grids_of_symbolic_sizes(),
        max_pool1d_of_symbolic_sizes(),
        first_fills_kept(),
        sliding_windows_sized_by_keys(),
        _fake_quantize_meta_kernels(),
        quantized_modules_as_float(module),
        attributes_added_removed(module),
    ):
        yield


def _captured_tracing_layers_once(
    module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any, oblivious: bool
) -> tuple[torch.export.ExportedProgram, str] | None:
    """Non-strict capture with the later layers of ``module``'s lists of like layers stubbed and
    then copied from a traced one; None when there are no such lists or any check (or the
    capture itself) fails: the caller then captures the model in full."""
    try:
        lists = repeated_layers(module)
        if not lists:
            return None
        with _capture_patches(module, oblivious, dynamic_shapes), layers_traced_once(lists) as calls:
            program = _non_strict(module, args, kwargs, dynamic_shapes)
        program = replicated(program, calls)
        check_guards_hold(program, hinted_minimums(dynamic_shapes))
    except (UnflattenableCache, MultipleRequired) as error:
        raise _capture_error({_NON_STRICT: error}, oblivious) from error
    except Exception as error:  # every other reason, the model's own included, is found again by the full capture
        logging.getLogger(__name__).debug("layers captured in full: %s", error)
        return None
    warn_if_dims_pinned(program, module, args, kwargs)
    return program, "; ".join([_NON_STRICT, *(repeated.describe() for repeated in lists)])


def _capture_error(reasons: dict[str, BaseException], oblivious: bool) -> CaptureError:
    hints = []
    if any(isinstance(error, UnsoundCapture) for error in reasons.values()):
        hints.append(
            "draft_export captured a graph only by building values of the example inputs into "
            "it (each listed above with the model line and its fix); dynexport refuses that "
            "graph, which would be wrong at other inputs."
        )
    if any(isinstance(error, UncheckedGuards) for error in reasons.values()):
        hints.append(
            "torch.export built the example's answers to the conditions listed above into the "
            "graph without checking them over the declared ranges, so the graph would be wrong "
            "at the sizes named. Declare ranges where they hold (Dim(name, min=..., max=...)) or "
            "the dims static; or, in the model, compute sizes in integer arithmetic (`-(-h // 32) "
            "* 32` rather than `int(math.ceil(float(h) / 32) * 32)`, `torch.sym_min(a, b)` rather "
            "than `min(a, b)` of sizes) and write a branch on sizes with torch.cond."
        )
    if _SCRIPTED in reasons:
        hints.append(
            "The model calls TorchScript but could not be scripted whole (torch.jit.script's "
            "reason above): make its forward scriptable, or export with dynamo=False, which "
            "traces the module and keeps the loops and branches of the scripted code it calls."
        )
    if any(_SPLIT_INTO_UNKNOWN_COUNT.search(str(error)) for error in reasons.values()):
        hints.append(
            "The model splits a tensor into a number of pieces that depends on data or on a "
            "dynamic dim; torch.export needs that number fixed. Script the function that makes "
            "and uses the list (torch.jit.script): dynexport exports such a list as an ONNX "
            "sequence (docs/control_flow.md, Lists), or fix the number of pieces."
        )
    if any(_is_user_error(error, UserErrorType.CONSTRAINT_VIOLATION) and FLOAT_SIZE_ARITHMETIC.search(str(error)) for error in reasons.values()):
        hints.append(INTEGER_SIZES_HINT)
    if oblivious and any(_is_user_error(error, UserErrorType.CONSTRAINT_VIOLATION) for error in reasons.values()):
        hints.append(
            "An example size of 0 or 1 on a dynamic dim lets model code that tests that size "
            "(e.g. `if batch == 1`) fix it; if a constraint on such a dim is violated, export "
            "with an example size of 2 or more."
        )
    return CaptureError(reasons, " ".join(hints) or None)


def check_given(program: torch.export.ExportedProgram) -> None:
    """Refuse an ExportedProgram the user captured with draft_export when its report lists
    problems, as :func:`capture` refuses its own.

    Raises:
        CaptureError: the program holds values of its example inputs.
    """
    report = getattr(program, "_report", None)  # set by torch.export.draft_export only
    if report is not None and report.failures:
        raise _capture_error({"given ExportedProgram (draft_export)": UnsoundCapture(report)}, oblivious=False)


def without_effect_tokens(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with its effect tokens taken out: ``run_decompositions()`` threads a token
    through ops with side effects (``with_effects(token, aten._linalg_check_errors, ...)`` from
    inv and solve), which ONNX has no counterpart for; each becomes a plain call of its op, and
    the token inputs and outputs go. The user's program is left as it was (a copy of its graph
    and signature, sharing its weights)."""
    if not any(node.target is torch.ops.higher_order.with_effects for node in program.graph.nodes):
        return program
    from torch.export._remove_effect_tokens_pass import _remove_effect_tokens

    copied = program._update(copy.deepcopy(program.graph_module), copy.deepcopy(program.graph_signature))
    return _remove_effect_tokens(copied)


class UnsoundCapture(Exception):
    """draft_export produced a graph, but its report lists problems: values of the example
    inputs that the graph holds as constants. ``problems`` has one line per problem: what was
    fixed, the model line, and the fix."""

    def __init__(self, report: Any):
        self.report = report
        # The report names only the files first seen during its own export: torch interns each
        # file name once per process.
        filenames = {number: name for name, number in INTERN_TABLE.items()}
        filenames.update(report.str_to_filename)
        self.problems = [_problem(failure, filenames) for failure in report.failures]
        shown = self.problems if len(self.problems) <= _SHOWN_PROBLEMS else self.problems[: _SHOWN_PROBLEMS - 1]
        more = len(self.problems) - len(shown)
        super().__init__(
            "\n".join(
                [f"the graph holds {len(self.problems)} value(s) of the example inputs, refused:"]
                + [f"- {problem}" for problem in shown]
                + ([f"- ... and {more} more: this reason's .problems lists them all"] if more else [])
            )
        )


# CaptureError shows at most four "- " lines of each strategy's reason.
_SHOWN_PROBLEMS = 4


def _problem(failure: Any, filenames: dict[int, str]) -> str:
    """One draft_export failure as a line: what the graph fixed, where, and how to fix it."""
    data = failure.data
    where = _user_frame(data.get("user_stack") or [], filenames)
    at = f" ({where})" if where else ""
    if failure.failure_type is FailureType.DATA_DEPENDENT_ERROR:
        return (
            f"`{data['expr']}` depends on input data; the example's value {data['result']} was "
            f"built into the graph{at}; fix: write that branch or loop with torch.cond / "
            "torch.while_loop, or script it (torch.jit.script) and export with dynamo=False; if it "
            "holds for every valid input, state it with torch._check(...)"
        )
    if failure.failure_type is FailureType.GUARD_ADDED:
        return (
            f"the guard {data['expr']} fixed a dim declared dynamic{at}; fix: give the Dim that "
            "bound (Dim(name, min=..., max=...)) or declare the dim static"
        )
    if failure.failure_type is FailureType.MISSING_FAKE_KERNEL:
        return (
            f"torch.ops.{data['op']} has no fake kernel: its output shapes were copied from the "
            "example; fix: register one with torch.library.register_fake"
        )
    return (
        f"torch.ops.{data['op']}'s fake kernel disagrees with the real one ({data['reason']}); "
        "fix: correct its torch.library.register_fake kernel"
    )


def _user_frame(stack: list[dict[str, Any]], filenames: dict[int, str]) -> str | None:
    """The innermost frame of ``stack`` (draft_export's form) outside torch and dynexport."""
    own = (f"{os.sep}torch{os.sep}", f"{os.sep}dynexport{os.sep}")
    for frame in reversed(stack):
        filename = filenames.get(frame["filename"])
        if filename is not None and not any(part in filename for part in own):
            return f'File "{filename}", line {frame["line"]}, in {frame["name"]}: {frame["loc"]}'
    return None


@contextlib.contextmanager
def _draft_logs_silenced():
    """draft_export logs every problem and a banner pointing at ``ep._report``; the problems
    reach the user through CaptureError instead."""
    loggers = [
        logging.getLogger("torch.export._draft_export"),
        logging.getLogger("torch.fx.experimental.symbolic_shapes"),
    ]
    previous = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, previous):
            logger.disabled = disabled


_SCRIPTED = "torch.jit.script"


def _calls_torchscript(module: torch.nn.Module) -> bool:
    """Whether ``module`` or a submodule is TorchScript, or one of their methods calls a scripted
    function or module by a global or closure name, itself or through the plain functions it
    calls: the user wrote TorchScript for a reason (usually a loop or branch torch.export cannot
    capture)."""
    if any(torchscript.is_torchscript(submodule) for submodule in module.modules()):
        return True
    pending = [
        method
        for submodule in module.modules()
        for method in vars(type(submodule)).values()
        if inspect.isfunction(method)
    ]
    seen = set()
    while pending:
        function = pending.pop()
        if function in seen:
            continue
        seen.add(function)
        for value in _referenced(function):
            if torchscript.is_torchscript(value):
                return True
            if inspect.isfunction(value) and not (value.__module__ or "").startswith("torch"):
                pending.append(value)
    return False


def _referenced(function: Callable) -> list[Any]:
    """The values ``function`` names as globals or closure variables."""
    try:
        names = inspect.getclosurevars(function)
    except ValueError:  # a closure cell not yet filled
        return []
    return [*names.globals.values(), *names.nonlocals.values()]


def _scripted(module, args, kwargs, dynamic_shapes) -> tuple[torch.export.ExportedProgram, str]:
    """``module`` scripted whole and captured by the TorchScript front end, which keeps scripted
    loops and branches as loops and branches (never ``torch.jit.trace``, which would unroll
    them for the example)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated")
        scripted = torch.jit.script(module)
    graph_module, positional = torchscript.graph_module(scripted, args, kwargs)
    program, strategy = torchscript.capture(graph_module, positional, {}, dynamic_shapes)
    return program, f"{_SCRIPTED}, then {strategy}"


def _innermost_reason(error: Exception) -> BaseException:
    """The TorchScript front end's own failure, rather than the CaptureError that wraps it."""
    if isinstance(error, CaptureError):
        return next(iter(error.reasons.values()))
    return error


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


# torch's data-dependent guard errors say which function needed the number ("Caused by: ...").
_SPLIT_INTO_UNKNOWN_COUNT = re.compile(r"Caused by: \(.* in (split|unbind|chunk|tensor_split|split_with_sizes)\)")


def _fails_every_strategy(error: BaseException) -> bool:
    return _is_user_error(error) or isinstance(error, (QuantizedCaptureError, UnflattenableCache, MultipleRequired))


def _is_user_error(error: BaseException, *kinds: UserErrorType) -> bool:
    """Errors in the arguments themselves (a dynamic_shapes spec that does not match the inputs,
    a dim declared dynamic that the model fixes): every torch.export strategy would fail the same
    way. ``kinds`` narrows which."""
    kinds = kinds or (UserErrorType.INVALID_INPUT, UserErrorType.CONSTRAINT_VIOLATION)
    return isinstance(error, UserError) and error.error_type in kinds


@contextlib.contextmanager
def _size_oblivious(enabled: bool):
    if not enabled:
        yield
        return
    with fx_config.patch(backed_size_oblivious=True):
        yield


def _fake_quantize_shapes(self, *args):
    return torch.empty_like(self), torch.empty_like(self, dtype=torch.bool)


_FAKE_QUANTIZE_OPS = (
    "fake_quantize_per_tensor_affine_cachemask",
    "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams",
    "fake_quantize_per_channel_affine_cachemask",
)


@contextlib.contextmanager
def _fake_quantize_meta_kernels() -> Iterator[None]:
    """Meta kernels for fake quantization while capturing: torch has none, so its fake tensors
    run the real kernel, which only works for static shapes (the output and the mask have the
    input's shape). Registered only for the capture, so that dynexport changes nothing in torch."""
    missing = [
        op for op in _FAKE_QUANTIZE_OPS if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "Meta")
    ]
    if not missing:
        yield
        return
    library = torch.library.Library("aten", "IMPL")
    try:
        for op in missing:
            library.impl(op, _fake_quantize_shapes, "Meta")
        yield
    finally:
        library._destroy()
