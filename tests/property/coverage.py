"""Write docs/op_coverage.md from actual runs: ``python -m tests.property.coverage``.

For every core-ATen overload (``torch.Tag.core``) and every op in
``tests/preserved_ops.py``: whether the table has a rule for it, it decomposes,
or it is unsupported; which dtypes pass, from exporting and running one-op models (the property
specs at every dtype, with the "coverage" hypothesis profile) and PyTorch's OpInfo samples at
every dtype; and the known gaps with their reasons.

A dtype is credited to every ATen overload in the exported program of a run that passed. A run
through onnx's reference evaluator (onnxruntime has no kernel for that op and dtype) is marked.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
_COMPLEX_OUTPUTS = (
    "its OpInfo samples take or return complex tensors, which an exported model cannot (complex values "
    "live only inside the graph, docs/complex.md); tests/ops/test_spectral.py checks it through abs, "
    "view_as_real, real and imag"
)
_UNREACHABLE = {
    "backward": "a backward op: exports of inference graphs never hold it",
    "aten.sym_storage_offset.default": "a stride/storage query: torch.export does not emit it for the contiguous inputs ONNX has",
    "aten.sym_stride.int": "a stride/storage query: torch.export does not emit it for the contiguous inputs ONNX has",
    "aten._fft_r2c.default": _COMPLEX_OUTPUTS,
    "aten._native_batch_norm_legit.default": "training-mode batch norm that updates running statistics in place: an exported module in eval mode holds _native_batch_norm_legit_no_training instead",
    "aten.atan2.out": "an out= variant: torch.export functionalizes it to atan2.default",
    "aten._fft_c2r.default": _COMPLEX_OUTPUTS,
}


# Why an operator that some OpInfo samples need has neither a rule nor a decomposition, by the
# first pattern that matches its name.
_GAP_REASONS: list[tuple[str, str]] = [
    (r"_linalg_(eigh|svd)|cholesky|linalg_(householder|ldl|lu|matrix_exp|pinv|qr|solve_triangular)"
     r"|lu_unpack|triangular_solve|geqrf|ormqr",
     "a matrix factorization or triangular solve: ONNX has none (only Det); not translated yet "
     "(inverse and solve are, as Gauss-Jordan elimination in a Loop)"),
    (r"_fft_|_conj|stft|angle", "a use of complex tensors with no rule for dynexport's (real, imaginary) pair layout "
     "(docs/complex.md lists the complex operators)"),
    (r"_to_sparse", "sparse layouts: ONNX tensors are dense"),
    (r"special_|bessel|zeta|igamma|digamma|lgamma|polygamma|erfcx|airy",
     "a special function with no ONNX operator: PyTorch computes it with series and rational "
     "approximations that a graph would have to copy coefficient by coefficient"),
    (r"histc|histogram|bincount", "a histogram: bincount's size is data-dependent, and histc/histogram bin edges "
     "come from value ranges; not translated yet"),
    (r"fractional_max_pool", "random window placement: results cannot be compared with eager"),
    (r"hash_tensor", "a hash of the bytes: no ONNX counterpart"),
    (r"aten\.resize", "storage resizing: ONNX tensors have no storage"),
    (r"aten\.convolution|avg_pool[23]d",
     "integer convolution or average pooling: ONNX Conv and AveragePool take floating types only "
     "(PyTorch also computes them for integers on CPU)"),
    (r"_upsample_bilinear2d_aa|_upsample_bicubic2d_aa",
     "antialiased resizing: onnxruntime's Resize(antialias=1) filter differs from PyTorch's (up to 0.1 apart)"),
    (r"grid_sampler_3d", "volume sampling: ONNX GridSample takes 5-D inputs from opset 20 only (translated there)"),
    (r"_linear_cross_entropy", "a torch-internal chunked loss with no decomposition"),
    (r"gcd|nextafter|frexp", "integer gcd needs a value-dependent number of steps; nextafter/frexp need float bit "
     "manipulation ONNX has no op for"),
]


# Differences the property specs leave out of their draws, each for a reason outside our table.
_DRAWS_LEFT_OUT = [
    "`prod` of int64 values whose product overflows: PyTorch wraps around, onnxruntime's ReduceProd "
    "saturates at the int64 limits (the specs draw integers in [-1, 1]).",
    "`gelu` at ±inf: PyTorch's vectorized float32 CPU kernel returns NaN, its scalar and float64 paths "
    "±inf/0 (the spec draws finite inputs).",
    "`x ** 0.5` at -inf: PyTorch's vectorized kernel computes sqrt (NaN), its scalar path pow (+inf) "
    "(the spec draws no exponent 0.5).",
    "`linalg_vector_norm` with ord ±inf of a tensor with an empty dim: torch.export's fake kernel "
    "rejects what eager computes (the spec draws finite orders for such shapes).",
]


def gap_reason(op: str) -> str | None:
    return next((reason for pattern, reason in _GAP_REASONS if re.search(pattern, op)), None)


def _core_overloads() -> list[torch._ops.OpOverload]:
    found = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if torch.Tag.core in op.tags:
                    found.append(op)
    return found


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- runs (in worker processes) -------------------------------------------------------------


def _run_spec(index: int) -> list[tuple]:
    """Run property spec ``index`` at each of its dtypes; one record per dtype."""
    import warnings

    warnings.filterwarnings("ignore")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import tests.conftest  # noqa: F401  (registers the profiles)
    from tests.property.specs import SPECS, TorchUnsupported, check_spec

    settings.load_profile("coverage")
    spec = SPECS[index]
    records = []
    for dtype in spec.dtypes:
        seen: set[str] = set()
        runtimes: set[str] = set()

        @given(data=st.data())
        def check(data):
            program = check_spec(spec, dtype, data.draw)
            seen.update(_aten_ops(program))
            runtimes.add("onnxruntime" if program._session is not None else "reference")

        try:
            check()
            status, detail = "pass", ""
        except TorchUnsupported:
            status, detail = "torch", "PyTorch has no CPU kernel"
        except Exception as error:  # noqa: BLE001 - every failure is recorded
            status, detail = "fail", f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
        reason = spec.xfail.get(dtype) or spec.xfail.get(None)
        records.append(("spec", spec.name, _dtype_name(dtype), status, detail, tuple(sorted(seen)), tuple(sorted(runtimes)), reason))
    return records


def _run_opinfo(index: int, samples: int) -> list[tuple]:
    import warnings

    warnings.filterwarnings("ignore")
    from tests.property.opinfo import (
        ALL,
        KNOWN_FAILURES,
        opinfo_id,
        opinfos,
        run_opinfo,
    )

    op = opinfos()[index]
    records = []
    for dtype in ALL:
        outcomes = run_opinfo(op, dtype, samples)
        for outcome in outcomes:
            reason = KNOWN_FAILURES.get((opinfo_id(op), dtype))
            records.append(("opinfo", opinfo_id(op), _dtype_name(dtype), outcome.status, outcome.detail, outcome.aten_ops, (), reason))
    return records


def _aten_ops(program) -> list[str]:
    graph = program.exported_program.graph
    return [str(n.target) for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def _opinfo_count() -> int:
    from tests.property.opinfo import opinfos

    return len(opinfos())


# -- the document ---------------------------------------------------------------------------


def _status(op, table, decomposition_for) -> str:
    if op in table:
        return "rule"
    if decomposition_for(op) is not None:
        return "decomposes"
    return "unsupported"


def write_doc(records: list[tuple], path: Path, seconds: float) -> dict:
    import dynexport.ops  # noqa: F401  (fills the table)
    from dynexport.decompositions import decomposition_for
    from dynexport.options import DEFAULT_OPSET, SUPPORTED_OPSETS
    from dynexport.registry import default_table
    from tests.opset_parametrization import LATER_OPSET_OPS, LOW_OPSET, MAX_MIN_SCATTER_REFUSAL
    from tests.preserved_ops import PRESERVED_OPS

    lowest = SUPPORTED_OPSETS.start
    core = _core_overloads()
    preserved = sorted(PRESERVED_OPS, key=str)
    passing: dict[str, set[str]] = collections.defaultdict(set)
    reference: dict[str, set[str]] = collections.defaultdict(set)
    failing: dict[str, dict[str, str]] = collections.defaultdict(dict)
    sources: dict[str, set[str]] = collections.defaultdict(set)
    opinfo_gaps: dict[str, set[str]] = collections.defaultdict(set)
    spec_failures, opinfo_failures = [], collections.defaultdict(set)
    for kind, name, dtype, status, detail, ops, runtimes, reason in records:
        if status == "pass":
            for op in ops:
                passing[op].add(dtype)
                sources[op].add("spec" if kind == "spec" else "OpInfo")
                if runtimes == ("reference",):
                    reference[op].add(dtype)
        elif status == "fail":
            if kind == "spec":
                target = "aten." + name.split("(")[0]
                failing[target][dtype] = reason or f"unexplained failure: {detail}"
                spec_failures.append((name, dtype, reason or f"unexplained: {detail}"))
            else:
                opinfo_failures[(name, reason or f"unexplained: {detail[:160]}")].add(dtype)
        elif status == "gap":
            for op in detail.split(", "):
                opinfo_gaps[op].add(name)
    # Reference-evaluator credit only where onnxruntime never ran that dtype.
    lines = [
        "# Operator coverage",
        "",
        "<!-- GENERATED by `python -m tests.property.coverage`: do not edit by hand. -->",
        "*Generated by `python -m tests.property.coverage`; never edit it by hand: rerun the script.*",
        "",
        "Generated from actual runs, not from the table's declarations: every property spec "
        "(tests/property/specs/) at every dtype it lists, with the `coverage` hypothesis profile, "
        "and PyTorch's OpInfo samples (op_db) at every ONNX dtype. A dtype passes for an ATen "
        "overload when a run whose exported program holds that overload matched eager PyTorch in "
        "onnxruntime, or — marked † — in onnx's reference evaluator because onnxruntime has no CPU "
        f"kernel for it. {len(records)} runs took {seconds:.0f} s.",
        "",
        f"dynexport exports at ONNX opsets {lowest} to {SUPPORTED_OPSETS.stop - 1} (default {DEFAULT_OPSET}). "
        f"The dtypes below passed at the default opset; the op tests and property specs also run at opset "
        f"{LOW_OPSET}, and tests/ops/test_low_opsets.py exports a representative set at {lowest} to 16. The "
        "*min opset* column is the lowest opset the table translates an overload at (from its rules' "
        "`min_opset`; below a rule's, the overload decomposes where PyTorch has a decomposition). An "
        "overload whose ONNX form needs a later opset than the export's raises OpsetTooLowError naming it.",
        "",
    ]
    summary = collections.Counter()

    def min_opset(op, status: str) -> str:
        if status == "unsupported":
            return "—"
        declared = max(default_table.lowest_opset(op, None) or lowest, lowest) if status == "rule" else lowest
        if declared > lowest and decomposition_for(op) is not None:
            return f"{lowest} (decomposed below {declared})"
        return str(declared)

    def row(op) -> str:
        name = str(op)
        status = _status(op, default_table, decomposition_for)
        ok = [d for d in DTYPES if d in passing.get(name, ())]
        shown = [f"{d}†" if d in reference.get(name, ()) and d not in _ort_dtypes(name) else d for d in ok]
        gaps = [f"{d}: {r}" for d, r in failing.get(name, {}).items()]
        if not ok and not gaps:
            reason = _unreachable_reason(name, status, opinfo_gaps)
            gaps.append(reason)
        summary[status] += 1
        summary["exercised" if ok else "not exercised"] += 1
        return f"| `{name}` | {status} | {min_opset(op, status)} | {', '.join(shown) or '—'} | {'; '.join(gaps) or ''} |"

    def _ort_dtypes(name):
        return passing.get(name, set()) - reference.get(name, set())

    for title, ops in (("Core ATen overloads (`torch.Tag.core`)", core), ("Preserved ops (`tests/preserved_ops.py`)", preserved)):
        lines += [
            f"## {title}: {len(ops)}", "", "| overload | translation | min opset | dtypes passing | known gaps |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [row(op) for op in sorted(ops, key=str)]
        lines.append("")
    lines += [f"## Operators no opset below a later one expresses (refused at {LOW_OPSET} in the tests)", ""]
    lines += [f"- `{op}`: from opset {opset}: {why}" for op, (opset, why) in sorted(LATER_OPSET_OPS.items())]
    lines.append(f"- {MAX_MIN_SCATTER_REFUSAL}")
    lines += ["", "## Known bugs found by the property tests (strict xfails)", ""]
    for name, dtype, reason in sorted(set(spec_failures)):
        lines.append(f"- `{name}` {dtype}: {reason}")
    lines += ["", "## OpInfo samples that fail", ""]
    for (name, reason), dtypes in sorted(opinfo_failures.items()):
        lines.append(f"- `{name}` ({', '.join(sorted(dtypes))}): {reason}")
    lines += ["", "## ATen ops OpInfo samples need that have no rule and no decomposition", ""]
    for op, names in sorted(opinfo_gaps.items()):
        users = f"{', '.join(sorted(names)[:8])}{' …' if len(names) > 8 else ''}"
        lines.append(f"- `{op}` ({users}): {gap_reason(op) or 'unexplained'}")
    lines += ["", "## What the property draws leave out", ""]
    lines += [f"- {note}" for note in _DRAWS_LEFT_OUT]
    counts = collections.Counter(status for _, _, _, status, *_ in records)
    lines += ["", "## Totals", "", f"- runs: {dict(counts)}", f"- overload rows: {dict(summary)}", ""]
    path.write_text("\n".join(lines))
    return {"runs": dict(counts), "rows": dict(summary)}


def _unreachable_reason(name: str, status: str, opinfo_gaps) -> str:
    if name in _UNREACHABLE:
        return _UNREACHABLE[name]
    if "backward" in name:
        return _UNREACHABLE["backward"]
    if status == "unsupported":
        users = opinfo_gaps.get(name)
        return "no rule and no decomposition" + (f" (needed by OpInfo {', '.join(sorted(users)[:3])})" if users else "")
    return "not exercised by a spec or an OpInfo sample"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "op_coverage.md")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--opinfo-samples", type=int, default=2)
    parser.add_argument("--no-opinfo", action="store_true")
    args = parser.parse_args(argv)
    from tests.property.specs import SPECS

    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.jobs, maxtasksperchild=40) as pool:
        records = [r for rs in pool.imap_unordered(_run_spec, range(len(SPECS))) for r in rs]
        print(f"specs: {len(records)} runs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
        if not args.no_opinfo:
            count = pool.apply(_opinfo_count)
            jobs = [(i, args.opinfo_samples) for i in range(count)]
            records += [r for rs in pool.starmap(_run_opinfo, jobs, chunksize=8) for r in rs]
    totals = write_doc(records, args.output, time.perf_counter() - start)
    print(f"wrote {args.output}: {totals}", file=sys.stderr)


if __name__ == "__main__":
    main()
