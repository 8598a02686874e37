"""``dynexport.export``: validate every argument into one :class:`~dynexport.options.ExportOptions`,
then run the stages: capture, decompose (and plan the translation), translate, optimize, finish
(verify, write, print), each timed by one :class:`PhaseTimer`."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import os
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import IO, Any

import torch
from torch.export import Dim

from dynexport import capture as capture_stage
from dynexport import files
from dynexport import report as report_stage
from dynexport import dim_names, signature, torchscript
from dynexport.call_convention import user_outputs
from dynexport.contiguous_views import contiguous_views_direct
from dynexport.dim_refinement import (
    DIM_REFINEMENTS_KEY,
    capture_refining_dims,
    derived_dim_roots,
    dims_tied_by_the_model,
    refinements_metadata,
)
from dynexport.decompositions import sizes_fixed_since
from dynexport.errors import ExampleCallRefusedError, ExportError, TranslationError
from dynexport.input_guards import dim_minimums, minimums_while_translating, symbol_minimums
from dynexport.model_caches import caches_flattened, check_cache_shapes, check_sliding_window_dims
from dynexport.modes import TrainingMode, exporting, select_model_mode_for_export
from dynexport.options import DEFAULT_OPSET, SUPPORTED_OPSETS, ExportOptions
from dynexport.passes.fx.functionalize import inplace_ops_are_local
from dynexport.passes.fx.fuse_llm import fuse_llm_patterns
from dynexport.passes.fx.simplify import simplify_program
from dynexport.passes.onnx import optimize_model
from dynexport.passes.onnx.naming import unique_name
from dynexport.passes.onnx.values import values_by_name
from dynexport.program import ONNXProgram
from dynexport.quantize import WeightQuantization, quantize_model
from dynexport.quantize.torchao import store_torchao_weights, torchao_weights
from dynexport.translate import TranslationPlan
from dynexport.verification import VerificationReport

__all__ = ["DEFAULT_OPSET", "SUPPORTED_OPSETS", "export", "export_to_pretty_string", "phase_listener", "verify"]

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
    target: str | None = None,
    strict_clamps: bool = False,
    exact_norms: bool = False,
    quantize_weights: WeightQuantization | Mapping[str, Any] | None = None,
    trace_layers_once: bool = True,
    external_data: bool | str | None = None,
    profile: bool = False,
    dump_exported_program: bool = False,
    artifacts_dir: str | os.PathLike | None = None,
    operator_export_type: torch.onnx.OperatorExportTypes = torch.onnx.OperatorExportTypes.ONNX,
    autograd_inlining: bool = True,
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
        external_data: how ``f`` holds the weights (as :meth:`ONNXProgram.save`): None (default)
            in the model file up to 2 GB and in ``<f>.data`` beyond; True always in
            ``<f>.data`` (torch.onnx's default); a name, that file next to ``f``; False one file.
        kwargs: example keyword arguments.
        export_params: store parameters as initializers; when False they become graph inputs.
        verbose: print the ONNX graph after export.
        input_names: names of the ONNX graph's tensor inputs, in flattened order; when there are
            more names than tensor inputs, of every argument in order (a name for one left None
            is warned about and unused); names beyond every argument name the model's
            parameters and buffers (its state_dict, shared tensors once) in order.
        output_names: names of the ONNX graph's outputs, in flattened order.
        opset_version: ONNX opset, 13 to 23 (default 20).
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
        target: None (default): the graph uses standard ONNX operators only and runs in any
            runtime. ``"onnxruntime"``: the optimizer also writes onnxruntime's com.microsoft
            operators (fused attention, skip layer norm, ...) where they are faster there; the
            graph then runs in onnxruntime only (docs/optimizer.md lists them with measurements).
        strict_clamps: keep hardtanh, relu6 and clamp to constant bounds as ``Max`` and ``Min``,
            whose NaN propagation the ONNX standard defines, instead of the faster ``Clip``
            (NaN-propagating in onnxruntime, left open by the standard; docs/optimizer.md).
        exact_norms: feed onnxruntime's InstanceNormalization (instance and group norm) each
            channel less its first element, a Slice and a Sub more per normalization: within
            1e-6 of float64 where the mean is large against the spread, where by default (as
            torch.onnx's graph) it is 1.1-6.4x eager float32's own error (docs/optimizer.md).
        quantize_weights: store the weights of linear layers as int4/int8 with per-block scales
            after optimization, as ``program.quantize_weights`` does: a
            ``dynexport.quantize.WeightQuantization`` or a dict of its fields (``{"bits": 4}``;
            without ``"target"`` it follows ``target``: MatMulNBits for ``"onnxruntime"``,
            DequantizeLinear otherwise). See docs/llm.md.
        profile: profile the export with cProfile and write the statistics (cumulative time,
            the 80 costliest calls) to ``<artifacts>.profile.txt``.
        dump_exported_program: write the captured ``ExportedProgram`` to ``<artifacts>.pt2``
            (``torch.export.save``; its text form, ``.exported_program.txt``, where it cannot
            be serialized).
        artifacts_dir: the folder of the report, profile and program dump, which are named
            after ``f`` (``model.onnx`` -> ``model.report.md``) or the model's class; by
            default ``f``'s folder, or the working directory.
        operator_export_type: torch.onnx's legacy option: ``ONNX`` (default);
            ``ONNX_FALLTHROUGH`` and ``ONNX_ATEN_FALLBACK`` export an operator with no
            translation as a custom-domain node, as ``fallback="custom_domain"``;
            ``ONNX_ATEN`` (every operator as an ATen node) is refused.
        autograd_inlining: accepted for torch.onnx's signature; autograd functions are always
            traced through (inlined) by capture.
        trace_layers_once: capture a ``ModuleList`` of like layers (a transformer's decoder or
            encoder layers, 6 or more) by tracing its first two (three when the first differs)
            and copying the last traced one's graph for the others, each copy with its own
            layer's weights and cache slot: capture time then barely grows with the number of
            layers. Used only when every check of its soundness passes (the layers alike, called
            alike, their graphs the same up to their weights and cache slots; docs/llm.md),
            otherwise the model is captured in full, as with False.

    Returns:
        An :class:`ONNXProgram`.

    Raises:
        ValueError, TypeError: inconsistent or unsupported arguments, before any work is done,
            each naming its argument (see :class:`~dynexport.options.ExportOptions`).
        FileNotFoundError, PermissionError, IsADirectoryError: ``f`` cannot be written, before
            any work is done.
        dynexport.errors.CaptureError: torch.export could not capture the model.
        dynexport.errors.ExportError: the model returns no tensor.
        dynexport.errors.UnsupportedOperatorError: operators with no translation, all listed.
        dynexport.verification.VerificationError: with ``verify=True``, outputs that differ.
    """
    options = ExportOptions.validated(
        model, args, f, kwargs=kwargs, export_params=export_params, verbose=verbose,
        input_names=input_names, output_names=output_names, opset_version=opset_version,
        dynamic_axes=dynamic_axes, keep_initializers_as_inputs=keep_initializers_as_inputs,
        dynamic_shapes=dynamic_shapes, do_constant_folding=do_constant_folding, optimize=optimize,
        custom_translation_table=custom_translation_table, custom_opsets=custom_opsets,
        fallback=fallback, training=training, export_modules_as_functions=export_modules_as_functions,
        dynamo=dynamo, example_inputs=example_inputs, report=report, verify=verify,
        target=target, strict_clamps=strict_clamps, exact_norms=exact_norms, quantize_weights=quantize_weights,
        trace_layers_once=trace_layers_once, external_data=external_data, profile=profile,
        dump_exported_program=dump_exported_program, artifacts_dir=artifacts_dir,
        operator_export_type=operator_export_type, autograd_inlining=autograd_inlining,
    )
    with _profiled(options.profile_file), _no_full_collections():
        return _export(model, f, options)


