"""Graph quality: dynexport vs torch.onnx.export, side by side, in one process.

    python benchmarks/graph_quality.py [--rounds 30] [--models mlp,resnet18,...]
        [--groups examples,conv,realistic,zoo] [--statistic min]
        [--exporters dynexport,dynexport_ort,dynamo,dynamo_ortopt,torchscript] [--image-size 224]
        [--dims declared|axes]

The paths (``--exporters``, default ``dynexport,dynamo``): dynexport (portable, the default),
``dynexport_ort`` (``target="onnxruntime"``), ``dynamo`` (``torch.onnx.export(dynamo=True)``),
``dynamo_ortopt`` (torch.onnx's graph through ``onnxruntime.transformers.optimizer``, the path
users take today for onnxruntime's contrib fusions) and ``torchscript`` (the TorchScript
exporter).

The suite, in four groups (``--groups``, default all): ``examples``,
``benchmarks/export_speed.py``'s (the examples, tiny transformers encoders and decoders);
``conv``, convolutional and recurrent models (torchvision's resnet18, mobilenet_v3_small and
deeplabv3_mobilenet_v3_large at a static size, transformers' MobileNetV2 at a dynamic size and,
with TensorFlow padding, a static one, where torchvision loads (tests/torchvision_ops.py); small
blocks: GroupNorm + InstanceNorm, gather/index_select/masked ops, a depthwise-separable CNN,
pixel_shuffle, a bidirectional LSTM); ``realistic``, the realistic sizes of the onnxruntime
target's goal (BERT-base at sequence 128, ViT-B/16 and Whisper-tiny's encoder, random weights;
ResNet-50, MobileNetV2 and EfficientNet-B0 at 224 px); ``zoo``, the timm and torchvision families of
tests/models/test_zoo.py (40 small models with random weights, at their example sizes with the
tests' dynamic dims; torchvision's are named ``tv_<name>``). The dims are declared as the suite's
``Dim``s with their ranges, or with ``--dims axes`` as torch.onnx's ``dynamic_axes`` of the same
names, for every exporter (the TorchScript exporter always takes ``dynamic_axes``). Per model and path it prints the main graph's node
count, the initializer bytes, the file size and the onnxruntime latency on the example inputs
(CPU provider, one thread; the sessions run in turn, ``--rounds`` times, and the median of each
is reported, or with ``--statistic min`` the fastest run, steadier where other processes load
the machine; the turns make the load drift over all of them alike; ``--session-nodes`` also
prints the node count of the graph onnxruntime makes of each at session creation), then the ratios
dynexport/torch.onnx and dynexport_ort/dynamo_ortopt, their geometric means, and a flag on every
row where ours has more nodes or is slower by more than ``--tolerance``. Latency is noisy on a
shared machine: re-measure a flagged row (``--models``) before acting on it; nothing here is a
test threshold.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import onnx
import onnxruntime as ort
import torch

import dynexport

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_speed import Case, suite  # noqa: E402  (the same models, defined once)

EXPORTERS = ("dynexport", "dynexport_ort", "dynamo", "dynamo_ortopt", "torchscript")
GROUPS = ("examples", "conv", "realistic", "zoo")
Dim = torch.export.Dim


# -- convolutional and recurrent models -------------------------------------------------------


class NormBlock(torch.nn.Module):
    """Conv + GroupNorm + ReLU, Conv + InstanceNorm (affine) + ReLU."""

    def __init__(self):
        super().__init__()
        self.conv1, self.group = torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.GroupNorm(4, 16)
        self.conv2, self.instance = torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.InstanceNorm2d(16, affine=True)

    def forward(self, x):
        x = torch.relu(self.group(self.conv1(x)))
        return torch.relu(self.instance(self.conv2(x)))


class GatherBlock(torch.nn.Module):
    """Embedding, index_select of fixed rows, gather along the last dim, masked_fill."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(32, 16)
        self.register_buffer("rows", torch.tensor([0, 2, 5, 7]))

    def forward(self, tokens, x, index, mask):
        picked = x.index_select(1, self.rows)
        gathered = torch.gather(x, -1, index)
        return self.table(tokens).sum(1) + picked.sum(1, keepdim=True), gathered.masked_fill(mask, 0.0) * 2


class DepthwiseCNN(torch.nn.Module):
    """A stem and two depthwise-separable stages (BatchNorm, ReLU6), global mean, a classifier."""

    def __init__(self):
        super().__init__()
        nn = torch.nn

        def separable(c_in, c_out, stride):
            return nn.Sequential(
                nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False), nn.BatchNorm2d(c_in), nn.ReLU6(),
                nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            )

        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(separable(16, 32, 1), separable(32, 64, 2))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean((2, 3)))


class PixelShuffleBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 12, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(48, 8, 1)

    def forward(self, x):
        x = torch.nn.functional.pixel_shuffle(torch.relu(self.conv1(x)), 2)
        return self.conv3(torch.nn.functional.pixel_unshuffle(torch.relu(self.conv2(x)), 2))


class BidirectionalLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(16, 32, num_layers=2, bidirectional=True, batch_first=True)
        self.head = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def _image_dims(low: int = 8) -> tuple[dict[int, Any]]:
    return ({0: Dim("batch"), 2: Dim("height", min=low, max=1024), 3: Dim("width", min=low, max=1024)},)


def _torchvision() -> Any:
    """torchvision, with its C++ ops stood in for by the tests' Python kernels (our CPU torch has
    no build of them); None where that is not possible."""
    try:
        from tests.torchvision_ops import load_torchvision

        load_torchvision()
        import torchvision
    except Exception:  # no stand-ins yet, or a torchvision they do not fit: the suite goes without
        return None
    return torchvision


def conv_suite(image_size: int) -> dict[str, Callable[[], Case]]:
    """The convolutional and recurrent models (torchvision's and transformers' MobileNetV2 only
    where torchvision loads)."""

    def case(build: Callable[[], tuple]) -> Callable[[], Case]:
        def make() -> Case:
            torch.manual_seed(0)
            model, args, dynamic_shapes = build()
            return Case(model.eval(), args, {}, dynamic_shapes)

        return make

    batch = Dim("batch")
    models = {
        "norm_block": case(lambda: (NormBlock(), (torch.randn(2, 8, 64, 64),), _image_dims())),
        "gather_block": case(lambda: (
            GatherBlock(),
            (torch.randint(0, 32, (2, 5)), torch.randn(2, 12), torch.randint(0, 12, (2, 12)), torch.rand(2, 12) > 0.5),
            ({0: batch, 1: Dim("seq")}, {0: batch}, {0: batch}, {0: batch}),
        )),
        "depthwise_cnn": case(lambda: (DepthwiseCNN(), (torch.randn(2, 3, image_size, image_size),), _image_dims())),
        "pixel_shuffle": case(lambda: (
            PixelShuffleBlock(), (torch.randn(2, 3, 64, 64),),
            ({0: batch, 2: 2 * Dim("half_height", min=4, max=512), 3: 2 * Dim("half_width", min=4, max=512)},),
        )),
        "bilstm": case(lambda: (BidirectionalLSTM(), (torch.randn(2, 32, 16),), ({0: batch, 1: Dim("steps")},))),
    }
    torchvision = _torchvision()
    if torchvision is None:
        return models
    image = (torch.randn(1, 3, image_size, image_size),)
    models["resnet18"] = case(lambda: (torchvision.models.resnet18(), image, None))
    models["mobilenet_v3_small"] = case(lambda: (torchvision.models.mobilenet_v3_small(), image, None))
    models["deeplabv3_mobilenet"] = case(lambda: (
        torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None), image, None
    ))

    def hf_mobilenet_v2(tf_padding: bool) -> tuple:
        import transformers

        config = transformers.MobileNetV2Config(num_channels=3, image_size=image_size, tf_padding=tf_padding)
        # TensorFlow padding reads sizes as Python ints: that model exports at a static size only.
        return transformers.MobileNetV2Model(config), image, None if tf_padding else (_image_dims(33)[0],)

    models["hf_mobilenet_v2"] = case(lambda: hf_mobilenet_v2(False))
    models["hf_mobilenet_v2_tf_pad"] = case(lambda: hf_mobilenet_v2(True))
    return models


