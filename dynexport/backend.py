"""The ``torch.compile`` backend: every Dynamo subgraph becomes an ONNX model run by onnxruntime.

    compiled = torch.compile(model, backend="dynexport")
    compiled = torch.compile(model, backend=dynexport.backend(save_dir="onnx/", fallback="raise"))

A subgraph goes through the same stages as :func:`dynexport.export`: the Dynamo GraphModule is
captured with torch.export (the dims Dynamo made symbolic become ``Dim.AUTO``), then
decomposed, translated by the one table and optimized. The parameters and buffers that Dynamo
passes as graph inputs become initializers named by their path in the model; a weight that is
replaced or updated in place (its version counter moves) rebuilds the session. SymInt inputs that
are sizes of tensor inputs are read from those tensors inside the graph; other SymInts are int64
scalar inputs. Float attributes of the model (a BatchNorm's ``eps``), which Dynamo passes as 0-d
tensors under ``dynamic=True``, are constants of the session: another value builds another one.

Inputs are bound to the session by their memory (IO binding) and outputs come back to torch
through DLPack: no copies for contiguous tensors.
Inference only: a subgraph called while autograd records (grad enabled and an input or weight
requiring grad) runs eagerly, with one warning.

Threads: a compiled model may be called from several threads at once. A subgraph builds one
session per input signature under :func:`~dynexport.capture.exclusive_tracing` (threads that ask
for the same signature wait for the one build); built sessions are shared and only read
(onnxruntime runs one session from several threads). A frame that Dynamo compiles again to the
same graph, with the same weights, reuses its subgraph and sessions.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.source import AttrSource

from dynexport import runtime
from dynexport.api import export
from dynexport.call_convention import OutputLayout, is_user_output
from dynexport.capture import capture, exclusive_tracing
from dynexport.errors import ExportError
from dynexport.options import check_opset
from dynexport.passes.onnx.naming import unique_name
from dynexport.program import ONNXProgram

__all__ = ["BackendOptions", "CompiledSubgraph", "OnnxRuntimeBackend", "SubgraphNotExportable", "backend", "compile_graph"]

FALLBACKS = ("eager", "raise")

# Execution providers that read and write tensors in the memory of a torch device other than
# the CPU; on any other device, inputs and outputs go through the CPU.
_DEVICE_PROVIDERS = {"cuda": "CUDAExecutionProvider"}
_CPU = torch.device("cpu")


def backend(
    *,
    save_dir: str | os.PathLike | None = None,
    providers: Sequence[Any] | None = None,
    session_options: Any = None,
    opset_version: int | None = None,
    fallback: str = "eager",
) -> OnnxRuntimeBackend:
    """A ``torch.compile`` backend that runs each Dynamo subgraph as ONNX in onnxruntime.

    ``torch.compile(model, backend="dynexport")`` uses ``dynexport.backend()``'s defaults.

    Args:
        save_dir: write each subgraph's model there as ``<function>_<digest>.onnx``, where the
            digest covers the graph's code, its input types and the opset: a subgraph keeps its
            name from run to run. The directory is created when missing.
        providers: onnxruntime execution providers, as ``InferenceSession`` takes them (default
            ``["CPUExecutionProvider"]``).
        session_options: an ``onnxruntime.SessionOptions`` for every session.
        opset_version: ONNX opset, as for :func:`dynexport.export`.
        fallback: what happens to a subgraph that cannot be exported or loaded: ``"eager"`` runs
            it in PyTorch with a warning, ``"raise"`` raises the error (torch.compile reports it
            as ``BackendCompilerFailed``).

    Returns:
        The backend; its ``subgraphs`` lists the :class:`CompiledSubgraph` it has compiled.
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback={fallback!r} is not supported; use 'eager' or 'raise'")
    opset = check_opset(opset_version)
    if providers is not None and (isinstance(providers, str) or not isinstance(providers, Sequence)):
        raise TypeError(f"providers must be a list such as ['CPUExecutionProvider'], got {providers!r}")
    if session_options is not None:
        import onnxruntime as ort

        if not isinstance(session_options, ort.SessionOptions):
            raise TypeError(
                f"session_options must be an onnxruntime.SessionOptions, got {type(session_options).__name__}"
            )
    if save_dir is not None:
        save_dir = os.fspath(save_dir)
        if os.path.exists(save_dir) and not os.path.isdir(save_dir):
            raise NotADirectoryError(f"save_dir={save_dir!r} is a file; give a directory")
        os.makedirs(save_dir, exist_ok=True)
    options = BackendOptions(save_dir, tuple(providers or ("CPUExecutionProvider",)), session_options, opset, fallback)
    return OnnxRuntimeBackend(options)


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """The checked arguments of :func:`backend`."""

    save_dir: str | None
    providers: tuple[Any, ...]
    session_options: Any
    opset: int
    fallback: str


