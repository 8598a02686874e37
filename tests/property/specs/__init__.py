"""The property tests' spec table: one entry per covered operator.

An :class:`OpSpec` says how to build the one-op call (``fn(*tensors, **args)``), which dtypes to
try, and how to draw its inputs (``sample(draw, dtype) -> (tensors, args)``) from the strategies
in :mod:`tests.property.strategies`. The specs live by family, one module per dynexport/ops/
module, each sampler beside the specs that use it and the shared ones in
:mod:`tests.property.specs.common`. Adding an operator is adding one entry to its family's
``SPECS``.

Specs call ATen overloads directly where they can, so that the exported program holds exactly
the overload under test (``tests.property.coverage`` reads which overloads each run exercised
from the exported program itself).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import reject
from hypothesis import strategies as st

from tests.equivalence import assert_dynamic_equivalent
from tests.property.specs import (
    activation,
    attention,
    convolution,
    creation,
    elementwise,
    indexing,
    linalg,
    normalization,
    padding,
    pooling,
    random,
    recurrent,
    reduction,
    resampling,
    shape,
    sorting,
    symbolic,
    unique,
)
from tests.property.specs.common import OpSpec

__all__ = ["OpSpec", "SPECS", "TorchUnsupported", "check_spec", "spec_cases"]

SPECS: list[OpSpec] = [
    *elementwise.SPECS,
    *activation.SPECS,
    *reduction.SPECS,
    *indexing.SPECS,
    *recurrent.SPECS,
    *unique.SPECS,
    *shape.SPECS,
    *padding.SPECS,
    *linalg.SPECS,
    *convolution.SPECS,
    *pooling.SPECS,
    *normalization.SPECS,
    *attention.SPECS,
    *resampling.SPECS,
    *random.SPECS,
    *sorting.SPECS,
    *creation.SPECS,
    *symbolic.SPECS,
]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class TorchUnsupported(Exception):
    """Eager PyTorch has no CPU kernel for this op and dtype."""


def spec_cases(per_dtype: bool = True) -> list[tuple[str, OpSpec, tuple[torch.dtype, ...], str | None]]:
    """The (id, spec, dtypes, xfail reason) cases the property tests run: one per spec and
    dtype, or (``per_dtype=False``) one per spec drawing its dtype among those without a known
    bug, plus one per dtype with a known bug."""
    cases = []
    for spec in SPECS:
        failing = [d for d in spec.dtypes if d in spec.xfail or None in spec.xfail]
        if per_dtype:
            groups = [(d,) for d in spec.dtypes]
        else:
            passing = tuple(d for d in spec.dtypes if d not in failing)
            groups = ([passing] if passing else []) + [(d,) for d in failing]
        for group in groups:
            suffix = _dtype_name(group[0]) if len(group) == 1 else "any"
            reason = spec.xfail.get(group[0]) or spec.xfail.get(None) if group[0] in failing else None
            cases.append((f"{spec.name}-{suffix}", spec, group, reason))
    return cases


# Where onnxruntime's CPU provider has no kernel for an op's ONNX form, a case runs in onnx's
# reference evaluator: bfloat16 (most ops have no CPU kernel for it), and float64 for these ops'
# Conv, ConvTranspose, AveragePool, GlobalAveragePool, Resize and Det. Everywhere else a model
# onnxruntime does not load fails the case: a rule emits what onnxruntime runs.
_FLOAT64_IN_REFERENCE = (
    "convolution.default",
    "conv3d.",
    "avg_pool3d.",
    "_adaptive_avg_pool",
    "upsample_",
    "_upsample_",
    "linalg_det.",
)


def _runtime(spec: OpSpec, dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16 or (dtype == torch.float64 and spec.name.startswith(_FLOAT64_IN_REFERENCE)):
        return "auto"
    return "onnxruntime"


def check_spec(spec: OpSpec, dtype: torch.dtype, draw: Callable):
    """Draw one input set for ``spec`` at ``dtype``, export the one-op model, run it and compare
    with eager PyTorch (again at grown sizes of the dynamic dims). Returns the ONNXProgram.

    Inputs that eager PyTorch itself rejects are rejected from the search; a dtype eager PyTorch
    has no kernel for raises :class:`TorchUnsupported`.
    """
    inputs, args = spec.sample(draw, dtype)

    def one_op(*tensors):
        return spec.fn(*tensors, **args)

    try:
        with torch.no_grad():
            one_op(*inputs)
    except (NotImplementedError, RuntimeError) as error:
        if "not implemented for" in str(error):
            raise TorchUnsupported(str(error).splitlines()[0]) from error
        reject()
    except Exception:
        reject()
    growth = (lambda name: draw(st.integers(1, 3), label=f"growth of {name}")) if spec.dynamic else None
    rtol, atol = spec.tolerances.get(dtype, (None, None))
    return assert_dynamic_equivalent(
        one_op,
        inputs,
        growth=growth,
        rtol=rtol,
        atol=atol,
        runtime=_runtime(spec, dtype),
        check_values=spec.check_values,
        dynamic=not spec.static,
        float64_reference=True,
    )
