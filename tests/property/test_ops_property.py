"""Property-based equivalence: every op in the spec table (tests/property/specs/), exported as
a one-op model and run in onnxruntime (or onnx's reference evaluator where onnxruntime has no
kernel), matches eager PyTorch on hypothesis-drawn shapes, dtypes, values and arguments; dynamic
dims are rerun at grown sizes.

The default ("ci") profile runs one case per op, drawing the dtype, and one per dtype with a
known bug (a strict xfail); DYNEXPORT_HYPOTHESIS_PROFILE=deep runs every op at every dtype with
many more examples. ``python -m tests.property.coverage`` runs every op at every dtype too.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.property.specs import TorchUnsupported, check_spec, spec_cases
from tests.property.strategies import dtypes

DEEP = os.environ.get("DYNEXPORT_HYPOTHESIS_PROFILE") == "deep"


def _param(case_id, spec, dtype_group, reason):
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(spec, dtype_group, reason, id=case_id, marks=marks)


@pytest.mark.parametrize("spec, dtype_group, known_bug", [_param(*case) for case in spec_cases(per_dtype=DEEP)])
def test_one_op_matches_eager(spec, dtype_group, known_bug):
    # A known bug fails on its first examples: shrinking it would only cost time.
    phases = [Phase.explicit, Phase.generate] if known_bug else settings().phases

    @settings(phases=phases)
    @given(data=st.data())
    def check(data):
        dtype = data.draw(dtypes(dtype_group), label="dtype")
        check_spec(spec, dtype, data.draw)

    try:
        check()
    except TorchUnsupported as error:
        pytest.skip(f"PyTorch has no CPU kernel: {error}")
