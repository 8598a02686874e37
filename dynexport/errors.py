"""Typed errors raised by dynexport.

Every error that comes from a model (rather than from bad arguments, which raise ``ValueError``
or ``TypeError``) derives from :class:`ExportError`. Errors about a graph node carry the ATen
operator, the model source line that produced it (FX ``stack_trace``) and a hint.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sysconfig
import traceback
from collections.abc import Sequence

__all__ = [
    "CaptureError",
    "ComplexTensorError",
    "DimSpecializedError",
    "ExampleCallRefusedError",
    "ExampleTooSmallError",
    "ExportError",
    "OpsetTooLowError",
    "TorchScriptConversionError",
    "TranslationError",
    "UnsupportedOperatorError",
    "UnsupportedUse",
    "model_line",
    "source_line",
]


class ExportError(RuntimeError):
    """Base class of every error dynexport raises while exporting a model."""


# A size computed through floats (``math.ceil(h / 32)``, ``int(h * 0.5)``): a model line, or
# torch's guard on one.
FLOAT_SIZE_ARITHMETIC = re.compile(r"math\.(ceil|floor|trunc)\(|\bfloat\(|TruncToInt|CeilToInt|FloorToInt|ToFloat")
# A model line that branches: ``if ...:``, or a conditional expression.
_BRANCH = re.compile(r"(^|[:;]\s*)(if|elif|while)\b|\bif\b.+\belse\b")
INTEGER_SIZES_HINT = (
    "The model computes a size in float arithmetic, which torch.export can only hold at the "
    "example's value: compute it in integers (`-(-h // 32) * 32` rather than "
    "`int(math.ceil(h / 32) * 32)`, `h // 2` rather than `int(h * 0.5)`), or declare the dim static."
)


class CaptureError(ExportError):
    """Every capture strategy failed; ``reasons`` maps each strategy to its failure."""

    def __init__(self, reasons: dict[str, BaseException], hint: str | None = None):
        self.reasons = reasons
        lines = [
            "Could not capture the model with torch.export. "
            + ("Each strategy failed:" if len(reasons) > 1 else "It failed in a way every strategy would:")
        ]
        for strategy, error in reasons.items():
            message = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
            lines.append(f"  - {strategy}: {type(error).__name__}: {(message or [''])[0]}")
            # torch lists each violated constraint on a "- " line: those say what to fix.
            lines += [f"      {line}" for line in message[1:] if line.startswith("- ")][:4]
            where = _model_call(message) or _raising_frame(error)
            if where:
                lines.append(f"      at {where}")
        lines.append(
            "Hint: "
            + (hint or "")
            + ("" if hint is None else " ")
            + ("The first strategy's error is usually the one to fix; run " if len(reasons) > 1 else "Run ")
            + "torch.export.export(model, args, strict=False) to see it in full, or "
            "torch.export.draft_export to list every problem at once."
        )
        super().__init__("\n".join(lines))


class DimSpecializedError(CaptureError):
    """The model fixes dims the user declared dynamic: ``dims`` maps each dim name to the size it
    is fixed to, ``source`` is the model line that fixes one (None when torch does not say)."""

    def __init__(self, dims: dict[str, int], source: str | None, reasons: dict[str, BaseException]):
        self.reasons = reasons
        self.dims = dims
        self.source = source
        fixed = ", ".join(f"{name} = {size}" for name, size in dims.items())
        hint = (
            "the ONNX model would accept only these sizes, so dynexport does not apply torch.export's "
            "suggested fix. Keep the dim dynamic in the model (a size read from the input rather than "
            "a constant), or opt in to a static dim: leave it out of dynamic_axes, or give it as "
            "None, Dim.STATIC or Dim.AUTO in dynamic_shapes."
        )
        if any(size in (0, 1) for size in dims.values()):
            hint += (
                " An example size of 0 or 1 lets model code that tests the size (`if batch == 1`) fix "
                "it: export with an example size of 2 or more."
            )
        if source and FLOAT_SIZE_ARITHMETIC.search(source):
            hint += " " + INTEGER_SIZES_HINT
        elif source and _BRANCH.search(source):
            hint += (
                " The line branches on the size: where the example takes a branch that the model "
                "takes only at this size (a shortcut at a configured size), export from an example of "
                "another size; dynexport then checks the branch it captures over the declared range."
            )
        ExportError.__init__(
            self, _located(f"The model fixes dims declared dynamic to the example's sizes: {fixed}", source, hint)
        )


class ExampleTooSmallError(CaptureError):
    """Dims declared, or refined by dynexport, as a multiple of a root (``n = 2*_n``) whose root
    is 0 or 1 at the example: torch.export fixes such a root to its value, so the dim cannot stay
    dynamic. ``dims`` maps each dim's name to ``(its form, its example size, the smallest size
    whose root is 2)``; ``source`` is the model line that asked for the multiple (None where the
    user declared it)."""

    def __init__(self, dims: dict[str, tuple[str, int, int]], source: str | None, reasons: dict[str, BaseException]):
        self.reasons = reasons
        self.dims = dims
        self.source = source
        described = "; ".join(
            f"{name} = {form} is {size} at the example" if name != form else f"{form} is {size} at the example"
            for name, (form, size, _) in dims.items()
        )
        sizes = ", ".join(f"{name} of {smallest} or more" for name, (_, _, smallest) in dims.items())
        hint = (
            "torch.export fixes a size of 0 or 1 to the example's value, and a root of 0 or 1 with it, so "
            f"the dim would be static. Export with an example that gives each root 2 or more: {sizes}"
            + (" (a multiple the model needs, as the line above says)." if source else ".")
        )
        ExportError.__init__(
            self, _located(f"The example is too small for the dims' roots: {described}, where the root is 0 or 1", source, hint)
        )


class ExampleCallRefusedError(ExportError):
    """A further example call the user declared the model runs (``torch.export.AdditionalInputs``)
    falls outside what the exported graph accepts: ``index`` is its position among the calls."""

    def __init__(self, index: int, reason: BaseException):
        self.index = index
        super().__init__(
            f"Additional input {index} (the calls given to torch.export.AdditionalInputs.add, from 0) is "
            f"outside what the model was exported for: {reason}\nHint: the model narrows that dim while "
            "tracing (a slice or an index bounded by another size, a check in its code); export with "
            "an example call that takes the same path, or leave that call out of the AdditionalInputs."
        )


class TracedSizesError(CaptureError):
    """``dynamo=False``: torch.jit.trace records another graph when the dims ``dims``, declared
    dynamic, have other sizes (``sizes``): the traced graph holds the example's; ``source`` is the
    model line where the two traces part (None when the trace does not say)."""

    def __init__(self, dims: list[str], sizes: str, difference: str, source: str | None):
        self.reasons = {}
        self.dims = dims
        self.source = source
        hint = (
            "dynamo=False traces the model, and a trace holds the example's sizes: a Python loop over "
            "a size unrolls, a branch on a size keeps the example's side, a size read as a number "
            "becomes a constant, so the graph would be wrong at other sizes. Export with dynamo=True "
            "(the default), which keeps sizes symbolic or names the line that fixes them; or script "
            "that code with torch.jit.script; or declare these dims static."
        )
        headline = (
            f"dynamo=False: torch.jit.trace records another graph when {', '.join(dims)} "
            f"{'is' if len(dims) == 1 else 'are'} {sizes}: {difference}"
        )
        ExportError.__init__(self, _located(headline, source, hint))


def _model_call(message: list[str]) -> str | None:
    """The model's line that torch says raised a capture error (``File "m.py", line 4, in
    forward: code``), from the lines torch puts under "The following call raised this error"."""
    marker = "The following call raised this error:"
    if marker not in message:
        return None
    following = message[message.index(marker) + 1 : message.index(marker) + 3]
    if not following or not following[0].startswith("File "):
        return None
    return f"{following[0]}: {following[1]}" if len(following) > 1 else following[0]


def _raising_frame(error: BaseException) -> str | None:
    """The innermost frame of the model's own code (not torch's, not dynexport's) in the
    traceback of an exception the model raised: ``File "m.py", line 4, in forward: code``."""
    own = (f"{os.sep}torch{os.sep}", f"{os.sep}dynexport{os.sep}", "<eval_with_key>")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not any(part in f.filename for part in own)]
    if not frames:
        return None
    frame = frames[-1]
    where = f'File "{frame.filename}", line {frame.lineno}, in {frame.name}'
    return f"{where}: {frame.line}" if frame.line else where


@dataclasses.dataclass(frozen=True)
class UnsupportedUse:
    """One operator the translation table cannot express, with where the model uses it;
    ``min_opset`` is the lowest ONNX opset that expresses it, where a later one than the
    export's does (``why`` says what it needs from that opset, if known)."""

    target: str
    count: int
    source: str | None
    min_opset: int | None = None
    why: str | None = None


