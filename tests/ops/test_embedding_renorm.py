"""``nn.Embedding(max_norm=...)`` (aten.embedding_renorm) against onnxruntime: rows looked up
and longer than ``max_norm`` are scaled down, in the lookup and in the weight."""

from __future__ import annotations

import pytest
import torch

from tests.equivalence import assert_exports_equivalent

Dim = torch.export.Dim


class Renormed(torch.nn.Module):
    """The renormalized weight itself, and a lookup from it."""

    def __init__(self, norm_type: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(12, 5) * 2, requires_grad=False)
        self.norm_type = norm_type

    def forward(self, indices):
        weight = torch.ops.aten.embedding_renorm(self.weight, indices, 1.5, self.norm_type)
        return weight, torch.nn.functional.embedding(indices, weight)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_rows_looked_up_are_renormed_at_dynamic_sizes(norm_type):
    torch.manual_seed(0)
    indices = torch.tensor([[1, 3, 3, 7], [0, 1, 11, 7]])  # rows 2, 4-6, 8-10 are never looked up
    assert_exports_equivalent(
        Renormed(norm_type), (indices,), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq")},),
        resized=[(torch.tensor([[2, 2, 9], [4, 5, 2], [10, 10, 10]]),)], atol=1e-5,
    )


def test_embedding_with_max_norm():
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4, max_norm=1.0).eval()
    with torch.no_grad():
        embedding.weight.mul_(3)
    indices = torch.tensor([[1, 2, 2, 5]])
    expected = embedding.weight.detach().clone()
    assert_exports_equivalent(
        embedding, (indices,), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq")},),
        resized=[(torch.tensor([[0, 9], [9, 3], [4, 4]]),)], atol=1e-5,
    )
    assert not torch.equal(expected, embedding.weight)  # eager renormed its weight in place
