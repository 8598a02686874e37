"""``ExportOptions``: every argument of :func:`dynexport.export`, type-checked and validated
before any work is done, each error naming the argument."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import IO, Any

import torch

from dynexport import files, signature, torchscript
from dynexport.capture import as_module
from dynexport.modes import TrainingMode
from dynexport.module_functions import module_selector
from dynexport.quantize.weights import WeightQuantization
from dynexport.registry import TranslationTable, default_table
from dynexport.translate import TranslationOptions

__all__ = ["DEFAULT_OPSET", "SUPPORTED_OPSETS", "TARGETS", "ExportOptions", "check_opset", "check_target"]

DEFAULT_OPSET = 20
SUPPORTED_OPSETS = range(13, 24)
# None: standard ONNX operators only, for any runtime; "onnxruntime": also its com.microsoft ops.
TARGETS = (None, "onnxruntime")


def check_opset(opset_version: Any) -> int:
    """The opset ``opset_version`` asks for (None: the default); ValueError for one not supported."""
    opset = DEFAULT_OPSET if opset_version is None else opset_version
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in SUPPORTED_OPSETS:
        raise ValueError(
            f"opset_version={opset_version!r} is not supported; choose one of "
            f"{SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1} (default {DEFAULT_OPSET})"
        )
    return opset


def check_target(target: Any) -> str | None:
    """``target`` checked: None (standard ONNX operators) or "onnxruntime"; ValueError otherwise."""
    if target not in TARGETS:
        raise ValueError(
            f"target={target!r} is not supported; use None (standard ONNX operators, any runtime) or "
            "'onnxruntime' (also onnxruntime's com.microsoft operators where they are faster there)"
        )
    return target


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What one export is asked to do, checked as a whole. Built by :meth:`validated`."""

    model_name: str
    args: tuple
    kwargs: dict[str, Any]
    f: str | os.PathLike | IO[bytes] | None
    external_data: bool | str | None
    opset: int
    input_names: tuple[str, ...] | None
    output_names: tuple[str, ...] | None
    dynamic_shapes: Any
    dynamic_axes: Mapping[str, Any] | None
    example_inputs: tuple | None
    training: TrainingMode
    dynamo: bool
    optimize: bool
    do_constant_folding: bool
    verify: bool
    verbose: bool
    report_file: str | None
    profile_file: str | None
    exported_program_file: str | None
    translation: TranslationOptions
    target: str | None = None
    strict_clamps: bool = False
    exact_norms: bool = False
    trace_layers_once: bool = True
    weight_quantization: WeightQuantization | None = None

    @property
    def auto_dims(self) -> bool:
        """``dynamic_shapes="auto"`` or ``torch.export.AdditionalInputs``: the dims come from
        comparing ``example_inputs``."""
        return isinstance(self.dynamic_shapes, (str, torch.export.AdditionalInputs))

    @property
    def example_calls_must_run(self) -> bool:
        """``torch.export.AdditionalInputs``: the program must run every example call, so a dim
        the model fixes or a call outside the proved ranges is refused, not warned about."""
        return isinstance(self.dynamic_shapes, torch.export.AdditionalInputs)

    @property
    def updates_buffers(self) -> bool:
        return self.training is TrainingMode.TRAINING

    def from_torchscript(self, model: Any) -> bool:
        return not self.dynamo or torchscript.is_torchscript(model)

    @classmethod
    def validated(
        cls,
        model: Any,
        args: Any,
        f: Any,
        *,
        kwargs: Any,
        export_params: Any,
        verbose: Any,
        input_names: Any,
        output_names: Any,
        opset_version: Any,
        dynamic_axes: Any,
        keep_initializers_as_inputs: Any,
        dynamic_shapes: Any,
        do_constant_folding: Any,
        optimize: Any,
        custom_translation_table: Any,
        custom_opsets: Any,
        fallback: Any,
        training: Any,
        export_modules_as_functions: Any,
        dynamo: Any,
        example_inputs: Any,
        report: Any,
        verify: Any,
        target: Any = None,
        strict_clamps: Any = False,
        exact_norms: Any = False,
        quantize_weights: Any = None,
        trace_layers_once: Any = True,
        external_data: Any = None,
        profile: Any = False,
        dump_exported_program: Any = False,
        artifacts_dir: Any = None,
        operator_export_type: Any = torch.onnx.OperatorExportTypes.ONNX,
        autograd_inlining: Any = True,
    ) -> ExportOptions:
        """Check every argument of :func:`dynexport.export` (types first), raising TypeError or
        ValueError naming the argument, and gather them."""
        for name, value in (
            ("export_params", export_params), ("keep_initializers_as_inputs", keep_initializers_as_inputs),
            ("do_constant_folding", do_constant_folding), ("optimize", optimize), ("dynamo", dynamo),
            ("verify", verify), ("strict_clamps", strict_clamps), ("exact_norms", exact_norms),
            ("trace_layers_once", trace_layers_once),
            ("profile", profile), ("dump_exported_program", dump_exported_program),
            ("autograd_inlining", autograd_inlining),
        ):
            _check_bool(name, value)
        if verbose is not None:
            _check_bool("verbose", verbose)
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a dict of keyword arguments, got {type(kwargs).__name__}")
        if dynamic_axes is not None and not isinstance(dynamic_axes, Mapping):
            raise TypeError(
                "dynamic_axes must be a dict {input_or_output_name: {axis: dim_name} or [axes]}, "
                f"got {type(dynamic_axes).__name__}"
            )
        if dynamic_shapes is not None and not isinstance(
            dynamic_shapes, (str, Mapping, tuple, list, torch.export.ShapesCollection, torch.export.AdditionalInputs)
        ):
            raise TypeError(
                "dynamic_shapes must be a dict keyed by argument name, a tuple/list with one entry per "
                "argument, a torch.export.ShapesCollection or AdditionalInputs, or 'auto'; got "
                f"{type(dynamic_shapes).__name__}"
            )
        if not isinstance(training, TrainingMode):
            raise TypeError(f"training must be a torch.onnx.TrainingMode, got {training!r}")
        input_names = _names("input_names", input_names)
        output_names = _names("output_names", output_names)
        shared_names = sorted(set(input_names or ()) & set(output_names or ()))
        if shared_names:
            raise ValueError(
                f"input_names and output_names share {shared_names}; ONNX needs every input and output named apart"
            )
        opset = check_opset(opset_version)
        check_target(target)
        if f is not None:
            files.check_destination(f)
        _check_external_data(external_data, f)
        if fallback not in (None, "custom_domain"):
            raise ValueError(f"fallback={fallback!r} is not supported; use None (raise) or 'custom_domain'")
        fallback = _fallback_of(operator_export_type, fallback)
        model_name = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "model")
        artifacts = _artifacts_stem(artifacts_dir, f, model_name)
        captured = isinstance(model, torch.export.ExportedProgram)
        if not dynamo and captured:
            raise ValueError(
                "dynamo=False traces a module with torch.jit.trace; an ExportedProgram is already captured"
            )
        if dynamic_shapes is not None and dynamic_axes is not None:
            raise ValueError("pass either dynamic_shapes or dynamic_axes, not both")
        if captured and (dynamic_shapes is not None or dynamic_axes is not None):
            raise ValueError(
                "an ExportedProgram's dynamic shapes were fixed when it was captured; pass "
                "dynamic_shapes to torch.export.export instead of to dynexport.export"
            )
        args, kwargs, example_inputs = _example_calls(args, kwargs, dynamic_shapes, example_inputs, captured)
        if isinstance(dynamic_shapes, torch.export.ShapesCollection):
            # keyed by the tensors' identities: read against the call as the user gave it
            dynamic_shapes = dynamic_shapes.dynamic_shapes(as_module(model, args), args, kwargs)
        translation = TranslationOptions(
            table=_table(custom_translation_table),
            opset=opset,
            export_params=export_params,
            keep_initializers_as_inputs=keep_initializers_as_inputs,
            fallback_to_custom_domain=fallback == "custom_domain",
            custom_opsets=_custom_opsets(custom_opsets),
            module_functions=_module_selection(export_modules_as_functions),
            buffer_updates=training is TrainingMode.TRAINING,
        )
        return cls(
            model_name=model_name, args=args, kwargs=kwargs, f=f, external_data=external_data, opset=opset,
            input_names=input_names, output_names=output_names, dynamic_shapes=dynamic_shapes,
            dynamic_axes=dynamic_axes, example_inputs=example_inputs, training=training, dynamo=dynamo,
            optimize=optimize, do_constant_folding=do_constant_folding, verify=verify, verbose=bool(verbose),
            report_file=_report_file(report, artifacts), translation=translation,
            profile_file=f"{artifacts}.profile.txt" if profile else None,
            exported_program_file=f"{artifacts}.pt2" if dump_exported_program else None,
            target=target, strict_clamps=strict_clamps, exact_norms=exact_norms,
            trace_layers_once=trace_layers_once,
            weight_quantization=_weight_quantization(quantize_weights, target),
        )


