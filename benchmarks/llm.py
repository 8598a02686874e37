"""A LLaMA-shaped 135M decoder with explicit past keys and values, exported side by side.

    python benchmarks/llm.py [--layers 30] [--past 256,1024] [--rounds 20] [--opset 21]
                             [--graphs dynexport,dynexport_int4,dynexport_int4_portable,torch_onnx]
                             [--accuracy-variants]

The model is issue 18's: transformers' LlamaForCausalLM with 30 layers, hidden 576, 9 query and
3 key-value heads, intermediate 1536, vocabulary 49152, tied embeddings, random weights (seeded,
nothing downloaded); its past keys and values come in, and go out, as plain tensors. Graphs:

- ``dynexport``: ``dynexport.export`` (fp32, at ``--opset``);
- ``dynexport_int4``: the same program with ``quantize_weights(bits=4, block_size=32,
  accuracy_level=4)`` (com.microsoft MatMulNBits; export time includes the quantization);
- ``dynexport_int4_portable``: the same with ``target="portable"`` (opset-21 blocked
  DequantizeLinear + MatMul; onnxruntime fuses the pair into MatMulNBits when it loads it);
- ``torch_onnx``: ``torch.onnx.export(dynamo=True, opset_version=18)``.

onnxruntime-genai's model builder is not run (it needs a checkpoint directory and is not a
dependency here); the script says whether it is installed.

Per graph it prints the node count, the export time, the file size (model + external data) and
the decode latency (one new token, batch 1, 1 thread) at each past length: the graphs' sessions
run in turn, ``--rounds`` times, and the median of each is reported, so that the machine's load
drifts over all of them alike. Then the ratios to ``dynexport`` and the int4 graph's accuracy
cost against the fp32 one (:func:`dynexport.quantize.accuracy_cost`: next-token top-1 agreement
at every position of seeded prompts, max logit error); ``--accuracy-variants`` adds the cost of
other quantizations (asymmetric, block 128, int8) of the same program. Informational: nothing
is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.torchvision_ops import load_torchvision_if_installed

load_torchvision_if_installed()  # transformers imports torchvision as it loads

import transformers

import dynexport
from dynexport.quantize import accuracy_cost, seeded_calls

Dim = torch.export.Dim
GRAPHS = ("dynexport", "dynexport_int4", "dynexport_int4_portable", "torch_onnx")
QUANTIZED = {
    "dynexport_int4": {"bits": 4, "block_size": 32, "accuracy_level": 4},
    "dynexport_int4_portable": {"bits": 4, "block_size": 32, "target": "portable"},
}
ACCURACY_VARIANTS = [
    {"bits": 4, "block_size": 32, "symmetric": False},
    {"bits": 4, "block_size": 128},
    {"bits": 8, "block_size": 32},
]


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
        rms_norm_eps=1e-5, use_cache=True,
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
    batch, past, seq = Dim("batch", max=64), Dim("past", min=1, max=2047), Dim("seq", max=2047)
    return {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: Dim.DYNAMIC},  # past + seq: torch.export derives it
        "past_key_values": [({0: batch, 2: past}, {0: batch, 2: past})] * layers,
    }


def export_graphs(model, graphs: list[str], directory: str, opset: int) -> tuple[dict[str, dict], Any]:
    """Each graph's file, node count, export seconds and file bytes (and its program), and
    dynexport's float program (None when no dynexport graph is asked for)."""
    wrapper = WithPlainCache(model)
    example = cached_call(model.config, 2, 8, 4)
    shapes = dynamic_shapes(model.config.num_hidden_layers)
    results, program = {}, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if any(g.startswith("dynexport") for g in graphs):
            start = time.perf_counter()
            program = dynexport.export(wrapper, (), kwargs=example, dynamic_shapes=shapes, opset_version=opset)
            seconds = time.perf_counter() - start
            if "dynexport" in graphs:
                results["dynexport"] = _saved(program, len(program.model.graph), seconds, directory, "dynexport")
            for name, options in QUANTIZED.items():
                if name in graphs:
                    start = time.perf_counter()
                    quantized = program.quantize_weights(**options)
                    quantize_s = time.perf_counter() - start
                    results[name] = _saved(quantized, len(quantized.model.graph), seconds + quantize_s, directory, name)
                    results[name]["quantize_s"] = quantize_s
        if "torch_onnx" in graphs:
            start = time.perf_counter()
            onnx_program = torch.onnx.export(
                wrapper, (), kwargs=example, dynamic_shapes=shapes, dynamo=True, opset_version=18, optimize=True
            )
            seconds = time.perf_counter() - start
            nodes = len(onnx_program.model.graph)
            results["torch_onnx"] = _saved(onnx_program, nodes, seconds, directory, "torch_onnx")
    return results, program


