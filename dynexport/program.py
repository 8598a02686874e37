"""ONNXProgram: the result of an export — the ONNX model, how to save it, run it and check it.

The program is a façade: files are written by :mod:`dynexport.files`, models run by
:mod:`dynexport.runtime`, text rendered by :mod:`dynexport.graph_text`, checks made by
:mod:`dynexport.verification`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import onnx
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from dynexport import files, runtime
from dynexport.call_convention import OutputLayout, flatten_call, is_graph_input, user_input_specs
from dynexport.graph_text import format_graph, value_text
from dynexport.dim_refinement import DIM_REFINEMENTS_KEY
from dynexport.input_guards import InputGuards
from dynexport.model_caches import caches_flattened
from dynexport.passes.onnx.values import values_by_name
from dynexport.quantize import WeightQuantization, quantization_of, quantize_model, verify_quantized
from dynexport.signature import split_legacy_args
from dynexport.passes.onnx.rename_dims import dim_names, rename_dims, renamed
from dynexport.translate import BUFFER_UPDATES_KEY, OUTPUT_DIMS_KEY
from dynexport.verification import VerificationReport, verify_program

__all__ = ["ONNXProgram"]


def _dim_renaming(rename_mapping: Mapping[Any, Any], names: set[str]) -> dict[str, str]:
    """``rename_axes``' mapping as old name to new name, checked."""
    if not isinstance(rename_mapping, Mapping):
        raise TypeError(f"rename_axes takes a dict of old dims to new names, got {type(rename_mapping).__name__}")
    mapping: dict[str, str] = {}
    for key, new in rename_mapping.items():
        old = key.value if isinstance(key, ir.SymbolicDim) else key
        if not isinstance(old, str):
            raise TypeError(f"rename_axes: {key!r} is not a dim name (str) or a named SymbolicDim of the model")
        if not isinstance(new, str) or not new.strip():
            raise TypeError(f"rename_axes: the new name of {old!r} must be a non-empty str, got {new!r}")
        mapping[old] = new
    kept = names - set(mapping)
    taken = {old: new for old, new in mapping.items() if new in kept and new != old}
    if taken:
        old, new = next(iter(taken.items()))
        raise ValueError(
            f"rename_axes: {new!r}, the new name of {old!r}, already names another dim of the model; two dims of "
            "one name are one size in ONNX. Choose another name, or rename that dim too"
        )
    return mapping


