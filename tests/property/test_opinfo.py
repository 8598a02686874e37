"""PyTorch's OpInfo samples (op_db) through export and onnxruntime, compared with eager PyTorch.

op_db is imported once per worker (it is large), so the OpInfos are split into shards instead of
one test each. By default every OpInfo runs its first samples at float32 and int64; with
DYNEXPORT_HYPOTHESIS_PROFILE=deep, every ONNX-representable dtype and more samples. Samples our
table cannot export (UnsupportedOperatorError) are gaps, recorded by ``tests.property.coverage``;
failures must be in KNOWN_FAILURES, and a known failure that passes must leave it.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("expecttest", reason="op_db needs expecttest (pip install expecttest)")

from tests.property.opinfo import (  # noqa: E402
    KNOWN_FAILURES,
    dtypes_of,
    opinfo_id,
    opinfos,
    run_opinfo,
)

DEEP = os.environ.get("DYNEXPORT_HYPOTHESIS_PROFILE") == "deep"
SHARDS = 8


def _samples(dtype: torch.dtype) -> int:
    if DEEP:
        return 8
    return 2 if dtype is torch.float32 else 1


@pytest.mark.parametrize("shard", range(SHARDS))
def test_opinfo_samples_match_eager(shard):
    failures, fixed = [], []
    for op in opinfos()[shard::SHARDS]:
        for dtype in dtypes_of(op, DEEP):
            outcomes = run_opinfo(op, dtype, _samples(dtype))
            failed = [o.detail for o in outcomes if o.status == "fail"]
            known = KNOWN_FAILURES.get((opinfo_id(op), dtype))
            if failed and not known:
                failures.append(f"{opinfo_id(op)} {dtype}: {failed[0]}")
            elif known and not failed and not DEEP:
                fixed.append(f"{opinfo_id(op)} {dtype} passes now: remove it from KNOWN_FAILURES")
    assert not failures and not fixed, "\n".join(failures + fixed)
