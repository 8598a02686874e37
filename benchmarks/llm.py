"""A LLaMA-shaped 135M decoder with explicit past keys and values, exported side by side.

    python benchmarks/llm.py [--layers 30] [--prefill 128] [--past 256,1024] [--rounds 20] [--opset 23]
                             [--graphs dynexport,dynexport_int4,...] [--accuracy-variants] [--quick]

The model is issue 18's: transformers' LlamaForCausalLM with 30 layers, hidden 576, 9 query and
3 key-value heads, intermediate 1536, vocabulary 49152, tied embeddings, random weights (seeded,
nothing downloaded); its past keys and values come in, and go out, as plain tensors. Graphs:

- ``dynexport``: ``dynexport.export`` (fp32, at ``--opset``, 23 by default: the fused decoder ops);
- ``dynexport_int4``: the same program with ``quantize_weights(bits=4, block_size=32,
  accuracy_level=4, embedding=True)`` (com.microsoft MatMulNBits, q|k|v and gate|up packed into
  one each, and GatherBlockQuantized: the form the model builder gives; export time includes the
  quantization);
- ``dynexport_int4_portable``: ``target="portable"`` (opset-21 blocked DequantizeLinear + MatMul;
  onnxruntime fuses the pair into MatMulNBits when it loads it);
- ``dynexport_torchao_int4``: a copy of the model quantized by torchao
  (``IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))``), exported by
  dynexport with torchao's own integers (``target="onnxruntime"``, accuracy level 4); skipped
  when torchao is not installed;
- ``torch_onnx_18``, ``torch_onnx_23``: ``torch.onnx.export(dynamo=True, opset_version=18 / 23)``;
- ``builder_fp32``, ``builder_int4``: onnxruntime-genai's model builder (``-p fp32|int4 -e cpu``,
  its defaults: int4 block 32, symmetric, accuracy level 4, the tied embedding and LM head in
  int4) from the same weights saved as a Hugging Face checkpoint folder with a small local
  tokenizer. Skipped, with a line saying so, when onnxruntime-genai is not installed. Its build
  time counts reading the checkpoint and writing its files; an exporter's export time counts
  from the model in memory to its files written (``program.save``, external data).

Per graph it prints the node count, the export time, the file size (model + external data), the
prefill latency (``--prefill`` new tokens, no past) and the decode latency (one new token) at
each past length, batch 1, 1 thread: the graphs' sessions run in turn, ``--rounds`` times, and
the median of each is reported, so that the machine's load drifts over all of them alike. Each
graph is fed by the names of its declared inputs (the builder's ``past_key_values.<i>.key`` /
``.value``; the exporters' ``past_key_values_<i>_<0|1>``), and its logits at the prefill point
are compared with dynexport's fp32 graph (the fp32 graphs agree up to float rounding). Then
dynexport's export time by phase, the ratios to ``dynexport``, issue 18's targets against the builder, the peak resident
memory of dynexport's export, fp32 and int4 (in child processes, against the weights' bytes), and the int4
graphs' accuracy cost against the fp32 one (:func:`dynexport.quantize.accuracy_cost`: next-token
top-1 agreement at every position of seeded prompts, max logit error); ``--accuracy-variants``
adds the cost of other quantizations (asymmetric, block 128, int8) of the same program.
``--quick`` runs a 2-layer model at small sizes in a minute, to check the script. Informational:
nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.torchvision_ops import load_torchvision_if_installed

load_torchvision_if_installed()  # transformers imports torchvision as it loads

import transformers

import dynexport
from dynexport.quantize import accuracy_cost, seeded_calls

Dim = torch.export.Dim
DYNEXPORT_GRAPHS = ("dynexport", "dynexport_int4", "dynexport_int4_portable")
TORCHAO_GRAPH = "dynexport_torchao_int4"
TORCH_ONNX_GRAPHS = {"torch_onnx_18": 18, "torch_onnx_23": 23}
BUILDER_GRAPHS = {"builder_fp32": "fp32", "builder_int4": "int4"}
GRAPHS = (*DYNEXPORT_GRAPHS, TORCHAO_GRAPH, *TORCH_ONNX_GRAPHS, *BUILDER_GRAPHS)
QUANTIZED = {
    "dynexport_int4": {"bits": 4, "block_size": 32, "accuracy_level": 4, "embedding": True},
    "dynexport_int4_portable": {"bits": 4, "block_size": 32, "target": "portable"},
}
ACCURACY_VARIANTS = [
    {"bits": 4, "block_size": 32, "symmetric": False},
    {"bits": 4, "block_size": 128},
    {"bits": 8, "block_size": 32},
]
# The graphs issue 18's targets compare: (dynexport's, the builder's).
TARGET_PAIRS = (("dynexport", "builder_fp32"), ("dynexport_int4", "builder_int4"))


class WithPlainCache(torch.nn.Module):
    """The decoder with its past keys and values as plain tensors, one (key, value) per layer."""

    def __init__(self, model: transformers.PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, past_key_values):
        cache = transformers.DynamicCache(past_key_values, config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        return out.logits, [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def llama_135m(layers: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True,
        rms_norm_eps=1e-5, use_cache=True, bos_token_id=1, eos_token_id=2,
    )
    with torch.no_grad():
        return transformers.LlamaForCausalLM(config).eval()


def cached_call(config, batch: int, past: int, seq: int, seed: int = 0) -> dict:
    """New tokens, a mask over past and new positions, random past keys and values."""
    generator = torch.Generator().manual_seed(seed)
    heads, head_size = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    past_key_values = [
        tuple(torch.randn(batch, heads, past, head_size, generator=generator) for _ in "kv")
        for _ in range(config.num_hidden_layers)
    ]
    return {
        "input_ids": torch.randint(0, config.vocab_size, (batch, seq), generator=generator),
        "attention_mask": torch.ones(batch, past + seq, dtype=torch.int64),
        "past_key_values": past_key_values,
    }


def dynamic_shapes(layers: int) -> dict:
    batch, past, seq = Dim("batch", max=64), Dim("past", min=0, max=2047), Dim("seq", max=2047)
    return {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},  # past + seq: torch.export derives it
        "past_key_values": [({0: batch, 2: past}, {0: batch, 2: past})] * layers,
    }


# -- exporting ---------------------------------------------------------------------------------


def export_dynexport(model, graphs: list[str], directory: str, opset: int) -> tuple[dict[str, dict], Any]:
    """dynexport's graphs (fp32 and its quantized forms) and its float program."""
    start = time.perf_counter()
    program = dynexport.export(
        WithPlainCache(model), (), kwargs=cached_call(model.config, 2, 8, 4),
        dynamic_shapes=dynamic_shapes(model.config.num_hidden_layers), opset_version=opset,
    )
    seconds = time.perf_counter() - start
    results = {}
    phases = [f"{name} {s:.1f} s" for name, s in program.timings.items()]
    if "dynexport" in graphs:
        results["dynexport"] = _saved(program, seconds, directory, "dynexport")
        phases.append(f"writing the files {results['dynexport']['write_s']:.1f} s")
    print("dynexport's export phases: " + ", ".join(phases))
    for name, options in QUANTIZED.items():
        if name in graphs:
            start = time.perf_counter()
            quantized = program.quantize_weights(**options)
            quantize_s = time.perf_counter() - start
            results[name] = _saved(quantized, seconds + quantize_s, directory, name)
            results[name]["quantize_s"] = quantize_s
    return results, program