@contextlib.contextmanager
def _no_full_collections() -> Iterator[None]:
    """Within the block Python's garbage collector collects its young generations only. What
    exists before an export (torch, transformers, the model) is most of the heap, and each full
    collection during the export scanned all of it again: 0.6 s of a 30-layer decoder's 5 s
    (benchmarks/llm.py). The objects the export leaves count toward the next full collection as
    usual once the collector's thresholds are restored. (Freezing the heap instead, gc.freeze,
    would move uncollected garbage where full collections rarely look: a process exporting many
    models grew.)"""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


# A count of young-generation collections that never comes during one export.
_NEVER = 1 << 30


def _export(model: Any, f: Any, options: ExportOptions) -> ONNXProgram:
    record = report_stage.ExportRecord(
        options.model_name, options.opset,
        destination=os.fspath(f) if isinstance(f, (str, os.PathLike)) else None,
    )
    timer = PhaseTimer(record.timings)
    with report_stage.reporting(options.report_file, record), caches_flattened(), torchao_weights(model) as torchao:
        captured = _capture(model, options, timer, record)
        if options.exported_program_file is not None:
            _dump_exported_program(captured.program, options.exported_program_file)
        plan = _plan(captured, options, timer, record)
        with timer.phase("translate"), minimums_while_translating(_accepted_minimums(plan, options, record)):
            onnx_model = plan.emit()
        with timer.phase("optimize"):
            _optimize(onnx_model, options)
        if torchao is not None:
            with timer.phase("quantize"):
                store_torchao_weights(onnx_model, torchao, options.weight_quantization, options.target)
        elif options.weight_quantization is not None:
            with timer.phase("quantize"):
                quantize_model(onnx_model, options.weight_quantization)
        _name_parameters(onnx_model, captured.parameter_names)
        if record.dim_refinements:
            onnx_model.metadata_props[DIM_REFINEMENTS_KEY] = refinements_metadata(record.dim_refinements)
        record.onnx_model = onnx_model
        result = ONNXProgram(
            onnx_model, plan.program, capture_strategy=captured.strategy,
            declared_minimums=dim_names.declared_minimums(options.dynamic_shapes),
        )
        result.timings = record.timings
        result.report_path = options.report_file
        if options.example_calls_must_run:
            _check_additional_calls(result, options.example_inputs)
        _finish(result, model, options, timer, record)
        return result