def realistic_suite() -> dict[str, Callable[[], Case]]:
    """The models of the onnxruntime target's goal at their real sizes, random weights: BERT-base
    (sequence 128), ViT-B/16 (224 px), Whisper-tiny's encoder (30 s of audio), and torchvision's
    ResNet-50, MobileNetV2 and EfficientNet-B0 at 224 px (where torchvision loads)."""

    def case(build: Callable[[], tuple]) -> Callable[[], Case]:
        def make() -> Case:
            torch.manual_seed(0)
            model, args, kwargs, dynamic_shapes = build()
            return Case(model.eval(), args, kwargs, dynamic_shapes)

        return make

    def bert() -> tuple:
        import transformers

        model = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False)
        text = {"input_ids": torch.randint(0, 30000, (1, 128)), "attention_mask": torch.ones(1, 128, dtype=torch.long)}
        dims = {name: {0: Dim("batch"), 1: Dim("sequence", max=512)} for name in text}
        return model, (), text, dims

    def vit() -> tuple:
        import transformers

        model = transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False)
        return model, (), {"pixel_values": torch.randn(1, 3, 224, 224)}, {"pixel_values": {0: Dim("batch")}}

    def whisper_encoder() -> tuple:
        import transformers

        config = transformers.WhisperConfig(
            d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80,
        )
        encoder = transformers.WhisperModel(config).get_encoder()
        return encoder, (), {"input_features": torch.randn(1, 80, 3000)}, {"input_features": {0: Dim("batch")}}

    models = {"bert_base": case(bert), "vit_b16": case(vit), "whisper_tiny_encoder": case(whisper_encoder)}
    torchvision = _torchvision()
    if torchvision is not None:
        image = (torch.randn(1, 3, 224, 224),)
        for name in ("resnet50", "mobilenet_v2", "efficientnet_b0"):
            # tv_: the zoo has timm's efficientnet_b0
            models[f"tv_{name}"] = case(lambda name=name: (getattr(torchvision.models, name)(), image, {}, None))
    return models


def zoo_suite() -> dict[str, Callable[[], Case]]:
    """The wider zoo of the model tests (tests/models/test_zoo.py): timm's families and the rest of
    torchvision, small with random weights and calibrated BatchNorm statistics, at their example
    size with the dims the tests declare (where torchvision and timm load)."""
    torchvision = _torchvision()
    if torchvision is None:
        return {}
    import timm

    from tests.models.test_torchvision import calibrated
    from tests.models.test_zoo import SLOW_TIMM, SLOW_TORCHVISION, TIMM, TORCHVISION, dynamic_shapes

    def case(family: Any, library: Any) -> Callable[[], Case]:
        def make() -> Case:
            torch.manual_seed(0)
            model = calibrated(family.build(library), *family.tensors(4, family.example))
            return Case(model, family.tensors(2, family.example), {}, dynamic_shapes(family))

        return make

    families = [(f, timm) for f in TIMM + SLOW_TIMM] + [(f, torchvision) for f in TORCHVISION + SLOW_TORCHVISION]
    return {f"{'tv_' if library is torchvision else ''}{f.name}": case(f, library) for f, library in families}


# onnxruntime.transformers.optimizer's model type, heads and hidden size for the transformers of
# the suite; any other model goes through it as "bert" with both detected.
_ORT_OPTIMIZER_SHAPES = {"bert_base": ("bert", 12, 768), "vit_b16": ("vit", 12, 768), "whisper_tiny_encoder": ("bart", 6, 384)}


# -- exporting and measuring ------------------------------------------------------------------


def _dim_options(case: Case, dims: str) -> dict[str, Any]:
    """The case's dynamic dims as the export call declares them: the suite's ``Dim``s with their
    ranges (``declared``), or torch.onnx's ``dynamic_axes`` of the same names (``axes``: no
    ranges, the form torch.onnx's tutorials use)."""
    if dims == "declared":
        return {"dynamic_shapes": case.dynamic_shapes}
    names, dynamic_axes = _names_and_axes(case)
    return {"input_names": names, "dynamic_axes": dynamic_axes}


def _names_and_axes(case: Case) -> tuple[list[str], dict[str, dict[int, str]]]:
    names = [f"input_{i}" for i in range(len(case.args))] + list(case.kwargs)
    specs = list(case.dynamic_shapes.values()) if isinstance(case.dynamic_shapes, dict) else list(case.dynamic_shapes or ())
    dynamic_axes = {
        name: {axis: str(getattr(dim, "__name__", f"dim{axis}")) for axis, dim in spec.items()}
        for name, spec in zip(names, specs)
        if spec
    }
    return names, dynamic_axes


def _export_dynexport(case: Case, path: str, dims: str) -> None:
    dynexport.export(case.model, case.args, path, kwargs=case.kwargs, **_dim_options(case, dims))


def _export_dynexport_ort(case: Case, path: str, dims: str) -> None:
    dynexport.export(case.model, case.args, path, kwargs=case.kwargs, target="onnxruntime", **_dim_options(case, dims))


def _export_dynamo(case: Case, path: str, dims: str) -> None:
    torch.onnx.export(case.model, case.args, path, kwargs=case.kwargs, dynamo=True, verbose=False, **_dim_options(case, dims))