def export_torchao(model, directory: str, opset: int) -> dict:
    """A copy of the model quantized by torchao (``IntxWeightOnlyConfig`` int4, groups of 32, its
    linear layers: the LM head, no longer tied, too), exported by dynexport with torchao's
    integers (MatMulNBits, accuracy level 4); the export time leaves torchao's quantization out."""
    import copy

    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    quantized = copy.deepcopy(model)
    quantize_(quantized, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    start = time.perf_counter()
    program = dynexport.export(
        WithPlainCache(quantized), (), kwargs=cached_call(model.config, 2, 8, 4),
        dynamic_shapes=dynamic_shapes(model.config.num_hidden_layers), opset_version=opset, target="onnxruntime",
        quantize_weights={"accuracy_level": 4},
    )
    result = _saved(program, time.perf_counter() - start, directory, TORCHAO_GRAPH)
    del result["program"]
    return result


def export_torch_onnx(model, opset: int, directory: str, name: str) -> dict:
    start = time.perf_counter()
    onnx_program = torch.onnx.export(
        WithPlainCache(model), (), kwargs=cached_call(model.config, 2, 8, 4),
        dynamic_shapes=dynamic_shapes(model.config.num_hidden_layers), dynamo=True, opset_version=opset,
        optimize=True, verbose=False,
    )
    result = _saved(onnx_program, time.perf_counter() - start, directory, name)
    del result["program"]  # only dynexport's programs are measured further
    return result


def _saved(program, seconds: float, directory: str, name: str) -> dict:
    """The program written to ``directory/name``; its export time counts the writing, as the
    builder's counts writing its files."""
    folder = os.path.join(directory, name)
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    start = time.perf_counter()
    program.save(path, external_data=True)  # both exporters' programs take this call
    write_s = time.perf_counter() - start
    return {"program": program, "path": path, "nodes": len(program.model.graph), "export_s": seconds + write_s,
            "write_s": write_s, "bytes": _folder_bytes(folder)}


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.startswith("model.onnx"))


