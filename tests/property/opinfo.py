"""PyTorch's own OpInfo sample inputs (``common_methods_invocations.op_db``) through export and
onnxruntime.

Which OpInfos we cover is decided by exporting: a sample whose export raises
UnsupportedOperatorError is a gap (its operators are recorded), one torch.export cannot capture
(data-dependent output shapes, Python-side checks) is skipped as such; complex dtypes, random
ops and outputs that are not tensors are not compared. Everything else must match eager PyTorch.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import torch
import torch.utils._pytree as pytree

from dynexport.errors import CaptureError, UnsupportedOperatorError
from tests.equivalence import assert_dynamic_equivalent
from tests.property.strategies import ALL

__all__ = ["KNOWN_FAILURES", "Outcome", "check_sample", "opinfos", "run_opinfo"]

# Random outputs cannot be compared with eager values.
_RANDOM = ("rand", "normal", "bernoulli", "multinomial", "dropout", "uniform", "poisson", "exponential", "geometric", "cauchy", "log_normal", "randperm", "empty", "new_empty")

# OpInfo (name, dtype) pairs whose first samples fail for a known reason: the OpInfo test checks
# they still fail (a fixed one must leave this table) and that nothing else fails.
_TIES = "ties: which index PyTorch returns among equal values is unspecified (the samples repeat values)"
_FIXED_POINT = "PyTorch's uint8 bilinear and bicubic kernels interpolate in fixed point: elements differ by a unit or two"
_AVERAGE_POOL_F64 = (
    "onnxruntime has no float64 AveragePool; onnx's reference evaluator, which runs it instead, "
    "miscounts ceil-mode windows (the float32 graph passes in onnxruntime)"
)
# as_strided.partial_views' input is itself a view into a larger storage, which a graph input
# has not: the rule refuses it by design (tests/ops/test_shape.py), naming .contiguous() as the fix.
_STORAGE_VIEW = "the sample's input is a view (storage offset 5): as_strided over a view is refused, ONNX tensors have no storage"
# histc's rule refuses half types by design (tests/ops/test_reduction.py), naming x.float() as the fix.
_HALF_HISTC = (
    "histc of float16/bfloat16 counts in that dtype's arithmetic (PyTorch's kernel computes each bin in "
    "it), which the rule does not reproduce: refused, naming histc(x.float()) as the fix"
)
# Narrow dtypes repeat values in every sample; int64's first samples only for kthvalue and topk.
_TIED_SAMPLES = (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float16, torch.bfloat16)
KNOWN_FAILURES: dict[tuple[str, torch.dtype], str] = {
    ("kthvalue", torch.int64): _TIES,
    ("topk", torch.int64): _TIES,
    **{(name, dtype): _TIES for name in ("kthvalue", "topk", "sort", "argsort") for dtype in _TIED_SAMPLES},
    **{
        (name, torch.uint8): _FIXED_POINT
        for name in ("nn.functional.interpolate.bilinear", "nn.functional.interpolate.bicubic", "nn.functional.upsample_bilinear")
    },
    ("nn.functional.avg_pool2d", torch.float64): _AVERAGE_POOL_F64,
    **{("as_strided.partial_views", dtype): _STORAGE_VIEW for dtype in ALL},
    **{("histc", dtype): _HALF_HISTC for dtype in (torch.float16, torch.bfloat16)},
}


@dataclasses.dataclass
class Outcome:
    """What one OpInfo sample did: ``status`` is "pass", "gap" (no rule, no decomposition),
    "capture" (torch.export cannot capture it), "skip" (not comparable) or "fail"."""

    status: str
    detail: str = ""
    aten_ops: tuple[str, ...] = ()


@functools.cache
def opinfos() -> tuple[Any, ...]:
    """The OpInfos worth exporting (imported lazily: op_db is large)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return tuple(op for op in op_db if not any(word in op.name for word in _RANDOM))


def opinfo_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _aten_ops(program) -> tuple[str, ...]:
    graph = program.exported_program.graph
    return tuple(sorted({str(n.target) for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}))


def check_sample(op, sample) -> Outcome:
    """Export ``op`` on one sample, run it and compare it with eager PyTorch."""
    if sample.kwargs.get("training") is True:
        return Outcome("skip", "random output (training-mode dropout)")
    flat, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(flat) if isinstance(leaf, torch.Tensor)]
    tensors = [flat[i] for i in positions]
    if any(t.is_complex() or t.layout != torch.strided for t in tensors):
        return Outcome("skip", "complex or sparse input")

    def one_op(*values):
        leaves = list(flat)
        for i, value in zip(positions, values):
            leaves[i] = value
        x, args, kwargs = pytree.tree_unflatten(leaves, spec)
        return op.op(x, *args, **kwargs)

    try:
        with torch.no_grad():
            expected = one_op(*tensors)
    except Exception as error:
        return Outcome("skip", f"eager PyTorch raises {type(error).__name__}")
    leaves = pytree.tree_leaves(expected)
    if not leaves or not all(isinstance(v, torch.Tensor) and not v.is_complex() for v in leaves):
        return Outcome("skip", "outputs that are not real tensors")
    try:
        program = assert_dynamic_equivalent(one_op, tensors, dynamic=False, float64_reference=True)
    except UnsupportedOperatorError as error:
        return Outcome("gap", ", ".join(use.target for use in error.uses) if hasattr(error, "uses") else str(error).splitlines()[1].strip())
    except CaptureError as error:
        return Outcome("capture", str(error).splitlines()[1].strip()[:160] if len(str(error).splitlines()) > 1 else str(error)[:160])
    except Exception as error:
        message = " ".join(str(error).split())[:300]
        return Outcome("fail", f"{type(error).__name__}: {message}")
    return Outcome("pass", aten_ops=_aten_ops(program))


def run_opinfo(op, dtype: torch.dtype, samples: int) -> list[Outcome]:
    """The outcomes of ``op``'s first ``samples`` sample inputs at ``dtype`` (seeded)."""
    if dtype not in op.supported_dtypes("cpu"):
        return []
    torch.manual_seed(0)
    try:
        generator = op.sample_inputs("cpu", dtype, requires_grad=False)
        generated = list(itertools.islice(generator, samples))
        # Closed now: a generator finalized later would run its cleanup under an export's tracer.
        getattr(generator, "close", lambda: None)()
    except Exception as error:
        return [Outcome("skip", f"sample_inputs raises {type(error).__name__}")]
    return [check_sample(op, sample) for sample in generated]


def dtypes_of(op, deep: bool) -> list[torch.dtype]:
    """The dtypes an OpInfo is run at: float32 and int64 by default, every dtype ONNX has when
    ``deep``."""
    supported = op.supported_dtypes("cpu")
    wanted = ALL if deep else (torch.float32, torch.int64)
    return [d for d in wanted if d in supported]