def _export_dynamo_ort_optimized(case: Case, path: str, dims: str, name: str, exported: str | None) -> None:
    """torch.onnx's graph (``exported``, when already written) through onnxruntime's transformers
    optimizer: how users get its contrib fusions today."""
    from onnxruntime.transformers.optimizer import optimize_model

    if exported is None:
        _export_dynamo(case, path, dims)
        exported = path
    model_type, heads, hidden = _ORT_OPTIMIZER_SHAPES.get(name, ("bert", 0, 0))
    optimized = optimize_model(exported, model_type=model_type, num_heads=heads, hidden_size=hidden, use_gpu=False)
    for written in os.listdir(os.path.dirname(path)):
        os.remove(os.path.join(os.path.dirname(path), written))
    optimized.save_model_to_file(path, use_external_data_format=False)


def _export_torchscript(case: Case, path: str, dims: str) -> None:
    """Always with ``dynamic_axes``, the TorchScript exporter's only form."""
    names, dynamic_axes = _names_and_axes(case)
    # The legacy convention: a trailing dict in args holds the keyword arguments.
    args = (*case.args, case.kwargs) if case.kwargs else case.args
    torch.onnx.export(
        case.model, args, path, dynamo=False, input_names=names, dynamic_axes=dynamic_axes, opset_version=20
    )