def save_checkpoint(model, directory: str) -> str:
    """The model as a Hugging Face checkpoint folder, with a word-level tokenizer of the
    config's special tokens (the builder loads a tokenizer; nothing is downloaded)."""
    import tokenizers

    folder = os.path.join(directory, "checkpoint")
    model.save_pretrained(folder)
    vocabulary = {"<unk>": 0, "<s>": model.config.bos_token_id, "</s>": model.config.eos_token_id}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="<unk>"))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(folder)
    return folder


def build_with_builder(checkpoint: str, precision: str, directory: str, name: str) -> dict:
    """onnxruntime-genai's model builder run on ``checkpoint`` in a child process (its log and
    its memory stay there); the build time is measured inside it."""
    folder = os.path.join(directory, name)
    measured = _child("builder", checkpoint, precision, folder)
    path = os.path.join(folder, "model.onnx")
    nodes = len(onnx.load(path, load_external_data=False).graph.node)
    return {"path": path, "nodes": nodes, "export_s": measured["seconds"], "bytes": _folder_bytes(folder),
            "peak_rss": measured["peak_rss"]}


def _child(*arguments: str) -> dict:
    completed = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *arguments],
        check=False, capture_output=True, text=True,
    )
    if completed.returncode:
        raise RuntimeError(f"the child process {arguments} failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


# -- the child processes -----------------------------------------------------------------------


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak resident size of this process (VmHWM), where Linux allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _rss(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, in bytes. (``ru_maxrss`` would not
    do: Linux carries it over ``exec`` from the parent process the child was forked from.)"""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_export_memory(layers: int, opset: int, graph: str = "dynexport") -> dict:
    """Resident bytes after the imports, after building the model, and at the peak of
    ``dynexport.export`` (the peak reset once the model is built); ``dynexport_int4``: the export
    quantizes the weights as that graph's are (``quantize_weights=``, ``target="onnxruntime"``).
    The imports include those transformers defers to the first LLaMA built (its modeling code,
    about 77 MB resident), so that they do not count as the model's."""
    with torch.no_grad():
        transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1,
        ))
    gc.collect()
    imports = _rss("VmRSS")
    model = llama_135m(layers)
    gc.collect()
    with_model = _rss("VmRSS")
    reset = _reset_peak_rss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynexport.export(
            WithPlainCache(model), (), kwargs=cached_call(model.config, 2, 8, 4),
            dynamic_shapes=dynamic_shapes(layers), opset_version=opset,
            **({"quantize_weights": QUANTIZED[graph], "target": "onnxruntime"} if graph in QUANTIZED else {}),
        )
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"imports": imports, "with_model": with_model, "peak": _rss("VmHWM") if reset else None,
            "lifetime_peak": _rss("VmHWM"), "weights": weights}


def child_builder(checkpoint: str, precision: str, folder: str) -> dict:
    from onnxruntime_genai.models import builder

    cache = os.path.join(os.path.dirname(folder), "builder_cache")
    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        options = builder.parse_extra_options(None, checkpoint, folder, precision, "cpu", cache, [])
        builder.create_model(None, checkpoint, folder, precision, "cpu", cache, **options)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss": _rss("VmHWM")}


# -- running -----------------------------------------------------------------------------------


_CACHE_INPUT = re.compile(r"past_key_values[._](\d+)[._](key|value|0|1)$")


def feeds(session: ort.InferenceSession, call: dict) -> dict[str, np.ndarray]:
    """``call`` as the inputs ``session`` declares, by name: ``input_ids``, ``attention_mask``,
    ``position_ids`` (counted over the mask), and each layer's past key and value, named
    ``past_key_values.<i>.key`` / ``.value`` (the builder) or ``past_key_values_<i>_<0|1>``
    (flattened from the call)."""
    mask = call["attention_mask"]
    seq = call["input_ids"].shape[1]
    named = {
        "input_ids": call["input_ids"],
        "attention_mask": mask,
        "position_ids": ((mask.cumsum(-1) - 1).clamp(min=0))[:, -seq:],
    }
    result = {}
    for declared in session.get_inputs():
        match = _CACHE_INPUT.match(declared.name)
        if match:
            layer, part = int(match.group(1)), match.group(2)
            value = call["past_key_values"][layer][part in ("value", "1")]
        elif declared.name in named:
            value = named[declared.name]
        else:
            raise ValueError(f"no value for the graph input {declared.name!r} ({declared.type})")
        dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}[declared.type]
        result[declared.name] = value.numpy().astype(dtype)
    return result