class UnsupportedOperatorError(ExportError):
    """The graph holds operators with no translation rule and no decomposition."""

    def __init__(self, uses: Sequence[UnsupportedUse]):
        self.uses = list(uses)
        lines = [f"{len(self.uses)} operator(s) in the model have no ONNX translation:"]
        for use in self.uses:
            later = f": translated from opset {use.min_opset}" if use.min_opset else ""
            why = f" {use.why}" if use.why else ""
            where = f"\n      first used at {use.source}" if use.source else ""
            lines.append(f"  - {use.target} (used {use.count}x){why}{later}{where}")
        lines.append(
            "Hint: pass custom_translation_table={op: onnxscript_function} to export, or "
            "rewrite that part of the model with supported operators."
        )
        super().__init__("\n".join(lines))

    @property
    def targets(self) -> list[str]:
        return [use.target for use in self.uses]


class OpsetTooLowError(UnsupportedOperatorError):
    """The graph holds operators that ONNX expresses only from a later opset than the export's
    ``opset``: each use's ``min_opset`` is the lowest that has it."""

    def __init__(self, uses: Sequence[UnsupportedUse], opset: int):
        self.uses = list(uses)
        self.opset = opset
        self.min_opset = max(use.min_opset for use in self.uses)
        lines = [f"{len(self.uses)} operator(s) in the model have no ONNX translation at opset {opset}:"]
        for use in self.uses:
            why = f" ({use.why})" if use.why else ""
            where = f"\n      first used at {use.source}" if use.source else ""
            lines.append(f"  - {use.target} (used {use.count}x): from opset {use.min_opset}{why}{where}")
        lines.append(f"Hint: export with opset_version={self.min_opset} (or later).")
        ExportError.__init__(self, "\n".join(lines))