_EXPORT: dict[str, Callable[..., None]] = {
    "dynexport": _export_dynexport,
    "dynexport_ort": _export_dynexport_ort,
    "dynamo": _export_dynamo,
    "torchscript": _export_torchscript,
}


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Silence stdout and stderr at the file-descriptor level: the TorchScript exporter prints
    whole graphs from C++ when it fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def _session(path: str, inputs: list[torch.Tensor], optimized_path: str | None = None) -> Callable[[], Any]:
    """A run of ``path`` on ``inputs``; with ``optimized_path``, the graph onnxruntime made of it
    (after its own fusions and layout changes) is written there."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if optimized_path is not None:
        options.optimized_model_filepath = optimized_path
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), inputs)}
    return lambda: session.run(None, feeds)


def _interleaved_latencies(
    runs: dict[str, Callable[[], Any]], rounds: int, statistic: Callable[[list[float]], float] = statistics.median
) -> dict[str, float]:
    """``statistic`` (the median, or the minimum on a loaded machine) of the seconds per run of
    each session, the sessions taking turns every round."""
    for run in runs.values():
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistic(values) for name, values in times.items()}


def _initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def measure(
    name: str, factory: Callable[[], Case], exporters: list[str], rounds: int, workdir: str,
    statistic: Callable[[list[float]], float] = statistics.median, session_nodes: bool = False,
    dims: str = "declared",
) -> dict[str, Any]:
    case = factory()
    inputs = [*case.args, *case.kwargs.values()]
    results: dict[str, Any] = {}
    runs = {}
    for exporter in exporters:
        directory = os.path.join(workdir, f"{name}.{exporter}")
        os.makedirs(directory)
        path = os.path.join(directory, "model.onnx")
        try:
            with warnings.catch_warnings(), _silenced():
                warnings.simplefilter("ignore")
                if exporter == "dynamo_ortopt":
                    exported = os.path.join(workdir, f"{name}.dynamo", "model.onnx")
                    _export_dynamo_ort_optimized(case, path, dims, name, exported if os.path.exists(exported) else None)
                else:
                    _EXPORT[exporter](case, path, dims)
            proto = onnx.load(path)
            results[exporter] = {
                "nodes": len(proto.graph.node),
                "bytes": _initializer_bytes(proto),
                "file": sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)),
            }
            optimized = os.path.join(workdir, f"{name}.{exporter}.session.onnx") if session_nodes else None
            runs[exporter] = _session(path, inputs, optimized)
            if optimized is not None:
                results[exporter]["session_nodes"] = len(onnx.load(optimized, load_external_data=False).graph.node)
        except Exception as error:  # a failure is a result: print it and go on with the suite
            results[exporter] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:70]}"}
    for exporter, latency in _interleaved_latencies(runs, rounds, statistic).items():
        results[exporter]["latency"] = latency
    return results


def _cell(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"{'failed':>30}"
    return f"{result['nodes']:>6} {result['bytes'] / 1024:>8.1f}K {result['file'] / 1024:>8.1f}K {result['latency'] * 1e3:>7.3f}ms"


# (ours, theirs): each pair whose ratios are printed and flagged when both were measured.
_COMPARED = (("dynexport", "dynamo"), ("dynexport", "torchscript"), ("dynexport_ort", "dynamo_ortopt"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved timed runs per session")
    parser.add_argument("--models", help="comma-separated subset of the suite")
    parser.add_argument(
        "--groups", default=",".join(GROUPS), help="comma-separated, any of: " + ", ".join(GROUPS) + " (the default: all)"
    )
    parser.add_argument(
        "--exporters", default="dynexport,dynamo", help="comma-separated, any of: " + ", ".join(EXPORTERS)
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--session-nodes", action="store_true",
        help="also print the node count of the graph onnxruntime makes of each (equal graphs: equal speed, whatever "
        "the noise says)",
    )
    parser.add_argument(
        "--dims", choices=("declared", "axes"), default="declared",
        help="the dynamic dims as the suite's Dims with their ranges, or as torch.onnx's dynamic_axes of the same "
        "names (no ranges: the form torch.onnx's tutorials use), for every exporter",
    )
    parser.add_argument("--tolerance", type=float, default=0.05, help="latency ratio above 1 + this is flagged")
    parser.add_argument(
        "--statistic", choices=("median", "min"), default="median",
        help="of each session's timed runs; the minimum is steadier on a machine other processes load",
    )
    options = parser.parse_args(argv)
    statistic = {"median": statistics.median, "min": min}[options.statistic]
    torch.set_num_threads(1)
    groups = options.groups.split(",")
    if not set(groups) <= set(GROUPS):
        parser.error(f"--groups: any of {GROUPS}")
    factories = {
        "examples": suite, "conv": lambda: conv_suite(options.image_size), "realistic": realistic_suite, "zoo": zoo_suite,
    }
    models = {name: model for group in groups for name, model in factories[group]().items()}
    if options.models:
        unknown = set(options.models.split(",")) - set(models)
        if unknown:
            parser.error(f"unknown models {sorted(unknown)}; choose from {sorted(models)}")
        models = {name: models[name] for name in options.models.split(",")}
    exporters = options.exporters.split(",")
    if not set(exporters) <= set(EXPORTERS):
        parser.error(f"--exporters: any of {EXPORTERS}")
    pairs = [(ours, theirs) for ours, theirs in _COMPARED if ours in exporters and theirs in exporters]

    columns = f"{'nodes':>6} {'init':>9} {'file':>9} {'latency':>9}"
    print(f"{'model':<20} " + " | ".join(f"{e:^36}" for e in exporters) + " | nodes, latency: " + " ; ".join(
        f"{ours}/{theirs}" for ours, theirs in pairs
    ))
    print(f"{'':<20} " + " | ".join(f"{columns:>36}" for _ in exporters) + " |")
    ratios: dict[tuple[str, str, str], list[float]] = {(k, *pair): [] for k in ("nodes", "latency") for pair in pairs}
    failures, flagged = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for name, factory in models.items():
            r = measure(name, factory, exporters, options.rounds, workdir, statistic, options.session_nodes, options.dims)
            cells = " | ".join(f"{_cell(r[e]):>36}" for e in exporters)
            ratio_text, flags = [], []
            for ours, theirs in pairs:
                if "error" in r[ours] or "error" in r[theirs]:
                    ratio_text.append("-")
                    continue
                nodes, latency = (r[ours][k] / r[theirs][k] for k in ("nodes", "latency"))
                ratios["nodes", ours, theirs].append(nodes)
                ratios["latency", ours, theirs].append(latency)
                ratio_text.append(f"{nodes:.2f}, {latency:.2f}")
                flags += [f"nodes>{theirs}"] * (nodes > 1) + [f"latency>{theirs}"] * (latency > 1 + options.tolerance)
            flag = f"  <- {' '.join(flags)}" if flags else ""
            print(f"{name:<20} {cells} | {' ; '.join(ratio_text)}{flag}", flush=True)
            if options.session_nodes:
                counts = ", ".join(f"{e} {r[e]['session_nodes']}" for e in exporters if "session_nodes" in r[e])
                print(f"{'':<20} onnxruntime's session graph, nodes: {counts}", flush=True)
            flagged += [name] if flags else []
            failures += [f"{name} {e}: {r[e]['error']}" for e in exporters if "error" in r[e]]
    for (key, ours, theirs), values in ratios.items():
        if values:
            geomean = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"geometric mean {ours}/{theirs} {key}: {geomean:.3f} on {len(values)} models")
    print("flagged (re-measure with --models):", ",".join(flagged) or "none")
    for failure in failures:
        print("failed:", failure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