class OnnxRuntimeBackend:
    """What ``torch.compile`` calls: ``backend(graph_module, example_inputs)`` returns the
    function that runs that subgraph. Made by :func:`backend`."""

    def __init__(self, options: BackendOptions):
        self.options = options
        self.subgraphs: list[CompiledSubgraph] = []

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        subgraph = CompiledSubgraph(graph_module, list(example_inputs), self.options)
        # Dynamo recompiles a frame whenever a guard fails, also where the graph comes out the same
        # (guards on values the graph does not read; spuriously, when threads call the model): the
        # subgraph already compiled for it serves, its sessions need no new export.
        for compiled in self.subgraphs:
            if compiled.identity == subgraph.identity:
                return compiled
        self.subgraphs.append(subgraph)
        return subgraph


_default_backend: OnnxRuntimeBackend | None = None


def compile_graph(graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The backend registered as ``"dynexport"``: :func:`backend` with its defaults."""
    global _default_backend
    if _default_backend is None:
        _default_backend = backend()
    return _default_backend(graph_module, example_inputs)


class SubgraphNotExportable(ExportError):
    """A subgraph the ONNX pipeline cannot express, for a reason found around the translation."""


class CompiledSubgraph:
    """One Dynamo subgraph: its ONNX model and a session per input signature, or eager PyTorch.

    Attributes:
        name: ``<function>_<digest>``, also its file name in ``save_dir``.
        program: the :class:`~dynexport.ONNXProgram` of the latest session (None when eager).
        fallback_reason: why the subgraph runs eagerly, or None.
        sessions_built: how many times the subgraph was exported and loaded into onnxruntime.
    """

    def __init__(self, graph_module: torch.fx.GraphModule, example_inputs: list[Any], options: BackendOptions):
        self.graph_module = graph_module
        self.name = _stable_name(graph_module, options.opset)
        self.program: ONNXProgram | None = None
        self.fallback_reason: str | None = None
        self.sessions_built = 0
        self._options = options
        self._inputs = _SubgraphInputs.classify(graph_module, example_inputs)
        self._weights = [(i, example_inputs[i], example_inputs[i]._version) for i in self._inputs.weight_paths]
        self.identity = _Identity(self.name, self._inputs, _objects_read(graph_module, example_inputs, self._inputs))
        self._sessions: dict[tuple, _Session] = {}
        self._static_axes: list[tuple[int, ...]] = []
        self._autograd_warned = False

    def __call__(self, *args: Any) -> Any:
        if self.fallback_reason is None and torch.is_grad_enabled() and self._records_autograd(args):
            if not self._autograd_warned:
                self._autograd_warned = True
                warnings.warn(
                    f"dynexport: subgraph {self.name} runs eagerly in PyTorch because autograd is recording "
                    "(an input or parameter requires grad) and the ONNX model computes no gradients; call the "
                    "model under torch.no_grad() or torch.inference_mode() to run it in onnxruntime",
                    stacklevel=2,
                )
            return self.graph_module(*args)
        if self.fallback_reason is None:
            session = self._session_for(args)
            if session is not None:
                return session.run(args)
        return self.graph_module(*args)

    def __repr__(self) -> str:
        if self.fallback_reason is not None:
            return f"CompiledSubgraph({self.name}: eager, {self.fallback_reason})"
        return f"CompiledSubgraph({self.name}: onnxruntime, {self.sessions_built} session(s) built)"

    def _session_for(self, args: Sequence[Any]) -> _Session | None:
        """The session for ``args``'s signature, built when there is none (None: eager)."""
        if not self._weights_moved(args):
            session = self._sessions.get(self._signature(args))
            if session is not None:
                return session
        # Under the one lock every export and Dynamo compilation takes: a second thread asking for
        # the same signature finds the session the first built.
        with exclusive_tracing():
            if self._weights_changed(args):
                self._sessions = {}
            if self.fallback_reason is not None:
                return None
            return self._sessions.get(self._signature(args)) or self._build_or_fall_back(args)

    def _build_or_fall_back(self, args: Sequence[Any]) -> _Session | None:
        try:
            session = self._build(args)
        except Exception as error:  # whatever stops the export or the load, `fallback` decides
            if self._options.fallback == "raise":
                raise
            self.fallback_reason = f"{type(error).__name__}: {error}"
            warnings.warn(
                f"dynexport: subgraph {self.name} runs eagerly in PyTorch, it could not be exported to ONNX: "
                f"{self.fallback_reason}",
                stacklevel=3,
            )
            return None
        if not self._static_axes:
            self._static_axes = session.static_axes
        # A new dict, not an update: threads reading the old one without the lock see either.
        self._sessions = {**self._sessions, self._signature(args): session}
        return session

    def _build(self, args: Sequence[Any]) -> _Session:
        inputs, options = self._inputs, self._options
        if inputs.problem is not None:
            raise SubgraphNotExportable(inputs.problem)
        module = _SubgraphModule(_with_scalars_inlined(self.graph_module, inputs, args), inputs, args)
        example = tuple(_example_value(args[i]) for i in inputs.fed)
        # One entry: the dynamic shapes of forward's *fed.
        dynamic_shapes = (tuple(inputs.dynamic_shapes[i] for i in inputs.fed),)
        exported, _ = capture(module, example, {}, dynamic_shapes)
        written = [s.target for s in exported.graph_signature.output_specs if not is_user_output(s)]
        if written:
            raise SubgraphNotExportable(
                f"the subgraph updates {', '.join(map(str, written))} in place, which an ONNX model cannot do; "
                "write the update out of place (x = x + 1, not x += 1)"
            )
        program = export(exported, (), opset_version=options.opset, input_names=[inputs.names[i] for i in inputs.fed])
        path = None
        if options.save_dir is not None:
            path = os.path.join(options.save_dir, f"{self.name}.onnx")
            program.save(path)
        session = _Session(program, exported, inputs.fed, path, options)
        self.program = program
        self.sessions_built += 1
        return session

    def _records_autograd(self, args: tuple) -> bool:
        # Weights are graph inputs, unless Dynamo runs with inline_inbuilt_nn_modules=False.
        return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args) or any(
            p.requires_grad for p in self.graph_module.parameters()
        )

    def _weights_moved(self, args: tuple) -> bool:
        return any(
            args[index] is not weight or args[index]._version != version for index, weight, version in self._weights
        )

    def _weights_changed(self, args: tuple) -> bool:
        changed = False
        for k, (index, weight, version) in enumerate(self._weights):
            current = args[index]
            if current is not weight or current._version != version:
                self._weights[k] = (index, current, current._version)
                changed = True
        return changed

    def _signature(self, args: Sequence[Any]) -> tuple:
        """The dtype, rank, device and static sizes of each tensor the ONNX model takes: what a
        session is built for, with the model's float attributes. Sizes on the model's symbolic
        dims are left out."""
        tensors = tuple(
            (value.dtype, value.dim(), value.device, *(value.shape[axis] for axis in axes))
            if isinstance(value, torch.Tensor)
            else None
            for value, axes in zip((args[i] for i in self._inputs.fed), self._static_axes)
        )
        return tensors + tuple(args[i].item() for i in self._inputs.scalars)