@contextlib.contextmanager
def _profiled(path: str | None) -> Iterator[None]:
    """Profile the block with cProfile into ``path`` (the 80 costliest calls by cumulative time),
    written however the block ends; nothing without a path."""
    if path is None:
        yield
        return
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(80)
        files.write_atomically(text.getvalue().encode(), path)


def _dump_exported_program(program: torch.export.ExportedProgram, path: str) -> None:
    """``torch.export.save`` the program to ``path``; where torch cannot serialize it, its text
    form next to it, with a warning."""
    try:
        torch.export.save(program, path)
    except Exception as error:  # a debugging artifact must not fail the export
        text_path = path.removesuffix(".pt2") + ".exported_program.txt"
        files.write_atomically(str(program).encode(), text_path)
        warnings.warn(
            f"dump_exported_program: torch.export.save failed ({type(error).__name__}: {error}); "
            f"the program's text form is in {text_path}",
            stacklevel=4,
        )


@dataclasses.dataclass(frozen=True)
class _Captured:
    """What capture gives the later stages: the program, how it was captured, the graph input
    names the user asked for and the dim names, keyed by (input, axis)."""

    program: torch.export.ExportedProgram
    strategy: str
    input_names: list[str] | None
    requested_dims: dict[tuple[str, int], str]
    parameter_names: dict[str, str] = dataclasses.field(default_factory=dict)


