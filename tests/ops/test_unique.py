"""The unique family's rules: values, inverse and counts, at every integer dtype in onnxruntime."""

from __future__ import annotations

import pytest
import torch

from tests.equivalence import assert_exports_equivalent


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32])
def test_unique_at_every_dtype_in_onnxruntime(dtype):
    # onnxruntime's Unique has no bool, uint8, int16 or int32 kernel: those compute in int64.
    x = (torch.randn(4, 3) * 3).to(dtype)
    assert_exports_equivalent(
        lambda a: (
            torch.unique(a, return_inverse=True, return_counts=True),
            torch.unique(a, dim=0, return_inverse=True, return_counts=True),
        ),
        (x,), runtime="onnxruntime",
    )