@dataclasses.dataclass
class _SubgraphInputs:
    """How each placeholder of a Dynamo subgraph reaches the ONNX model.

    ``fed`` are the placeholders the model takes as inputs (tensors, and ints that are no tensor
    input's size); ``weight_paths`` the parameters and buffers, which become initializers, by
    their path in the user's model; ``sizes`` the ints read from a tensor input's (placeholder,
    axis); ``scalars`` the model's float attributes that Dynamo passes as 0-d tensors, whose values
    the session holds as constants. ``problem`` says why the subgraph cannot be exported at all.
    """

    names: list[str]
    dynamic_shapes: list[Any]
    fed: list[int] = dataclasses.field(default_factory=list)
    weight_paths: dict[int, str] = dataclasses.field(default_factory=dict)
    sizes: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    scalars: list[int] = dataclasses.field(default_factory=list)
    problem: str | None = None

    @classmethod
    def classify(cls, graph_module: torch.fx.GraphModule, example_inputs: list[Any]) -> _SubgraphInputs:
        placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        inputs = cls(_unique([_input_name(n) for n in placeholders]), [None] * len(placeholders))
        symbol_axes: dict[Any, tuple[int, int]] = {}
        symints: list[int] = []
        for i, (node, example) in enumerate(zip(placeholders, example_inputs)):
            if isinstance(example, torch.Tensor) and _is_weight(example):
                inputs.weight_paths[i] = _weight_path(node)
            elif _is_model_scalar(node):
                inputs.scalars.append(i)
            elif isinstance(example, torch.Tensor):
                inputs.fed.append(i)
                shape = node.meta.get("example_value", example).shape
                # AUTO, not DYNAMIC: Dynamo's symbols may since have been fixed by a guard (the
                # feature dim of a Linear's input), torch.export finds that out again.
                dynamic = {axis: torch.export.Dim.AUTO for axis, size in enumerate(shape) if _is_symbol(size)}
                inputs.dynamic_shapes[i] = dynamic or None
                for axis in dynamic:
                    symbol_axes.setdefault(shape[axis].node.expr, (i, axis))
            elif isinstance(example, torch.SymInt):
                symints.append(i)
            else:
                inputs.problem = (
                    f"input {node.name} is a {type(example).__name__}; the ONNX backend takes tensors and ints"
                )
        for i in symints:
            size_of = symbol_axes.get(example_inputs[i].node.expr)
            if size_of is not None:
                inputs.sizes[i] = size_of
            else:
                inputs.fed.append(i)
                inputs.dynamic_shapes[i] = torch.export.Dim.AUTO
        inputs.fed.sort()
        return inputs


