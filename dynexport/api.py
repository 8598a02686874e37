"""``dynexport.export``: check every argument, then run the stages."""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import IO, Any

import torch

from dynexport import capture as capture_stage
from dynexport import files
from dynexport import report as report_stage
from dynexport import signature, torchscript
from dynexport.call_convention import graph_input_specs
from dynexport.dim_refinement import (
    DIM_REFINEMENTS_KEY,
    capture_refining_dims,
    derived_dim_roots,
    dims_tied_by_the_model,
    refinements_metadata,
)
from dynexport.model_caches import caches_flattened
from dynexport.modes import TrainingMode, exporting, select_model_mode_for_export
from dynexport.module_functions import module_selector
from dynexport.passes.fx.functionalize import inplace_ops_are_local
from dynexport.passes.fx.simplify import simplify_program
from dynexport.passes.onnx import optimize_model
from dynexport.program import ONNXProgram
from dynexport.registry import TranslationTable, default_table
from dynexport.translate import translate_program
from dynexport.verification import VerificationReport

__all__ = ["DEFAULT_OPSET", "SUPPORTED_OPSETS", "export", "export_to_pretty_string", "phase_listener", "verify"]

DEFAULT_OPSET = 20
SUPPORTED_OPSETS = range(18, 24)


@capture_stage.serialized
def export(
    model: torch.nn.Module | Callable[..., Any] | torch.export.ExportedProgram,
    args: Any = (),
    f: str | os.PathLike | IO[bytes] | None = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    export_params: bool = True,
    verbose: bool | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset_version: int | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None = None,
    keep_initializers_as_inputs: bool = False,
    dynamic_shapes: Any = None,
    do_constant_folding: bool = True,
    optimize: bool = True,
    custom_translation_table: Mapping[Any, Callable[..., Any]] | None = None,
    custom_opsets: Mapping[str, int] | None = None,
    fallback: str | None = None,
    training: TrainingMode = TrainingMode.EVAL,
    export_modules_as_functions: bool | Collection[type[torch.nn.Module]] = False,
    dynamo: bool = True,
    example_inputs: Sequence[Any] | None = None,
    report: bool | str | os.PathLike = False,
    verify: bool = False,
) -> ONNXProgram:
    """Export a PyTorch model to ONNX.

    Takes the arguments of PyTorch's own ONNX exporter (its dynamo mode): switching is a change of
    module name.

    Args:
        model: an ``nn.Module``, a plain function, or an already captured
            ``torch.export.ExportedProgram`` (then capture is skipped and ``args`` only name
            nothing; pass ``()``).
        args: example positional arguments: a tuple, or a single tensor. A trailing dict holds
            keyword arguments (end with an empty dict to pass a real dict positionally).
            Python int/float/bool arguments are baked into the graph as constants.
        f: where to write the model: a path (written atomically) or a binary file object.
        kwargs: example keyword arguments.
        export_params: store parameters as initializers; when False they become graph inputs.
        verbose: print the ONNX graph after export.
        input_names: names of the ONNX graph's tensor inputs, in flattened order; when there are
            more names than tensor inputs, of every argument in order (a name for one left None
            is warned about and unused).
        output_names: names of the ONNX graph's outputs, in flattened order.
        opset_version: ONNX opset, 18 to 23 (default 20).
        dynamic_axes: torch.onnx's legacy form, ``{input_or_output_name: {axis: dim_name}}``
            or ``{name: [axes]}``; converted to ``dynamic_shapes``. Output dims take the names
            given (model metadata ``pkg.dynexport.output_dims`` holds the sizes they stand for).
        keep_initializers_as_inputs: also list initializers as graph inputs.
        dynamic_shapes: as for ``torch.export.export``; ``Dim("name")`` names the ONNX dim. A
            bound, multiple or equality the model puts on a declared dim is applied with a
            warning (docs/program.md); a dim the model makes static raises
            ``DimSpecializedError`` unless declared ``None``, ``Dim.STATIC`` or ``Dim.AUTO``.
        do_constant_folding: fold constant subgraphs.
        optimize: run the ONNX optimization passes at all.
        custom_translation_table: ``{op_overload: rule}``; these rules take precedence.
        custom_opsets: ``{domain: version}`` for the custom domains rules emit into; a domain
            used without an entry is imported at version 1.
        fallback: ``"custom_domain"`` exports each operator that has neither a rule nor a
            decomposition as one node in the domain ``pkg.torch.<namespace>`` (its non-tensor
            arguments as attributes) with a warning, instead of raising
            ``UnsupportedOperatorError``.
        training: ``torch.onnx.TrainingMode``: EVAL (default) exports the model in eval mode,
            TRAINING in train mode (dropout stays random), PRESERVE as it is; the model's own
            mode is restored afterwards.
        export_modules_as_functions: True, or a set of module classes: each call of such a
            module becomes a call of an ONNX local function named after its class (nested for
            nested modules; calls with identical bodies share one definition).
        dynamo: True (default) captures ``model`` with torch.export. False captures it through
            TorchScript: a ``ScriptModule`` or ``ScriptFunction`` as scripted, any other module
            traced by ``torch.jit.trace`` (Python loops unroll and ``if`` takes the branch of
            ``args``; shapes are static unless ``dynamic_shapes``/``dynamic_axes`` say
            otherwise). TorchScript models always take this path; their ``prim::If`` becomes
            ``torch.cond`` and ``prim::Loop`` ``torch.while_loop`` (see docs/control_flow.md).
        example_inputs: with ``dynamic_shapes="auto"``: further example calls (``(args,
            kwargs)`` pairs or argument tuples); every dim whose size differs between them and
            ``args`` becomes dynamic (``batch``, ``sequence``, ``<input>_dim_<axis>``). With
            ``args=()`` the first example is the export call.
        report: write a markdown report of the export (capture, timings, how each operator was
            translated, the ONNX op histogram, verification), on success and on failure:
            True (next to ``f`` as ``<name>.report.md``, else ``<model>.report.md`` here) or a
            path. ``program.report_path`` says where; a failed export's error says so too.
        verify: run the model in PyTorch and onnxruntime on ``args`` and compare the outputs
            (``program.verification``); raises ``VerificationError`` (after writing ``f``) when
            they differ.

    Returns:
        An :class:`ONNXProgram`.

    Raises:
        ValueError, TypeError: inconsistent or unsupported arguments, before any work is done.
        dynexport.errors.CaptureError: torch.export could not capture the model.
        dynexport.errors.UnsupportedOperatorError: operators with no translation, all listed.
        dynexport.verification.VerificationError: with ``verify=True``, outputs that differ.
    """
    opset = DEFAULT_OPSET if opset_version is None else opset_version
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in SUPPORTED_OPSETS:
        raise ValueError(
            f"opset_version={opset_version!r} is not supported; choose one of "
            f"{SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1} (default {DEFAULT_OPSET})"
        )
    if not isinstance(dynamo, bool):
        raise TypeError(f"dynamo must be True or False, got {dynamo!r}")
    if not dynamo and isinstance(model, torch.export.ExportedProgram):
        raise ValueError("dynamo=False traces a module with torch.jit.trace; an ExportedProgram is already captured")
    if dynamic_shapes is not None and dynamic_axes is not None:
        raise ValueError("pass either dynamic_shapes or dynamic_axes, not both")
    _check_names("input_names", input_names)
    _check_names("output_names", output_names)
    shared_names = sorted(set(input_names or ()) & set(output_names or ()))
    if shared_names:
        raise ValueError(
            f"input_names and output_names share {shared_names}; ONNX needs every input and output named apart"
        )
    _check_destination(f)
    _check_custom_opsets(custom_opsets)
    module_functions = _module_selection(export_modules_as_functions)
    if not isinstance(training, TrainingMode):
        raise TypeError(f"training must be a torch.onnx.TrainingMode, got {training!r}")
    if fallback not in (None, "custom_domain"):
        raise ValueError(f"fallback={fallback!r} is not supported; use None (raise) or 'custom_domain'")
    table = _table(custom_translation_table)

    if isinstance(dynamic_shapes, str) and dynamic_shapes != "auto":
        raise ValueError(f"dynamic_shapes={dynamic_shapes!r}: the only string accepted is 'auto'")
    auto_dims = isinstance(dynamic_shapes, str)
    if auto_dims and isinstance(model, torch.export.ExportedProgram):
        raise ValueError("dynamic_shapes='auto' needs a model to capture, not an ExportedProgram")
    if example_inputs is not None and not auto_dims:
        raise ValueError("example_inputs is only used with dynamic_shapes='auto'")
    if auto_dims and not example_inputs:
        raise ValueError(
            "dynamic_shapes='auto' needs example_inputs: a list of further calls (args tuples or "
            "(args, kwargs) pairs) whose sizes differ where the model is dynamic"
        )
    if auto_dims and not args and not kwargs:
        (args, kwargs), example_inputs = signature.as_call(example_inputs[0]), example_inputs[1:]
        if not example_inputs:
            raise ValueError("dynamic_shapes='auto' needs at least two example calls")
    model_name = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "model")
    report_file = _report_file(report, f, model_name)
    record = report_stage.ExportRecord(
        model_name, opset, destination=os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
    )
    with report_stage.reporting(report_file, record), caches_flattened((args, kwargs)):
        timings = record.timings
        if isinstance(model, torch.export.ExportedProgram):
            if dynamic_shapes is not None or dynamic_axes is not None:
                raise ValueError(
                    "an ExportedProgram's dynamic shapes were fixed when it was captured; pass "
                    "dynamic_shapes to torch.export.export instead of to dynexport.export"
                )
            capture_stage.check_given(model)
            program, strategy, requested_dims = model, "given ExportedProgram", {}
            args, kwargs = (), {}
            if input_names is not None:
                _check_input_count(input_names, len(graph_input_specs(program)))
        else:
            args, kwargs = signature.split_legacy_args(args, kwargs)
            from_torchscript = not dynamo or torchscript.is_torchscript(model)
            if from_torchscript:
                with _phase(timings, "torchscript"), exporting(), select_model_mode_for_export(model, training):
                    module, args = torchscript.graph_module(model, args, kwargs)
                kwargs = {}
            else:
                module = capture_stage.as_module(model, args)
            signature.check_argument_types(args, kwargs)
            bound = signature.bind_arguments(module.forward, args, kwargs)
            slots = signature.argument_slots(module.forward, args, kwargs)
            if dynamic_axes is not None:
                dynamic_shapes, requested_dims = signature.dynamic_shapes_from_axes(
                    dynamic_axes, bound, slots, input_names, output_names
                )
            elif auto_dims:
                dynamic_shapes, requested_dims = signature.dynamic_shapes_from_examples(
                    module.forward, bound, example_inputs
                )
            else:
                requested_dims = signature.named_dims(dynamic_shapes, bound)
            input_names = signature.graph_input_names(input_names, slots)
            with _phase(timings, "capture"), exporting(), select_model_mode_for_export(module, training):
                capture = torchscript.capture if from_torchscript else capture_stage.capture
                program, strategy, record.dim_refinements, dynamic_shapes = capture_refining_dims(
                    capture, module, args, kwargs, dynamic_shapes
                )
            if not auto_dims and dynamic_axes is None:
                requested_dims = signature.named_dims(dynamic_shapes, bound)
                record.dim_refinements += dims_tied_by_the_model(program, requested_dims)
            if auto_dims:
                _warn_fixed_dims(program, requested_dims)
        record.strategy, record.exported_program = strategy, program

        updates_buffers = training is TrainingMode.TRAINING
        with _phase(timings, "decompose"):
            program = _functionalized(program, explicit_buffer_updates=updates_buffers)
            simplifications = simplify_program(program, fold_constants=do_constant_folding) if optimize else None
        record.exported_program = program
        io_names = signature.graph_io(program, input_names, output_names, requested_dims, dynamic_axes)
        io_names.dim_names.update(derived_dim_roots(program, requested_dims))
        onnx_model = translate_program(
            program,
            io_names,
            table=table,
            opset=opset,
            export_params=export_params,
            keep_initializers_as_inputs=keep_initializers_as_inputs,
            timings=timings,
            summary=record.summary,
            fallback_to_custom_domain=fallback == "custom_domain",
            custom_opsets=dict(custom_opsets or {}),
            module_functions=module_functions,
            simplifications=simplifications,
            buffer_updates=updates_buffers,
        )
        _notify("translate", timings.get("translate", 0.0))
        with _phase(timings, "optimize"):
            if optimize:
                with _dataless_weights_hidden(onnx_model):
                    optimize_model(onnx_model, fold_constants=do_constant_folding)
        if record.dim_refinements:
            onnx_model.metadata_props[DIM_REFINEMENTS_KEY] = refinements_metadata(record.dim_refinements)
        record.onnx_model = onnx_model
        result = ONNXProgram(onnx_model, program, timings=timings, capture_strategy=strategy)
        timings = record.timings = result.timings
        result.report_path = report_file
        if verify:
            with _phase(timings, "verify"):
                eager = model.module() if isinstance(model, torch.export.ExportedProgram) else model
                record.verification = result.verify(*args, model=eager, kwargs=kwargs)
        if f is not None:
            with _phase(result.timings, "serialize"):
                result.save(f)
        if verbose:
            print(result.to_text())
        if record.verification is not None:
            record.verification.raise_on_failure()
        return result