def _saved(program, nodes: int, seconds: float, directory: str, name: str) -> dict:
    folder = os.path.join(directory, name)
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    program.save(path, external_data=True)  # both exporters' programs take this call
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    return {"program": program, "path": path, "nodes": nodes, "export_s": seconds, "bytes": size}


def decode_feeds(session: ort.InferenceSession, config, past: int) -> dict[str, np.ndarray]:
    """One new token after ``past`` positions, batch 1, fed by position (each exporter names
    the flattened inputs its own way, in the same order)."""
    call = cached_call(config, 1, past, 1, seed=past)
    values = [call["input_ids"], call["attention_mask"]]
    for key, value in call["past_key_values"]:
        values += [key, value]
    return {i.name: v.numpy() for i, v in zip(session.get_inputs(), values)}


def decode_latency(results: dict[str, dict], config, pasts: list[int], rounds: int) -> None:
    """Median milliseconds per decode step, each graph at each past length, rounds interleaved."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    sessions = {
        name: ort.InferenceSession(r["path"], options, providers=["CPUExecutionProvider"]) for name, r in results.items()
    }
    for past in pasts:
        feeds = {name: decode_feeds(session, config, past) for name, session in sessions.items()}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for name, session in sessions.items():  # warm-up
            session.run(None, feeds[name])
        for _ in range(rounds):
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(None, feeds[name])
                times[name].append((time.perf_counter() - start) * 1000)
        for name in sessions:
            results[name][f"decode_ms_{past}"] = statistics.median(times[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--past", default="256,1024", help="comma-separated past lengths")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--accuracy-variants", action="store_true", help="also the cost of other quantizations")
    parser.add_argument("--opset", type=int, default=21, help="dynexport's opset (from 21 for the portable int4)")
    parser.add_argument("--graphs", default=",".join(GRAPHS), help=f"comma-separated, of {GRAPHS}")
    args = parser.parse_args()
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
    genai = importlib.util.find_spec("onnxruntime_genai") is not None
    builder = "installed, not run by this script" if genai else "not installed, skipped"
    print(f"onnxruntime-genai model builder: {builder}")
    with tempfile.TemporaryDirectory() as directory:
        results, float_program = export_graphs(model, graphs, directory, args.opset)
        decode_latency(results, model.config, pasts, args.rounds)
        header = "| graph | nodes | export s | file MB | " + " | ".join(f"decode ms, past {p}" for p in pasts) + " |"
        print()
        print(header)
        print("|---" * (4 + len(pasts)) + "|")
        for name, r in results.items():
            cells = [name, str(r["nodes"]), f"{r['export_s']:.1f}", f"{r['bytes'] / 1e6:.0f}"]
            cells += [f"{r[f'decode_ms_{p}']:.2f}" for p in pasts]
            print("| " + " | ".join(cells) + " |")
        if "dynexport" in results:
            base = results["dynexport"]
            print("\nratios to dynexport fp32 (decode time, file size, export time):")
            for name, r in results.items():
                if name != "dynexport":
                    decode = ", ".join(f"past {p}: {r[f'decode_ms_{p}'] / base[f'decode_ms_{p}']:.2f}x" for p in pasts)
                    print(f"  {name}: decode {decode}; file {r['bytes'] / base['bytes']:.2f}x; "
                          f"export {r['export_s'] / base['export_s']:.2f}x")
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