@dataclasses.dataclass
class _Identity:
    """What makes two Dynamo subgraphs one ONNX model: the same code on the same input types (the
    name's digest), inputs read the same way, and the same weights and graph attributes."""

    name: str
    inputs: _SubgraphInputs
    objects: tuple[int, ...]


def _objects_read(graph_module: torch.fx.GraphModule, example_inputs: list[Any], inputs: _SubgraphInputs) -> tuple[int, ...]:
    """The ids of the weights and of the graph's attributes (constants, nested graphs). The
    subgraph holds all of them, so no other object takes one of these ids while it lives."""
    weights = [id(example_inputs[i]) for i in inputs.weight_paths]
    attributes = [
        id(graph_module.get_submodule(node.target) if node.op == "call_module" else _attribute(graph_module, node.target))
        for node in graph_module.graph.nodes
        if node.op in ("get_attr", "call_module")
    ]
    return (*weights, *attributes)


def _attribute(module: torch.nn.Module, path: str) -> Any:
    *parents, leaf = path.split(".")
    for part in parents:
        module = getattr(module, part)
    return getattr(module, leaf)


def _is_symbol(size: Any) -> bool:
    return isinstance(size, torch.SymInt) and not size.node.is_constant()


def _is_weight(tensor: torch.Tensor) -> bool:
    """Parameters and buffers of the compiled modules, which Dynamo passes as graph inputs and
    marks as static."""
    return isinstance(tensor, torch.nn.Parameter) or getattr(tensor, "_dynamo_static_input_type", None) is not None


def _is_model_scalar(node: torch.fx.Node) -> bool:
    """A float attribute of the model (``self.bn.eps``) that Dynamo passes as a 0-d tensor and
    reads with ``.item()``. Its guards (batch_norm checks ``eps < 0``) cannot be decided on a graph
    input, so each value gets its own session; a float argument of the function stays an input."""
    grapharg = node.meta.get("grapharg")
    return (
        grapharg is not None
        and grapharg.pass_arg_as_tensor
        and not grapharg.is_tensor
        and isinstance(getattr(grapharg, "source", None), AttrSource)
        and all(user.op == "call_method" and user.target == "item" for user in node.users)
    )


def _with_scalars_inlined(graph_module: torch.fx.GraphModule, inputs: _SubgraphInputs, args: Sequence[Any]) -> torch.fx.GraphModule:
    """A copy of the subgraph reading the model's float attributes as the constants of ``args``."""
    if not inputs.scalars:
        return graph_module
    inlined = torch.fx.GraphModule(graph_module, copy.deepcopy(graph_module.graph))
    placeholders = [n for n in inlined.graph.nodes if n.op == "placeholder"]
    for i in inputs.scalars:
        for read in list(placeholders[i].users):
            read.replace_all_uses_with(args[i].item())
            inlined.graph.erase_node(read)
    inlined.recompile()
    return inlined