class ONNXProgram:
    """An exported model.

    Attributes:
        model: the ONNX model as an ``onnx_ir.Model``.
        exported_program: the torch.export program it was translated from (None when the model
            was built another way).
        timings: seconds spent in each export phase.
        capture_strategy: the torch.export strategy that captured the model.
        verification: the :class:`~dynexport.verification.VerificationReport` of the last
            :meth:`verify`, if any.
        report_path: where ``export(report=...)`` wrote its markdown report, if anywhere.
    """

    def __init__(
        self,
        model: ir.Model,
        exported_program: torch.export.ExportedProgram | None,
        *,
        timings: dict[str, float] | None = None,
        capture_strategy: str | None = None,
        declared_minimums: Mapping[str, int] | None = None,
    ):
        self.model = model
        self.exported_program = exported_program
        self.timings = dict(timings or {})
        self.capture_strategy = capture_strategy
        self.verification: VerificationReport | None = None
        self.report_path: str | None = None
        self._proto: onnx.ModelProto | None = None
        self._session = None
        # Training mode: the buffers each call updates, fed to the next call (as eager PyTorch
        # updates its module's buffers); empty until the first call.
        self.buffers: dict[str, torch.Tensor] = {}
        self.input_guards: InputGuards | None = None
        if exported_program is not None:
            self.input_guards = InputGuards.of(exported_program, model, declared_minimums)
            model.metadata_props.update(self.input_guards.metadata())

    def __repr__(self) -> str:
        graph = self.model.graph
        inputs = ", ".join(value_text(v) for v in graph.inputs)
        outputs = ", ".join(value_text(v) for v in graph.outputs)
        return (
            f"ONNXProgram(opset={self.model.opset_imports.get('', '?')}, nodes={len(graph)}, "
            f"initializers={len(graph.initializers)}, inputs=[{inputs}], outputs=[{outputs}])"
        )

    def to_text(self, *, max_nodes: int | None = None) -> str:
        """The graph as text, one line per node, like torch.onnx's classic ``verbose=True``
        printout: inputs with types and shapes, then ``%out : type = Op[attrs](%inputs)`` and
        the module the node came from."""
        return format_graph(self.model, max_nodes=max_nodes)

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an ``onnx.ModelProto`` (initializers included)."""
        if self._proto is None:
            files.require_weights(self.model, "build the ModelProto")
            self._proto = ir.serde.serialize_model(self.model)
        return self._proto

    @property
    def initializers(self) -> dict[str, torch.Tensor]:
        """The initializers by name, as torch tensors (no copy for tensors that came from the
        model; meta tensors for weights that were never materialised)."""
        return {
            name: files.as_torch(value.const_value)
            for name, value in self.model.graph.initializers.items()
            if value.const_value is not None
        }

    def rename_axes(self, rename_mapping: Mapping[str | ir.SymbolicDim, str]) -> None:
        """Rename symbolic dims, as torch.onnx's ``ONNXProgram.rename_axes`` does: keys are dim
        names (``"seq"``) or the ``SymbolicDim`` objects of the model's shapes, values the new
        names. Every value's shape changes, expressions of a renamed name too (``past + seq``),
        and so do the input checks and the metadata that name dims.

        Raises:
            TypeError: a key or a new name of another type.
            ValueError: an empty new name, or one the model already gives another dim (two dims
                of one name are one size in ONNX).
        """
        mapping = _dim_renaming(rename_mapping, dim_names(self.model))
        rename_dims(self.model, mapping)
        rename = functools.partial(renamed, mapping=mapping)
        if self.input_guards is not None:
            self.input_guards = self.input_guards.renamed(rename)
            self.model.metadata_props.update(self.input_guards.metadata())
        metadata = self.model.metadata_props
        if OUTPUT_DIMS_KEY in metadata:  # {output: {axis: size in dim names}}
            sizes = json.loads(metadata[OUTPUT_DIMS_KEY])
            metadata[OUTPUT_DIMS_KEY] = json.dumps(
                {output: {axis: rename(size) for axis, size in dims.items()} for output, dims in sizes.items()}
            )
        if DIM_REFINEMENTS_KEY in metadata:  # {dim: change}
            changes = json.loads(metadata[DIM_REFINEMENTS_KEY])
            metadata[DIM_REFINEMENTS_KEY] = json.dumps({rename(dim): rename(change) for dim, change in changes.items()})
        self._changed()

    def _changed(self) -> None:
        self._proto = None
        self._session = None

    # -- weights ----------------------------------------------------------------------------

    def missing_weights(self) -> list[str]:
        """Initializers without data: weights on the meta device or fake tensors."""
        return files.missing_weights(self.model)

    def apply_weights(self, state_dict: Mapping[str, torch.Tensor] | str | os.PathLike, *, strict: bool = True) -> list[str]:
        """Give the initializers new data, matched by name (the parameter path).

        Args:
            state_dict: a state dict, or the path of a ``.safetensors`` file (read lazily, one
                tensor at a time when saving) or of a ``torch.save`` checkpoint.
            strict: raise when an initializer that holds no data is not in ``state_dict``.

        Returns:
            The names of the initializers that were replaced. Keys matching no initializer
            (tied or unused parameters, buffers folded away) are ignored.

        Raises:
            ValueError: a shape or dtype differs from the exported one, nothing matched, or
                (with ``strict``) weights the model needs are missing.
        """
        applied = files.apply_weights(self.model, state_dict, strict=strict)
        self._changed()
        return applied

    # -- passes -----------------------------------------------------------------------------

    def optimize(
        self, *, target: str | None = None, strict_clamps: bool = False, exact_norms: bool = False
    ) -> ONNXProgram:
        """Run dynexport's ONNX optimization passes on the model again (in place); ``target``,
        ``strict_clamps`` and ``exact_norms`` mean what they mean to :func:`dynexport.export`."""
        from dynexport.options import check_target
        from dynexport.passes.onnx import optimize_model

        optimize_model(
            self.model, clamps_as_clip=not strict_clamps, shifted_norms=exact_norms, target=check_target(target)
        )
        self._changed()
        return self

    def quantize_weights(
        self,
        bits: int = 4,
        *,
        block_size: int = 32,
        target: str = "onnxruntime",
        accuracy_level: int = 0,
        symmetric: bool = True,
        embedding: bool = False,
        lm_head: bool = True,
        algorithm: str = "rtn",
    ) -> ONNXProgram:
        """A new program whose weight products (MatMul and Gemm by a constant 2-D weight) store
        their weights as ``bits``-bit integers with one scale per ``block_size`` weights along
        the input features; this program stays float. See docs/llm.md for the graphs.

        Args:
            bits: 4 or 8.
            block_size: 16, 32, 64, 128 or 256.
            target: ``"onnxruntime"`` (com.microsoft ``MatMulNBits``, ``GatherBlockQuantized``)
                or ``"portable"`` (``DequantizeLinear`` then the float op: blocked from opset 21,
                int8 with one scale per output feature below; int4 needs opset 21).
            accuracy_level: ``MatMulNBits``' lowest precision for the activations (0 unset,
                1 fp32, 2 fp16, 3 bf16, 4 int8: fastest on CPU); onnxruntime target only.
            symmetric: signed integers without zero points; False adds one per block.
            embedding: also quantize the token embedding table.
            lm_head: also quantize output projections (a weight product that is a graph output).
            algorithm: a weight quantizer registered with
                :func:`dynexport.quantize.register_weight_quantizer` (``"rtn"``: round to nearest).

        Returns:
            The quantized program. Its ``verify()`` checks the graph against the same graph with
            the dequantized weights and reports the accuracy cost against the float model.

        Raises:
            ValueError, TypeError: a bad argument, a form the model's opset cannot express, or
                no weight to quantize.
        """
        config = WeightQuantization(
            bits=bits, block_size=block_size, target=target, accuracy_level=accuracy_level,
            symmetric=symmetric, embedding=embedding, lm_head=lm_head, algorithm=algorithm,
        )
        files.require_weights(self.model, "quantize the weights")
        model = self.model.clone()
        quantize_model(model, config)
        return self.with_model(model)

    def with_model(self, model: ir.Model, *, session_options: Any = None) -> ONNXProgram:
        """A program around ``model`` that is called, checked and verified as this one is (same
        exported program, input checks and output structure); for a transformed copy of
        :attr:`model` that keeps its inputs and outputs. ``session_options`` (an
        ``onnxruntime.SessionOptions``) builds its session now, with those options."""
        program = copy.copy(self)
        program.model = model
        program.verification = None
        program.buffers = {}
        program._changed()
        if session_options is not None:
            program._session = runtime.inference_session(program.model_proto.SerializeToString(), session_options)
        return program

    # -- files ------------------------------------------------------------------------------

    def save(
        self,
        destination: str | os.PathLike | IO[bytes],
        *,
        external_data: bool | str | None = None,
        include_initializers: bool = True,
        keep_initializers_as_inputs: bool = False,
        progress: files.ProgressCallback | None = None,
    ) -> None:
        """Write the model to a path or a binary file object.

        Args:
            destination: a path (written through temporary files and renames: never a partial
                file) or a binary file object.
            external_data: store the initializers in a separate file next to the model: True
                (named ``<model file>.data``), a file name relative to the model's directory,
                False, or None to decide by size (above ``EXTERNAL_DATA_THRESHOLD`` bytes, in
                :mod:`dynexport.files`). Tensors are streamed to that file one at a time;
                tensors under ``EXTERNAL_DATA_MIN_TENSOR_BYTES`` stay in the model file.
            include_initializers: False leaves the initializers out of the file altogether.
            keep_initializers_as_inputs: the file lists the initializers among the graph's inputs
                too (after the model's own), as torch.onnx's option does; the program is unchanged.
            progress: called as ``progress(bytes_written, total_bytes)`` while writing weights.
        """
        files.save_model(
            self.model, destination, external_data=external_data,
            include_initializers=include_initializers, keep_initializers_as_inputs=keep_initializers_as_inputs,
            progress=progress,
        )

    # -- running ----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model in onnxruntime on torch inputs and return torch tensors.

        Arguments follow the same conventions as at export. The outputs have the model's own
        structure. transformers caches (``DynamicCache``, ``StaticCache``,
        ``EncoderDecoderCache``) are taken and returned as cache objects; a returned cache is a
        new object (an input cache is not updated in place).

        Raises:
            ValueError: an input lies outside what the export proved the graph valid for (see
                :meth:`input_feeds`).
        """
        if self._session is None:
            self._session = runtime.inference_session(self.model_proto.SerializeToString())
        feeds = self.input_feeds(*args, **kwargs)
        feeds.update({name: runtime.to_numpy(value) for name, value in self.buffers.items()})
        outputs = runtime.run_session(self._session, feeds, self.model.graph.outputs)
        if self.buffer_updates:
            by_name = dict(zip((v.name for v in self.model.graph.outputs), outputs))
            for buffer, output in self.buffer_updates.items():
                self.buffers[buffer] = by_name[output].clone()
        return self.output_structure(outputs)

    def initialize_inference_session(self, initializer: Callable[[bytes], Any] | None = None) -> None:
        """Make the onnxruntime session that calls run (torch.onnx's method); ``initializer``
        makes it from the serialized model (``lambda model: ort.InferenceSession(model,
        providers=[...])``). Calls make one when none is made."""
        model = self.model_proto.SerializeToString()
        self._session = runtime.inference_session(model) if initializer is None else initializer(model)

    def release(self) -> None:
        """Drop the onnxruntime session and the memory it holds; the next call makes another."""
        self._session = None

    def call_reference(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model in onnx's reference evaluator (``onnx.reference``) instead of
        onnxruntime: slow, for checking a runtime's result. Arguments and results as for
        :meth:`__call__`."""
        from onnx.reference import ReferenceEvaluator

        feeds = self.input_feeds(*args, **kwargs)
        feeds.update({name: runtime.to_numpy(value) for name, value in self.buffers.items()})
        files.require_weights(self.model, "run the reference evaluator")
        results = ReferenceEvaluator(self.model_proto).run(None, feeds)
        return self.output_structure([runtime.from_numpy(result) for result in results])

    def compute_values(
        self, value_names: Sequence[str], args: tuple = (), kwargs: Mapping[str, Any] | None = None
    ) -> list[torch.Tensor]:
        """The values of the graph named ``value_names`` (node outputs, inputs, initializers) on
        the call ``(args, kwargs)``, computed by onnxruntime (torch.onnx's method).

        Raises:
            ValueError: a name that is no value of the main graph.
        """
        graph = self.model.graph
        values = values_by_name(graph)
        unknown = [name for name in value_names if name not in values]
        if unknown:
            raise ValueError(f"compute_values: {unknown} name no value of the graph; its values include {sorted(values)[:10]}")
        extra = [values[name] for name in dict.fromkeys(value_names) if not values[name].is_graph_output()]
        graph.outputs.extend(extra)
        try:
            files.require_weights(self.model, "compute values")
            model = ir.serde.serialize_model(self.model).SerializeToString()
            outputs = list(graph.outputs)
        finally:
            del graph.outputs[len(graph.outputs) - len(extra):]
        feeds = self.input_feeds(*args, **dict(kwargs or {}))
        feeds.update({name: runtime.to_numpy(value) for name, value in self.buffers.items()})
        results = runtime.run_session(runtime.inference_session(model), feeds, outputs)
        by_name = {value.name: result for value, result in zip(outputs, results)}
        return [by_name[name] for name in value_names]

    @functools.cached_property
    def buffer_updates(self) -> dict[str, str]:
        """``{buffer: output}``: the buffers a model exported with ``TrainingMode.TRAINING``
        updates (batch norm's running statistics), each also a graph input, and the outputs
        holding their new values."""
        return json.loads(self.model.metadata_props.get(BUFFER_UPDATES_KEY, "{}"))

    def verify(
        self,
        *args: Any,
        model: Any = None,
        kwargs: Mapping[str, Any] | None = None,
        resized: Any = None,
        compare_intermediates: bool = False,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> VerificationReport:
        """Run PyTorch and onnxruntime on the same inputs and compare every output.

        See :func:`dynexport.verification.verify_program`; the report is also kept in
        ``self.verification``. A program with quantized weights is checked against its graph
        with the dequantized weights instead, and ``model`` (the float model) gives the
        report's ``accuracy`` (:func:`dynexport.quantize.verify_quantized`).
        """
        quantized = quantization_of(self.model) is not None
        if quantized and compare_intermediates:
            raise ValueError(
                "compare_intermediates compares with PyTorch's float values, which quantized weights change; "
                "verify the float program instead"
            )
        with caches_flattened():  # each run gets its own copy of a transformers cache, which eager updates
            if quantized:
                self.verification = verify_quantized(self, args, kwargs, model=model, resized=resized, rtol=rtol, atol=atol)
            else:
                self.verification = verify_program(
                    self, args, kwargs, model=model, resized=resized,
                    compare_intermediates=compare_intermediates, rtol=rtol, atol=atol,
                )
        return self.verification

    def input_feeds(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The inputs of a call as onnxruntime takes them: numpy arrays by graph input name
        (arguments as for :meth:`__call__`). For running the model in another runtime.

        Raises:
            ValueError: a size lies outside what the export proved (a static size, a ``Dim``'s
                range, an equality between inputs' dims, a derived dim such as ``past + seq``),
                or an argument the graph holds as a constant (a Python number) has another
                value than at export. The message names the input, the dim and what is allowed.
        """
        args, kwargs = split_legacy_args(args, kwargs)
        with caches_flattened():  # a transformers cache among the inputs
            if self.exported_program is None:
                values = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            else:
                leaves, _ = flatten_call(self.exported_program, args, kwargs)
                specs = user_input_specs(self.exported_program)
                self.input_guards.check_baked(leaves, specs)
                values = [leaf for leaf, spec in zip(leaves, specs) if is_graph_input(spec)]
                self.input_guards.check(values)
        return runtime.feeds(self.model.graph, values)

    def output_structure(self, outputs: list[Any]) -> Any:
        """The graph's outputs (torch tensors, in order) in the structure the model returns
        (transformers caches included)."""
        if self.exported_program is None:
            return outputs[0] if len(outputs) == 1 else outputs
        with caches_flattened():
            return self._output_layout.unflatten(outputs)

    @functools.cached_property
    def _output_layout(self) -> OutputLayout:
        return OutputLayout.of(self.exported_program)
