"""The markdown report ``export(..., report=True)`` writes, on success and above all on failure.

It gathers what each stage learned: the capture strategy and per-phase timings, the FX graph's
operator histogram with how each operator was translated (a rule, a decomposition, a custom
domain node, or nothing: unsupported, with its model source line), the ONNX operator histogram,
and the verification table when ``verify=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

from dynexport.files import write_atomically
from dynexport.graph_text import type_text
from dynexport.translate import TranslationSummary

__all__ = ["ExportRecord", "render_report", "reporting", "write_report"]


@dataclasses.dataclass
class ExportRecord:
    """What an export did, filled in stage by stage."""

    model_name: str
    opset: int
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    strategy: str | None = None
    dim_refinements: list[Any] = dataclasses.field(default_factory=list)
    exported_program: torch.export.ExportedProgram | None = None
    summary: TranslationSummary = dataclasses.field(default_factory=TranslationSummary)
    onnx_model: Any = None
    verification: Any = None
    error: BaseException | None = None
    destination: str | None = None


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def _fx_histogram(program: torch.export.ExportedProgram) -> Counter:
    from dynexport.registry import target_name

    return Counter(target_name(n.target) for n in program.graph.nodes if n.op == "call_function")


def _how(summary: TranslationSummary, op: str) -> str:
    kinds = [
        ("rule", summary.translated), ("decomposed", summary.decomposed),
        ("custom domain", summary.custom_domain), ("**unsupported**", summary.unsupported),
    ]
    found = [name for name, counter in kinds if counter.get(op)]
    return ", ".join(found) or "not translated (dead or folded)"


def render_report(record: ExportRecord) -> str:
    """The report as markdown text."""
    from dynexport.errors import CaptureError, UnsupportedOperatorError

    status = "success" if record.error is None else f"FAILED ({type(record.error).__name__})"
    lines = [f"# dynexport report: {record.model_name}", "", f"- status: {status}",
             f"- opset: {record.opset}", f"- torch {torch.__version__}"]
    if record.destination:
        lines.append(f"- written to: `{record.destination}`")
    lines.append("")

    error = record.error
    if error is not None:
        lines += ["## Error", "", "```", str(error).strip(), "```", ""]
        if isinstance(error, UnsupportedOperatorError):
            lines += ["### Unsupported operators", ""]
            lines += _table(["operator", "uses", "first used at"],
                            [[u.target, u.count, u.source or "?"] for u in error.uses])
            lines.append("")
        if isinstance(error, CaptureError):
            lines += ["### Capture strategies", ""]
            lines += _table(["strategy", "error"],
                            [[name, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"]
                             for name, e in error.reasons.items()])
            lines.append("")

    lines += ["## Capture", "", f"Strategy: {record.strategy or 'none succeeded'}", ""]
    if record.dim_refinements:
        lines += ["dynamic_shapes refined from torch.export's suggested fixes:", ""]
        lines += [f"- {refinement}" for refinement in record.dim_refinements]
        lines.append("")
    if record.timings:
        rows = [[phase, f"{seconds:.3f}"] for phase, seconds in record.timings.items()]
        rows.append(["**total**", f"{sum(record.timings.values()):.3f}"])
        lines += _table(["phase", "seconds"], rows)
        lines.append("")

    if record.exported_program is not None:
        histogram = _fx_histogram(record.exported_program)
        summary = record.summary
        lines += ["## FX graph", "",
                  f"{sum(histogram.values())} operator nodes, {len(histogram)} distinct operators: "
                  f"{sum(summary.translated.values())} nodes translated by a rule, "
                  f"{sum(summary.decomposed.values())} decomposed, "
                  f"{sum(summary.custom_domain.values())} kept as custom-domain nodes, "
                  f"{sum(summary.unsupported.values())} unsupported.", ""]
        lines += _table(["operator", "count", "translation"],
                        [[op, n, _how(summary, op)] for op, n in histogram.most_common()])
        lines.append("")

    model = record.onnx_model
    if model is not None:
        graph = model.graph
        onnx_histogram = Counter(
            f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.all_nodes()
        )
        weight_bytes = sum(v.const_value.nbytes for v in graph.initializers.values() if v.const_value is not None)
        opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in model.opset_imports.items())
        lines += ["## ONNX model", "",
                  f"{sum(onnx_histogram.values())} nodes, {len(graph.initializers)} initializers "
                  f"({weight_bytes / 1e6:.1f} MB), opsets: {opsets}", ""]
        lines += _table(["", "name", "type"],
                        [["input", v.name, type_text(v)] for v in graph.inputs]
                        + [["output", v.name, type_text(v)] for v in graph.outputs])
        lines.append("")
        lines += _table(["ONNX op", "count"], [[op, n] for op, n in onnx_histogram.most_common()])
        lines.append("")

    lines += ["## Verification", ""]
    if record.verification is None:
        lines.append("Not run (pass `verify=True` to export, or `--verify` to the CLI).")
    else:
        lines.append(record.verification.summary())
    lines.append("")
    return "\n".join(lines)


def write_report(record: ExportRecord, path: str) -> str:
    """Write the report atomically; returns the path."""
    write_atomically(render_report(record).encode(), path)
    return path


@contextlib.contextmanager
def reporting(path: str | None, record: ExportRecord) -> Iterator[ExportRecord]:
    """Write the report to ``path`` (if any) when the block ends, however it ends; a failed
    export's error gets a note saying where the report is."""
    try:
        yield record
    except Exception as error:
        if path is not None:
            record.error = error
            with contextlib.suppress(Exception):  # a broken report must not hide the real error
                write_report(record, path)
                error.add_note(f"dynexport wrote a report of this export to {path}")
        raise
    if path is not None:
        write_report(record, path)