_phase_listener: contextvars.ContextVar[Callable[[str, float], None] | None] = contextvars.ContextVar(
    "dynexport_phase_listener", default=None
)


@contextlib.contextmanager
def phase_listener(callback: Callable[[str, float], None]) -> Iterator[None]:
    """Call ``callback(phase, seconds)`` as each export phase ends (the CLI prints them)."""
    token = _phase_listener.set(callback)
    try:
        yield
    finally:
        _phase_listener.reset(token)


def _notify(name: str, seconds: float) -> None:
    callback = _phase_listener.get()
    if callback is not None:
        callback(name, seconds)


@contextlib.contextmanager
def _phase(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - start
        timings[name] = timings.get(name, 0.0) + seconds
        _notify(name, seconds)


@contextlib.contextmanager
def _dataless_weights_hidden(model: Any) -> Iterator[None]:
    """Weights on the meta device or fake have no values to fold: the passes see them as
    initializers of unknown value (their data comes later, by name, through apply_weights)."""
    hidden = [
        (value, value.const_value)
        for value in model.graph.initializers.values()
        if value.const_value is not None and not files.has_data(value.const_value)
    ]
    for value, _ in hidden:
        value.const_value = None
    try:
        yield
    finally:
        for value, tensor in hidden:
            value.const_value = tensor


def _report_file(report: Any, f: Any, model_name: str) -> str | None:
    if report is None or report is False:
        return None
    if report is True:
        return report_stage.default_report_path(f, model_name)
    if not isinstance(report, (str, os.PathLike)):
        raise TypeError(f"report must be True, False or a path, got {type(report).__name__}")
    path = os.fspath(report)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write the report {path!r}: directory {directory!r} does not exist")
    return path


def _warn_fixed_dims(program: torch.export.ExportedProgram, requested_dims: dict[tuple[str, int], str]) -> None:
    """Warn about dims that differ between the example inputs but that the model fixes."""
    placeholders = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    for (name, axis), dim in requested_dims.items():
        val = placeholders.get(name)
        if isinstance(val, torch.Tensor) and isinstance(val.shape[axis], int):
            warnings.warn(
                f"dim {axis} of input {name!r} differs between the example inputs, but the model "
                f"fixes it to {val.shape[axis]}: the ONNX model accepts only that size",
                stacklevel=3,
            )


def _functionalized(
    program: torch.export.ExportedProgram, *, explicit_buffer_updates: bool = False
) -> torch.export.ExportedProgram:
    """The program itself when the translator can treat its in-place ops as functional ones,
    else the program functionalized by torch (a re-trace). ``explicit_buffer_updates`` (training
    mode) re-traces whenever there are buffers, so that every buffer update (batch norm's running
    statistics) is an output of the program."""
    if explicit_buffer_updates and program.graph_signature.buffers:
        return program.run_decompositions({})
    if inplace_ops_are_local(program.graph):
        return program
    return program.run_decompositions({})


def _table(custom: Mapping[Any, Callable[..., Any]] | None) -> TranslationTable:
    import dynexport.ops  # noqa: F401  (registers the rules)

    if custom is None:
        return default_table
    if not isinstance(custom, Mapping):
        raise TypeError("custom_translation_table must be a dict {torch op overload: rule}")
    for op, rule in custom.items():
        if not callable(rule):
            raise TypeError(f"custom_translation_table[{op}] must be callable, got {type(rule).__name__}")
    return default_table.with_overrides(dict(custom))


def _module_selection(selection: Any) -> Callable[[str], bool] | None:
    if selection is False or selection is None:
        return None
    if selection is not True:
        if isinstance(selection, (str, type)) or not all(
            isinstance(cls, type) and issubclass(cls, torch.nn.Module) for cls in selection
        ):
            raise TypeError(
                "export_modules_as_functions must be True or a set of nn.Module classes, "
                f"got {selection!r}"
            )
    return module_selector(selection)


def _check_custom_opsets(custom_opsets: Mapping[str, int] | None) -> None:
    if custom_opsets is None:
        return
    if not isinstance(custom_opsets, Mapping):
        raise TypeError("custom_opsets must be a dict {domain: version}")
    for domain, version in custom_opsets.items():
        if not isinstance(domain, str) or domain in ("", "ai.onnx"):
            raise ValueError(
                f"custom_opsets names domain {domain!r}; the default ONNX domain's version is "
                "opset_version, custom_opsets is for custom domains"
            )
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"custom_opsets[{domain!r}] must be a positive int, got {version!r}")