def _capture(model: Any, options: ExportOptions, timer: PhaseTimer, record: report_stage.ExportRecord) -> _Captured:
    """Capture ``model`` (or take the ExportedProgram given) and refuse a program with no output."""
    if isinstance(model, torch.export.ExportedProgram):
        capture_stage.check_given(model)
        program = capture_stage.without_effect_tokens(model)
        input_names, parameter_names = signature.program_input_names(options.input_names, program)
        captured = _Captured(program, "given ExportedProgram", input_names, {}, parameter_names)
    else:
        captured = _capture_module(model, options, timer, record)
    record.strategy, record.exported_program = captured.strategy, captured.program
    _check_has_outputs(captured.program, options.model_name)
    return captured


def _capture_module(
    model: Any, options: ExportOptions, timer: PhaseTimer, record: report_stage.ExportRecord
) -> _Captured:
    args, kwargs, dynamic_shapes = options.args, options.kwargs, options.dynamic_shapes
    if options.from_torchscript(model):
        with timer.phase("torchscript"), exporting(), select_model_mode_for_export(model, options.training):
            module, args = torchscript.graph_module(model, args, kwargs)
        kwargs = {}
        capture = torchscript.capture
    else:
        module = capture_stage.as_module(model, args)
        capture = functools.partial(capture_stage.capture, trace_layers_once=options.trace_layers_once)
    signature.check_argument_types(args, kwargs)
    bound = signature.bind_arguments(module.forward, args, kwargs)
    slots = signature.argument_slots(module.forward, args, kwargs)
    if options.dynamic_axes is not None:
        dynamic_shapes, requested_dims = dim_names.dynamic_shapes_from_axes(
            options.dynamic_axes, bound, slots, options.input_names, options.output_names
        )
    elif options.auto_dims:
        hint = Dim.DYNAMIC if options.example_calls_must_run else Dim.AUTO
        dynamic_shapes, requested_dims = dim_names.dynamic_shapes_from_examples(
            module.forward, bound, options.example_inputs, hint
        )
    else:
        dynamic_shapes = signature.undeclared_arguments_static(module.forward, bound, dynamic_shapes)
        dynamic_shapes = signature.keyed_by_argument(module.forward, bound, dynamic_shapes)
        dynamic_shapes, string_dims = dim_names.string_dims(dynamic_shapes, bound)
        requested_dims = {**dim_names.named_dims(dynamic_shapes, bound), **string_dims}
    if options.dynamic_axes is not None or options.auto_dims:
        dynamic_shapes = signature.keyed_as_torch_export(module.forward, dynamic_shapes)
    input_names = signature.graph_input_names(options.input_names, slots)
    parameter_names = signature.parameter_names(options.input_names, slots, module)
    check_cache_shapes(dynamic_shapes, bound)
    check_sliding_window_dims(dim_names.declared_dims(dynamic_shapes, bound), bound)
    if options.from_torchscript(model) and not torchscript.is_torchscript(model):
        with timer.phase("torchscript"), exporting(), select_model_mode_for_export(model, options.training):
            torchscript.check_trace_holds_at_other_sizes(
                model, options.args, options.kwargs, dynamic_shapes, bound, requested_dims
            )
    with (
        timer.phase("capture"), exporting(), select_model_mode_for_export(module, options.training),
        capture_stage.keyword_arguments_named(module, kwargs),
    ):
        program, strategy, record.dim_refinements, dynamic_shapes = capture_refining_dims(
            capture, module, args, kwargs, dynamic_shapes, requested_dims
        )
    if options.auto_dims:
        _warn_fixed_dims(program, requested_dims)
    elif options.dynamic_axes is None:
        named = dim_names.named_dims(dynamic_shapes, bound)
        record.dim_refinements += dims_tied_by_the_model(program, named)
        requested_dims = {**named, **string_dims}
    requested_dims.update(dim_names.derived_dims(dynamic_shapes, bound))
    return _Captured(program, strategy, input_names, requested_dims, parameter_names)