class ComplexTensorError(ExportError):
    """A model's input or output is a complex tensor, which ONNX runtimes cannot hold."""


class TranslationError(ExportError):
    """A translation rule failed on one node."""

    def __init__(self, target: str, source: str | None, reason: str, hint: str | None = None):
        self.target = target
        self.source = source
        self.reason = reason
        self.hint = hint
        super().__init__(_located(f"Failed to translate {target}: {reason}", source, hint))


class TorchScriptConversionError(ExportError):
    """A TorchScript construct (``prim::Loop``, ``aten::append``, ...) that has no
    ExportedProgram form; ``source`` is the TorchScript source line that holds it."""

    def __init__(self, construct: str, source: str | None, reason: str, hint: str | None = None):
        self.construct = construct
        self.source = source
        self.reason = reason
        self.hint = hint
        super().__init__(_located(f"Cannot convert the TorchScript construct {construct}: {reason}", source, hint))


def _located(headline: str, source: str | None, hint: str | None) -> str:
    """An error message: the headline, then the model source line and the hint, if any."""
    return headline + (f"\n  at {source}" if source else "") + (f"\nHint: {hint}" if hint else "")


def model_line(stack: traceback.StackSummary) -> str | None:
    """The innermost frame of ``stack`` in the model's code, as ``File "m.py", line 4, in
    forward: code``; None when there is none."""
    for frame in reversed(stack):
        if not _is_library(frame.filename):
            return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}: {frame.line}'
    return None


def _is_library(filename: str) -> bool:
    """torch, dynexport, the standard library and code generated by exec (``<string>``): code
    that runs the model, not the model. Installed packages (a model library such as
    ultralytics) are the model, wherever their site-packages lies (a virtual environment's
    may see the base interpreter's)."""
    if filename == "<string>" or any(part in filename for part in (f"{os.sep}torch{os.sep}", f"{os.sep}dynexport{os.sep}")):
        return True
    in_packages = any(f"{os.sep}{folder}{os.sep}" in filename for folder in ("site-packages", "dist-packages"))
    return filename.startswith(sysconfig.get_paths()["stdlib"]) and not in_packages


def source_line(node) -> str | None:
    """The innermost model source line of an FX node, from its ``stack_trace`` meta.

    Frames inside torch and dynexport are skipped: the line shown is the user's, or None when
    the trace holds none (e.g. for a plain function, whose frames torch does not record).
    """
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        return None
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = []
    for i, line in enumerate(lines):
        if line.startswith("File "):
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            frames.append(f"{line}: {code}" if code else line)
    # torch.export's generated code (branch and loop bodies) is no user's line either.
    own = (f"{os.sep}torch{os.sep}", f"{os.sep}dynexport{os.sep}", "<eval_with_key>")
    user_frames = [f for f in frames if not any(part in f.split(",")[0] for part in own)]
    return user_frames[-1] if user_frames else None
