"""The opsets the op tests and property specs run at: dynexport's default and 17, the opset most
deployments pin (TensorRT, OpenVINO, mobile and web runtimes), or the one the environment
variable DYNEXPORT_TEST_LOW_OPSET names (13 to check every rule there once). A test that names
its own ``opset_version`` keeps it.

:data:`LATER_OPSET_OPS` lists the operators that no ONNX opset below a later one expresses, and
why; a test of one wraps its export in :func:`refused_below_its_opset`, which expects the
export to fail with :class:`dynexport.errors.OpsetTooLowError` below that opset. Scatters that
reduce by max or min (scatter_reduce amax/amin, index_reduce, embedding_bag max, segment_reduce
max/min) need opset 18, where ScatterElements and ScatterND take those reductions: a test of one
wraps its export in :func:`max_min_scatter_refused_below_18`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from dynexport.errors import OpsetTooLowError
from dynexport.options import DEFAULT_OPSET
from dynexport.registry import target_name
from tests.equivalence import TESTED_OPSET

LOW_OPSET = int(os.environ.get("DYNEXPORT_TEST_LOW_OPSET", "17"))

# Operator -> (the lowest opset that expresses it, why).
_ANTIALIAS = "Resize filters antialiased (antialias=1) from opset 18; no exact composition of older ops"
LATER_OPSET_OPS = {
    "aten._upsample_bicubic2d_aa.default": (18, _ANTIALIAS),
    "aten._upsample_bilinear2d_aa.default": (18, _ANTIALIAS),
    "aten.grid_sampler_3d.default": (
        20, "GridSample samples volumes (5-D inputs) from opset 20; no exact composition of older ops"
    ),
}


@pytest.fixture(autouse=True, params=[None, LOW_OPSET], ids=["default-opset", f"opset{LOW_OPSET}"])
def tested_opset(request, monkeypatch):
    # Also the default of every export the test makes itself (dynexport.export without opset_version).
    if request.param is not None:
        monkeypatch.setattr("dynexport.options.DEFAULT_OPSET", request.param)
    token = TESTED_OPSET.set(request.param)
    yield request.param
    TESTED_OPSET.reset(token)


@contextlib.contextmanager
def refused_below_its_opset(op) -> Iterator[None]:
    """Run the body, an export of a model using ``op`` (an OpOverload listed in
    :data:`LATER_OPSET_OPS`) at the tested opset: below ``op``'s opset it must raise
    OpsetTooLowError naming ``op`` and that opset (and the test ends there)."""
    name = target_name(op)
    min_opset, _ = LATER_OPSET_OPS[name]
    opset = TESTED_OPSET.get() or DEFAULT_OPSET
    if opset >= min_opset:
        yield
        return
    with pytest.raises(OpsetTooLowError) as raised:
        yield
    assert [(use.target, use.min_opset) for use in raised.value.uses] == [(name, min_opset)]
    assert f"opset_version={min_opset}" in str(raised.value)


# ONNX's ScatterElements and ScatterND reduce by max and min from opset 18 (onnxruntime's kernels
# accept them earlier; other runtimes do not).
MAX_MIN_SCATTER_OPSET = 18
MAX_MIN_SCATTER_REFUSAL = (
    "scatters that reduce by max or min (`aten.scatter_reduce` amax/amin, `aten.index_reduce` amax/amin, "
    "`aten._embedding_bag` max, `aten.segment_reduce` max/min): from opset 18, where ScatterElements and "
    "ScatterND take those reductions"
)


@contextlib.contextmanager
def max_min_scatter_refused_below_18(reduce: str) -> Iterator[None]:
    """Run the body, an export of a scatter reducing by ``reduce`` (PyTorch's name): below
    opset 18, a max or min reduction must raise OpsetTooLowError naming opset 18."""
    opset = TESTED_OPSET.get() or DEFAULT_OPSET
    if reduce not in ("amax", "amin", "max", "min") or opset >= MAX_MIN_SCATTER_OPSET:
        yield
        return
    with pytest.raises(OpsetTooLowError, match=r"reduction '(max|min)' exists from opset 18") as raised:
        yield
    assert f"opset_version={MAX_MIN_SCATTER_OPSET}" in str(raised.value)