def _plan(
    captured: _Captured, options: ExportOptions, timer: PhaseTimer, record: report_stage.ExportRecord
) -> TranslationPlan:
    """Functionalize and simplify the program, name its inputs, outputs and dims, and give every
    node its rule or decomposition (the "decompose" phase); the report gets the summary."""
    with timer.phase("decompose"):
        program = _functionalized(captured.program, explicit_buffer_updates=options.updates_buffers)
        shape_env, dims = _shape_env(program)
        replaced = dict(shape_env.replacements) if shape_env is not None else {}
        if options.optimize:
            program = fuse_llm_patterns(program, opset=options.opset)
        simplifications = (
            simplify_program(program, fold_constants=options.do_constant_folding) if options.optimize else None
        )
        record.exported_program = program
        io_names = dim_names.graph_dims(
            program,
            signature.graph_io(program, captured.input_names, options.output_names),
            captured.requested_dims,
            options.dynamic_axes,
            options.output_names,
        )
        io_names.dim_names.update(derived_dim_roots(program, captured.requested_dims))
        _check_sizes_kept_by_the_fx_passes(shape_env, replaced, dims)
        plan = TranslationPlan(program, io_names, options.translation, simplifications)
        record.summary = plan.summary()
    return plan


def _shape_env(program: torch.export.ExportedProgram) -> tuple[Any, dict[str, str]]:
    """The program's shape environment, and the name of each input dim's symbol (``x.shape[0]``)."""
    placeholders = program.graph.find_nodes(op="placeholder")
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in placeholders])
    dims = {
        str(size): f"{node.name}.shape[{axis}]"
        for node in placeholders
        if isinstance(node.meta.get("val"), torch.Tensor)
        for axis, size in enumerate(node.meta["val"].shape)
        if isinstance(size, torch.SymInt)
    }
    return (fake_mode.shape_env if fake_mode is not None else None), dims


def _check_sizes_kept_by_the_fx_passes(shape_env: Any, replaced: dict[Any, Any], names: Mapping[str, str]) -> None:
    """Refuse a program the FX passes fixed dynamic sizes of (read a symbolic size as an int,
    since ``shape_env`` had the replacements ``replaced``): every shape of it would say so, and
    the graph be static."""
    fixed = sizes_fixed_since(shape_env, replaced)
    if fixed:
        raise TranslationError(
            "the FX passes (fuse_llm_patterns, simplify_program)",
            None,
            "they fixed dynamic sizes to the example's "
            f"({', '.join(f'{names.get(s.name, s.name)} = {v}' for s, v in fixed.items())})",
            "this is a bug in dynexport; export with optimize=False, which skips those passes, and please "
            "report it with the model.",
        )


def _optimize(onnx_model: Any, options: ExportOptions) -> None:
    if options.optimize:
        with _dataless_weights_hidden(onnx_model):
            optimize_model(
                onnx_model, fold_constants=options.do_constant_folding, clamps_as_clip=not options.strict_clamps,
                shifted_norms=options.exact_norms, target=options.target,
            )


def _accepted_minimums(
    plan: TranslationPlan, options: ExportOptions, record: report_stage.ExportRecord
) -> dict[Any, int]:
    """The least value of each shape symbol at the input sizes the program will accept (the
    minimums its input checks enforce, computed as they will be: dynexport/input_guards.py)."""
    names = {
        size.node.expr: str(plan.translator.dims.dim(size))
        for node in plan.program.graph.nodes
        if node.op == "placeholder" and isinstance(val := node.meta.get("val"), torch.Tensor)
        for size in val.shape
        if isinstance(size, torch.SymInt)
    }
    refined = {r.dim: r.change for r in record.dim_refinements}
    minimums = dim_minimums(plan.program, names, dim_names.declared_minimums(options.dynamic_shapes), refined)
    return symbol_minimums(minimums)


