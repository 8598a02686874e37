"""The whole pipeline: every example model still matches PyTorch after optimization, with fewer
nodes than without; the export flags switch the passes off."""

import pytest
import torch

import dynexport
from dynexport.examples import EXAMPLES
from tests.equivalence import assert_exports_equivalent

# The MLP translates to Gemm, Relu, Gemm, Gelu, Gemm: nothing is left to remove.
ALREADY_MINIMAL = {"mlp"}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_examples_match_with_fewer_nodes(name):
    model, args, dynamic_shapes, resized = EXAMPLES[name]()
    optimized = assert_exports_equivalent(model, args, dynamic_shapes=dynamic_shapes, resized=[resized], atol=1e-4)
    plain = dynexport.export(model, args, dynamic_shapes=dynamic_shapes, optimize=False)
    if name in ALREADY_MINIMAL:
        assert len(optimized.model.graph) == len(plain.model.graph)
    else:
        assert len(optimized.model.graph) < len(plain.model.graph)


def test_without_constant_folding_nothing_is_evaluated():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    x = torch.randn(1, 3, 6, 6)
    folded = assert_exports_equivalent(model, (x,))
    unfolded = assert_exports_equivalent(model, (x,), do_constant_folding=False)
    assert [n.op_type for n in folded.model.graph] == ["Conv"]
    assert [n.op_type for n in unfolded.model.graph] == ["Conv", "BatchNormalization"]