def _check_names(argument: str, names: Sequence[str] | None) -> None:
    if names is None:
        return
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"{argument} must be a list of non-empty strings, got {names!r}")
    duplicates = sorted({n for n in names if list(names).count(n) > 1})
    if duplicates:
        raise ValueError(f"{argument} repeats {duplicates}; every name must be unique")


def _check_input_count(input_names: Sequence[str], count: int) -> None:
    if len(input_names) > count:
        raise ValueError(
            f"input_names has {len(input_names)} names but the model takes {count} tensor inputs"
        )


def _check_destination(f: Any) -> None:
    if f is None:
        return
    if isinstance(f, (str, os.PathLike)):
        directory = os.path.dirname(os.path.abspath(os.fspath(f)))
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"cannot write {os.fspath(f)!r}: directory {directory!r} does not exist")
        if os.path.isdir(os.fspath(f)):
            raise IsADirectoryError(f"f={os.fspath(f)!r} is a directory; give a file path")
        return
    if isinstance(f, io.TextIOBase) or not hasattr(f, "write"):
        raise TypeError(f"f must be a path or a binary file object, got {type(f).__name__}")


def export_to_pretty_string(model: Any, args: Any = (), **export_options: Any) -> str:
    """Export ``model`` (same arguments as :func:`export`, without ``f``) and return the graph's
    text form: inputs with types and shapes, then one line per node with its op, attributes,
    outputs and module (see :meth:`ONNXProgram.to_text`)."""
    if "f" in export_options:
        raise TypeError("export_to_pretty_string writes no file; drop f")
    return export(model, args, **export_options).to_text()


def verify(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    resized: Any = None,
    compare_intermediates: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    **export_options: Any,
) -> VerificationReport:
    """Export ``model`` with :func:`export` and verify it on ``args`` (and ``resized``); see
    :meth:`ONNXProgram.verify`.

    ``export_options`` go to export (``dynamic_shapes``, ``opset_version``,
    ``custom_translation_table``, ...). The program is ``report.program``.
    """
    args, kwargs = signature.split_legacy_args(args, kwargs)
    program = export(model, args, kwargs=kwargs, **export_options)
    return program.verify(*args, model=model, kwargs=kwargs, resized=resized,
                          compare_intermediates=compare_intermediates, rtol=rtol, atol=atol)