def _name_parameters(onnx_model: Any, names: dict[str, str]) -> None:
    """Give the parameters of ``names`` (``{state_dict key: name}``, from ``input_names``
    beyond the inputs) their names, as initializers or, with ``export_params=False``, graph
    inputs; a value of the graph already named so is renamed out of the way. A parameter the
    graph no longer holds (folded into another, or unused) leaves its name unused, with a
    warning."""
    if not names:
        return
    graph = onnx_model.graph
    by_name = values_by_name(graph)
    parameters = {**{value.name: value for value in graph.inputs}, **graph.initializers}
    unused = []
    for key, name in names.items():
        parameter = parameters.get(key)
        if parameter is None:
            unused.append(f"{name!r} (the model's {key})")
            continue
        holder = by_name.get(name)
        if holder is not None and holder is not parameter:
            if holder.is_initializer() or holder in graph.inputs or holder in graph.outputs:
                raise ValueError(
                    f"input_names names the model's {key} {name!r}, which is already the name of a graph "
                    f"{'input' if holder in graph.inputs else 'output' if holder in graph.outputs else 'weight'}; "
                    "give it another name"
                )
            holder.name = unique_name(name, by_name)
            by_name[holder.name] = holder
        parameter.name = name
        by_name[name] = parameter
    if unused:
        warnings.warn(
            f"input_names names {', '.join(unused)}, which the ONNX graph does not hold (folded into "
            "another weight, or unused): the name goes unused",
            stacklevel=4,
        )


def _check_has_outputs(program: torch.export.ExportedProgram, model_name: str) -> None:
    """An ONNX model with no output computes nothing a runtime can return: refuse it now."""
    graph_values = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
    if not any(
        isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), graph_values)
        for arg, _ in user_outputs(program)
    ):
        returned = [arg if not isinstance(arg, torch.fx.Node) else arg.name for arg, _ in user_outputs(program)]
        raise ExportError(
            f"{model_name} returns no tensor (its outputs at export: {returned or 'none'}); an ONNX "
            "model needs at least one output. Return the tensors the model computes."
        )


def _check_additional_calls(program: ONNXProgram, calls: Sequence[tuple[tuple, dict]]) -> None:
    """Refuse the export when a call of its ``torch.export.AdditionalInputs`` is outside the
    sizes and values the graph accepts, as torch.export refuses such a program."""
    for index, (args, kwargs) in enumerate(calls):
        try:
            program.input_feeds(*args, **kwargs)
        except ValueError as error:
            raise ExampleCallRefusedError(index, error) from error


def _finish(
    result: ONNXProgram, model: Any, options: ExportOptions, timer: PhaseTimer, record: report_stage.ExportRecord
) -> None:
    """Verify, write ``f``, print the graph if asked; a failed verification raises last, after
    ``f`` is written."""
    if options.verify:
        with timer.phase("verify"):
            eager = model.module() if isinstance(model, torch.export.ExportedProgram) else model
            record.verification = result.verify(*options.args, model=eager, kwargs=options.kwargs)
    if options.f is not None:
        with timer.phase("serialize"):
            result.save(options.f, external_data=options.external_data)
    if options.verbose:
        print(result.to_text())
    if record.verification is not None:
        record.verification.raise_on_failure()


class PhaseTimer:
    """Seconds spent in each export phase, added up in ``seconds``; each phase's end is told to
    the :func:`phase_listener`, if any."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds = seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            callback = _phase_listener.get()
            if callback is not None:
                callback(name, elapsed)


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
    if inplace_ops_are_local(program.graph) and not (explicit_buffer_updates and program.graph_signature.buffers):
        return program
    with contiguous_views_direct():  # the re-trace views the capture's tensors again
        return program.run_decompositions({})


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
