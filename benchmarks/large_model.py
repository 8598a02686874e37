"""Export and save a LLaMA-like model with dynexport and with torch.onnx.export(dynamo=True).

    python benchmarks/large_model.py [--size 1.0] [--exporters dynexport,torch] [--out DIR]

Each exporter runs in its own process (so peak RSS is its own), on the same model: a
``transformers`` LlamaForCausalLM of about ``--size`` billion parameters with random weights
(float32), exported with dynamic batch and sequence dims and saved with external data. Prints,
per exporter, the weight bytes, the peak RSS (and its ratio to the weight bytes), the export
and save times, and the time this disk takes to write as many bytes, measured in the same
process right after the save. Informational: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _config(size: float):
    from transformers import LlamaConfig

    hidden, intermediate, vocab = (2048, 5632, 32000) if size >= 0.2 else (1024, 2816, 32000)
    heads, kv_heads = hidden // 64, hidden // 256
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_heads * 64 + 3 * hidden * intermediate
    layers = max(1, round((size * 1e9 - 2 * vocab * hidden) / per_layer))
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
        use_cache=False, tie_word_embeddings=False,
    )


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(exporter: str, size: float, out: str, optimize: bool = True) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = _config(size)
    with torch.no_grad():
        model = LlamaForCausalLM(config).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rss_model = _peak_rss()
    input_ids = torch.randint(0, config.vocab_size, (2, 16))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=1024)
    dynamic_shapes = ({0: batch, 1: seq},)
    path = os.path.join(out, f"{exporter}.onnx")
    start = time.perf_counter()
    if exporter == "dynexport":
        import dynexport

        program = dynexport.export(model, (input_ids,), dynamic_shapes=dynamic_shapes, optimize=optimize)
    else:
        program = torch.onnx.export(model, (input_ids,), dynamo=True, dynamic_shapes=dynamic_shapes, optimize=True)
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    program.save(path, external_data=True)
    save_s = time.perf_counter() - start
    files = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    peak_rss = _peak_rss()
    # The disk's speed right now, on as many bytes: page-cache writeback makes it vary by 5x
    # from one minute to the next on this machine.
    disk_s = _disk_write_seconds(out, files)
    return {
        "exporter": exporter, "params": sum(p.numel() for p in model.parameters()), "layers": config.num_hidden_layers,
        "weight_bytes": weight_bytes, "rss_after_model": rss_model, "peak_rss": peak_rss,
        "export_s": export_s, "save_s": save_s, "file_bytes": files, "disk_s": disk_s,
    }


def _disk_write_seconds(directory: str, nbytes: int) -> float:
    chunk = b"\1" * (64 * 1024 * 1024)
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        start = time.perf_counter()
        with os.fdopen(fd, "wb") as file:
            for _ in range(-(-nbytes // len(chunk))):
                file.write(chunk)
        return time.perf_counter() - start
    finally:
        os.unlink(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1.0, help="billions of parameters (default 1.0)")
    parser.add_argument("--exporters", default="dynexport,torch")
    parser.add_argument("--out", help="directory for the files (default: a temporary one, removed)")
    parser.add_argument("--no-optimize", action="store_true", help="dynexport without its ONNX passes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(_child(options.child, options.size, options.out, not options.no_optimize)))
        return 0
    base = options.out or tempfile.mkdtemp(prefix="dynexport-large-")
    results = []
    for exporter in options.exporters.split(","):
        out = os.path.join(base, exporter)
        os.makedirs(out, exist_ok=True)
        command = [sys.executable, __file__, "--child", exporter, "--size", str(options.size), "--out", out]
        command += ["--no-optimize"] if options.no_optimize else []
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0:
            print(f"{exporter} failed:\n{completed.stderr[-3000:]}")
            continue
        results.append(json.loads(completed.stdout.strip().splitlines()[-1]))
        if not options.out:
            for name in os.listdir(out):
                os.unlink(os.path.join(out, name))
    if not results:
        return 1
    weight_bytes = results[0]["weight_bytes"]
    print(f"LLaMA-like model: {results[0]['params'] / 1e9:.2f}B parameters, {results[0]['layers']} layers, "
          f"{weight_bytes / 1e9:.2f} GB of float32 weights")
    print(f"{'exporter':<10} {'export s':>9} {'save s':>8} {'disk s':>7} {'save/disk':>10} {'peak RSS GB':>12} "
          f"{'RSS/weights':>12} {'RSS after model':>16}")
    for r in results:
        print(f"{r['exporter']:<10} {r['export_s']:>9.1f} {r['save_s']:>8.1f} {r['disk_s']:>7.1f} "
              f"{r['save_s'] / r['disk_s']:>9.2f}x {r['peak_rss'] / 1e9:>12.2f} {r['peak_rss'] / weight_bytes:>11.2f}x "
              f"{r['rss_after_model'] / 1e9:>15.2f}G")
    return 0


if __name__ == "__main__":
    sys.exit(main())