def _source_keys(node: torch.fx.Node) -> list[str]:
    """The keys of the placeholder's Dynamo source:
    ``L['self']._modules['lin']._parameters['weight']`` -> ``['self', 'lin', 'weight']``."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:
        return []
    return re.findall(r"\[['\"]?([^'\"\]]+)['\"]?\]", source.name)


def _weight_path(node: torch.fx.Node) -> str:
    keys = _source_keys(node)[1:]
    if keys and all(k.isidentifier() or k.isdigit() for k in keys):
        return ".".join(keys)
    return node.name


def _input_name(node: torch.fx.Node) -> str:
    """``x`` for ``L['x']``, ``inputs_ids`` for ``L['inputs']['ids']``."""
    keys = _source_keys(node)
    return re.sub(r"\W", "_", "_".join(keys)) if keys else node.name


def _unique(names: list[str]) -> list[str]:
    seen: list[str] = []
    for name in names:
        seen.append(unique_name(name, seen))
    return seen


def _example_value(value: Any) -> Any:
    return value.node.hint if isinstance(value, torch.SymInt) else value


def _stable_name(graph_module: torch.fx.GraphModule, opset: int) -> str:
    """``<function>_<digest>``: the compiled function's name (the outermost frame of the graph's
    stack traces) and a digest of the graph's code, input types and opset."""
    digest = hashlib.sha256(f"{graph_module.code}\nopset {opset}".encode())
    function = "subgraph"
    for node in graph_module.graph.nodes:
        value = node.meta.get("example_value")
        if node.op == "placeholder" and isinstance(value, torch.Tensor):
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
        frame = re.search(r", in (\w+)", node.meta.get("stack_trace") or "")
        if frame is not None and function == "subgraph":
            function = frame.group(1)
    return f"{function}_{digest.hexdigest()[:12]}"


class _SubgraphModule(torch.nn.Module):
    """The Dynamo subgraph as torch.export captures it: the fed tensors and ints in, the weights
    as its own parameters and buffers (at their path in the user's model, which names the
    initializers), sizes read from the tensor inputs."""

    def __init__(self, graph_module: torch.fx.GraphModule, inputs: _SubgraphInputs, args: Sequence[Any]):
        super().__init__()
        self.graph_module = graph_module
        self._inputs = inputs
        self._weight_owners: dict[int, tuple[torch.nn.Module, str]] = {}
        for i, path in inputs.weight_paths.items():
            *parents, leaf = path.split(".")
            owner: torch.nn.Module = self
            for part in parents:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            if isinstance(args[i], torch.nn.Parameter):
                owner.register_parameter(leaf, args[i])
            else:
                owner.register_buffer(leaf, args[i])
            self._weight_owners[i] = (owner, leaf)

    def forward(self, *fed: Any) -> Any:
        args: list[Any] = [None] * len(self._inputs.names)
        for i, value in zip(self._inputs.fed, fed):
            args[i] = value
        for i, (owner, leaf) in self._weight_owners.items():
            args[i] = getattr(owner, leaf)
        for i, (source, axis) in self._inputs.sizes.items():
            args[i] = args[source].shape[axis]
        # Run node by node with each node's meta current, so that the exported nodes keep the
        # model's source lines (errors point at the user's code, not at Dynamo's generated code).
        with torch.fx.traceback.preserve_node_meta():
            return torch.fx.Interpreter(self.graph_module).run(*args)


class _Session:
    """An onnxruntime session of one exported subgraph, fed and read through IO binding."""

    def __init__(
        self,
        program: ONNXProgram,
        exported: torch.export.ExportedProgram,
        fed: list[int],
        path: str | None,
        options: BackendOptions,
    ):
        model = path if path is not None else program.model_proto.SerializeToString()
        self.session = runtime.inference_session(model, options.session_options, options.providers)
        graph = program.model.graph
        fed_inputs = runtime.fed_inputs(graph)
        self.static_axes = [tuple(axis for axis, d in enumerate(v.shape) if isinstance(d, int)) for v in fed_inputs]
        self._feeds = [(v.name, index, int(v.dtype)) for v, index in zip(fed_inputs, fed)]
        self._output_names = [v.name for v in graph.outputs]
        self._output_dtypes = [v.dtype for v in graph.outputs]
        self._outputs = OutputLayout.of(exported)
        providers = self.session.get_providers()
        self._devices = {device for device, provider in _DEVICE_PROVIDERS.items() if provider in providers}

    def run(self, args: Sequence[Any]) -> Any:
        binding = self.session.io_binding()
        device = _CPU
        bound = []  # the bound memory must outlive the run
        for name, index, element_type in self._feeds:
            value = args[index]
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)  # a symbolic int: an int64 scalar
            elif value.device.type != "cpu":
                device = value.device
                if device.type not in self._devices:
                    value = value.cpu()
            value = value.contiguous()
            bound.append(value)
            binding.bind_input(
                name, value.device.type, value.device.index or 0, element_type, value.shape, value.data_ptr()
            )
        run_device = device if device.type in self._devices else _CPU
        for name in self._output_names:
            binding.bind_output(name, run_device.type, run_device.index or 0)
        self.session.run_with_iobinding(binding)
        results = runtime.ort_values_to_torch(binding.get_outputs(), self._output_dtypes)
        if run_device != device:
            results = [r.to(device) for r in results]
        return self._outputs.unflatten(results, python_values=True)