def measure_latency(results: dict[str, dict], config, points: dict[str, dict], rounds: int) -> None:
    """Median milliseconds of each graph at each point (a named call), rounds interleaved; and
    each graph's largest logit difference from ``dynexport`` at the first point."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    sessions = {
        name: ort.InferenceSession(r["path"], options, providers=["CPUExecutionProvider"]) for name, r in results.items()
    }
    for index, (point, call) in enumerate(points.items()):
        inputs = {name: feeds(session, call) for name, session in sessions.items()}
        logits = {name: session.run(None, inputs[name])[0] for name, session in sessions.items()}  # and warm-up
        if index == 0 and "dynexport" in logits:
            for name in sessions:
                results[name]["logit_difference"] = float(np.abs(logits[name] - logits["dynexport"]).max())
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(rounds):
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(None, inputs[name])
                times[name].append((time.perf_counter() - start) * 1000)
        for name in sessions:
            results[name][point] = statistics.median(times[name])


# -- reporting ---------------------------------------------------------------------------------


def print_table(results: dict[str, dict], points: list[str]) -> None:
    print()
    print("| graph | nodes | export s | file MB | " + " | ".join(f"{p} ms" for p in points) + " | logits vs dynexport |")
    print("|---" * (5 + len(points)) + "|")
    for name, r in results.items():
        cells = [name, str(r["nodes"]), f"{r['export_s']:.1f}", f"{r['bytes'] / 1e6:.0f}"]
        cells += [f"{r[p]:.2f}" for p in points]
        cells.append(f"{r['logit_difference']:.1e}" if "logit_difference" in r else "")
        print("| " + " | ".join(cells) + " |")


def print_ratios(results: dict[str, dict], points: list[str]) -> None:
    if "dynexport" in results and len(results) > 1:
        base = results["dynexport"]
        print("\nratios to dynexport fp32 (time per point, file size, export time):")
        for name, r in results.items():
            if name != "dynexport":
                times = ", ".join(f"{p}: {r[p] / base[p]:.2f}x" for p in points)
                print(f"  {name}: {times}; file {r['bytes'] / base['bytes']:.2f}x; "
                      f"export {r['export_s'] / base['export_s']:.2f}x")
    longest = points[-1]
    for ours, builder in TARGET_PAIRS:
        if ours in results and builder in results:
            a, b = results[ours], results[builder]
            print(f"\n{ours} against {builder} (issue 18's targets: each ratio ≤ 1):")
            print(f"  {longest}: {a[longest]:.2f} / {b[longest]:.2f} ms = {a[longest] / b[longest]:.2f}x")
            print(f"  nodes: {a['nodes']} / {b['nodes']} = {a['nodes'] / b['nodes']:.2f}x")
            print(f"  export: {a['export_s']:.1f} / {b['export_s']:.1f} s = {a['export_s'] / b['export_s']:.2f}x")


def print_export_memory(memory: dict, builder_peaks: dict[str, int], graph: str = "dynexport") -> None:
    mb = lambda n: f"{n / 1e6:.0f} MB"
    weights = memory["weights"]
    print(f"\npeak resident memory of dynexport.export, {graph} (child process), weights {mb(weights)}:")
    print(f"  after the imports {mb(memory['imports'])}, with the model {mb(memory['with_model'])}")
    if memory["peak"] is None:
        print(f"  the peak cannot be reset here; the process's lifetime peak: {mb(memory['lifetime_peak'])}")
        return
    peak = memory["peak"]
    print(f"  peak during the export {mb(peak)}: model + export above the imports "
          f"{(peak - memory['imports']) / weights:.2f}x the weights (target ≤ 1.3x); "
          f"the export alone {(peak - memory['with_model']) / weights:.2f}x")
    for name, rss in builder_peaks.items():
        print(f"  {name}'s process, for comparison: lifetime peak {mb(rss)}")


def _touch_memory(nbytes: int) -> None:
    """Fill and free ``nbytes`` of memory before anything is timed. On a virtual machine the
    first touch of a guest page costs about 3 ms a MB (writing 300 MB of new files: 1.0 s
    before, 0.14 s after), and the files written first would pay it: which exporter that is
    should not decide its export time."""
    block = np.ones(nbytes, dtype=np.uint8)
    del block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--prefill", type=int, default=128, help="new tokens of the prefill point (no past)")
    parser.add_argument("--past", default="256,1024", help="comma-separated past lengths of the decode points")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--accuracy-variants", action="store_true", help="also the cost of other quantizations")
    parser.add_argument(
        "--opset", type=int, default=23,
        help="dynexport's opset (from 23: Attention, RMSNormalization, RotaryEmbedding; the portable int4 needs 21)",
    )
    parser.add_argument("--graphs", default=",".join(GRAPHS), help=f"comma-separated, of {GRAPHS}")
    parser.add_argument("--quick", action="store_true", help="2 layers, prefill 16, past 64, 3 rounds")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "builder":
            measured = child_builder(*rest)
        else:
            measured = child_export_memory(int(rest[0]), int(rest[1]), *rest[2:])
        print(json.dumps(measured))
        return
    if args.quick:
        args.layers, args.prefill, args.past, args.rounds = 2, 16, "64", 3
    graphs = [g for g in args.graphs.split(",") if g]
    unknown = sorted(set(graphs) - set(GRAPHS))
    if unknown:
        parser.error(f"unknown graphs {unknown}; choose from {GRAPHS}")
    pasts = [int(p) for p in args.past.split(",") if p]
    torch.set_num_threads(1)

    model = llama_135m(args.layers)
    params = sum(p.numel() for p in model.parameters())
    print(f"LLaMA-shaped decoder: {args.layers} layers, {params / 1e6:.1f}M parameters; torch {torch.__version__}, "
          f"onnxruntime {ort.__version__}, {os.cpu_count()} CPUs")
    if TORCHAO_GRAPH in graphs and importlib.util.find_spec("torchao") is None:
        print(f"torchao is not installed: {TORCHAO_GRAPH} is skipped")
        graphs.remove(TORCHAO_GRAPH)
    if importlib.util.find_spec("onnxruntime_genai") is None:
        print("onnxruntime-genai is not installed: the model builder's graphs are skipped")
        graphs = [g for g in graphs if g not in BUILDER_GRAPHS]
    else:
        import onnxruntime_genai

        print(f"onnxruntime-genai {onnxruntime_genai.__version__}: its model builder's graphs are built")
    _touch_memory(3 * params * 4)
    with tempfile.TemporaryDirectory() as directory:
        results, float_program = {}, None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if any(g in DYNEXPORT_GRAPHS for g in graphs):
                results, float_program = export_dynexport(model, graphs, directory, args.opset)
            if TORCHAO_GRAPH in graphs:
                results[TORCHAO_GRAPH] = export_torchao(model, directory, args.opset)
            for name, opset in TORCH_ONNX_GRAPHS.items():
                if name in graphs:
                    with contextlib.redirect_stdout(io.StringIO()):
                        results[name] = export_torch_onnx(model, opset, directory, name)
        builder_peaks = {}
        if any(g in BUILDER_GRAPHS for g in graphs):
            checkpoint = save_checkpoint(model, directory)
            for name, precision in BUILDER_GRAPHS.items():
                if name in graphs:
                    results[name] = build_with_builder(checkpoint, precision, directory, name)
                    builder_peaks[name] = results[name]["peak_rss"]
        points = {f"prefill {args.prefill}": cached_call(model.config, 1, 0, args.prefill, seed=1)}
        points.update({f"decode past {p}": cached_call(model.config, 1, p, 1, seed=p) for p in pasts})
        measure_latency(results, model.config, points, args.rounds)
        print_table(results, list(points))
        print_ratios(results, list(points))
        if float_program is not None:
            print_export_memory(_child("export_memory", str(args.layers), str(args.opset)), builder_peaks)
        if "dynexport_int4" in results:
            memory = _child("export_memory", str(args.layers), str(args.opset), "dynexport_int4")
            print_export_memory(memory, {}, "dynexport_int4")
        prompt = cached_call(model.config, 2, 8, 32, seed=1)
        for name in QUANTIZED:
            if name in results:
                cost = accuracy_cost(results[name]["program"], float_program, seeded_calls((), prompt))
                print(f"\n{name} against fp32 (quantized in {results[name]['quantize_s']:.1f} s): {cost}")
        if args.accuracy_variants and float_program is not None:
            for options in ACCURACY_VARIANTS:
                cost = accuracy_cost(float_program.quantize_weights(**options), float_program, seeded_calls((), prompt))
                print(f"\n{options} against fp32: {cost}")


if __name__ == "__main__":
    main()