def _check_external_data(external_data: Any, f: Any) -> None:
    """``external_data`` is None, a bool or a data file name that fits ``f``."""
    if not (external_data is None or isinstance(external_data, (bool, str))) or external_data == "":
        raise TypeError(f"external_data must be True, False, None or a data file name, got {external_data!r}")
    if not external_data or f is None:
        return
    if not isinstance(f, (str, os.PathLike)):
        raise ValueError("external_data needs f to be a path, to write the data file next to; got a file object")
    if isinstance(external_data, str):
        files.data_location(os.fspath(f), external_data)


def _weight_quantization(spec: Any, target: str | None) -> WeightQuantization | None:
    """``quantize_weights`` checked; a dict without ``target`` takes the export's (None:
    the portable form)."""
    if spec is None:
        return None
    if isinstance(spec, Mapping) and "target" not in spec:
        spec = {**spec, "target": "onnxruntime" if target == "onnxruntime" else "portable"}
    return WeightQuantization.of(spec)


def _check_bool(argument: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be True or False, got {value!r}")


def _names(argument: str, names: Any) -> tuple[str, ...] | None:
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not all(
        isinstance(n, str) and n for n in names
    ):
        raise TypeError(f"{argument} must be a list of non-empty strings, got {names!r}")
    duplicates = sorted({n for n in names if list(names).count(n) > 1})
    if duplicates:
        raise ValueError(f"{argument} repeats {duplicates}; every name must be unique")
    return tuple(names)


def _example_calls(
    args: Any, kwargs: Mapping[str, Any] | None, dynamic_shapes: Any, example_inputs: Any, captured: bool
) -> tuple[tuple, dict, tuple | None]:
    """The export call's ``(args, kwargs)`` and, with ``dynamic_shapes="auto"``, the further
    example calls (the first of them is the export call when ``args`` and ``kwargs`` are empty).
    An ExportedProgram is called with nothing."""
    if isinstance(dynamic_shapes, str) and dynamic_shapes != "auto":
        raise ValueError(f"dynamic_shapes={dynamic_shapes!r}: the only string accepted is 'auto'")
    if isinstance(dynamic_shapes, torch.export.AdditionalInputs):
        example_inputs = _additional_calls(dynamic_shapes, example_inputs)
    auto_dims = isinstance(dynamic_shapes, (str, torch.export.AdditionalInputs))
    if auto_dims and captured:
        raise ValueError("dynamic_shapes='auto' needs a model to capture, not an ExportedProgram")
    if example_inputs is not None and not auto_dims:
        raise ValueError("example_inputs is only used with dynamic_shapes='auto'")
    if not auto_dims:
        return ((), {}, None) if captured else (*signature.split_legacy_args(args, kwargs), None)
    if isinstance(example_inputs, (str, bytes)) or not isinstance(example_inputs, Sequence) or not example_inputs:
        raise ValueError(
            "dynamic_shapes='auto' needs example_inputs: a list of further calls (args tuples or "
            "(args, kwargs) pairs) whose sizes differ where the model is dynamic"
        )
    example_inputs = tuple(example_inputs)
    if not args and not kwargs:
        (args, kwargs), example_inputs = signature.as_call(example_inputs[0]), example_inputs[1:]
        if not example_inputs:
            raise ValueError("dynamic_shapes='auto' needs at least two example calls")
    return (*signature.split_legacy_args(args, kwargs), example_inputs)


def _additional_calls(additional: torch.export.AdditionalInputs, example_inputs: Any) -> list[tuple[tuple, dict]]:
    """The ``(args, kwargs)`` calls ``additional.add`` was given: the further example calls of
    ``dynamic_shapes="auto"``. torch keeps them in ``_examples`` and has no public reader."""
    if example_inputs is not None:
        raise ValueError(
            "pass the further example calls either in torch.export.AdditionalInputs or as example_inputs, not both"
        )
    calls = [(args, kwargs or {}) for args, kwargs in additional._examples]
    if not calls:
        raise ValueError(
            "the torch.export.AdditionalInputs given as dynamic_shapes holds no call: add(args, kwargs) "
            "further inputs whose sizes differ where the model is dynamic"
        )
    return calls


def _report_file(report: Any, artifacts: str) -> str | None:
    if report is None or report is False:
        return None
    if report is True:
        return f"{artifacts}.report.md"
    if not isinstance(report, (str, os.PathLike)):
        raise TypeError(f"report must be True, False or a path, got {type(report).__name__}")
    path = os.fspath(report)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write the report {path!r}: directory {directory!r} does not exist")
    return path


def _artifacts_stem(artifacts_dir: Any, f: Any, model_name: str) -> str:
    """The path, less its suffix, of the report, profile and program dump: named after ``f``
    (``model.onnx`` -> ``model``) or the model, in ``artifacts_dir``, else ``f``'s folder or here."""
    named = os.fspath(f) if isinstance(f, (str, os.PathLike)) else model_name
    stem = os.path.splitext(named)[0]
    if artifacts_dir is None:
        return stem
    if not isinstance(artifacts_dir, (str, os.PathLike)):
        raise TypeError(f"artifacts_dir must be a folder path, got {type(artifacts_dir).__name__}")
    if not os.path.isdir(artifacts_dir):
        raise FileNotFoundError(f"artifacts_dir {os.fspath(artifacts_dir)!r} is not an existing folder")
    return os.path.join(os.fspath(artifacts_dir), os.path.basename(stem))


def _fallback_of(operator_export_type: Any, fallback: str | None) -> str | None:
    """torch.onnx's legacy ``operator_export_type`` as dynexport's ``fallback``."""
    types = torch.onnx.OperatorExportTypes
    if not isinstance(operator_export_type, types):
        raise TypeError(f"operator_export_type must be a torch.onnx.OperatorExportTypes, got {operator_export_type!r}")
    if operator_export_type == types.ONNX:
        return fallback
    if operator_export_type in (types.ONNX_FALLTHROUGH, types.ONNX_ATEN_FALLBACK):
        return "custom_domain"
    raise ValueError(
        "operator_export_type=ONNX_ATEN (every operator as an ATen node) is not supported; use the "
        "default ONNX, or fallback='custom_domain' to export only the operators without a translation "
        "as custom-domain nodes"
    )


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


def _module_selection(selection: bool | Collection[type[torch.nn.Module]] | None) -> Callable[[str], bool] | None:
    if selection is False or selection is None:
        return None
    if selection is not True:
        if isinstance(selection, (str, type)) or not isinstance(selection, Collection) or not all(
            isinstance(cls, type) and issubclass(cls, torch.nn.Module) for cls in selection
        ):
            raise TypeError(
                "export_modules_as_functions must be True or a set of nn.Module classes, "
                f"got {selection!r}"
            )
    return module_selector(selection)


def _custom_opsets(custom_opsets: Mapping[str, int] | None) -> dict[str, int]:
    if custom_opsets is None:
        return {}
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
    return dict(custom_opsets)
