"""transformers' grouped-query attention is captured as SDPA with ``enable_gqa=True``
(dynexport/grouped_attention.py) and still computes what the eager model computes."""

import warnings

import pytest
import torch

from tests.equivalence import assert_exports_equivalent

transformers = pytest.importorskip("transformers")
sdpa_attention = pytest.importorskip("transformers.integrations.sdpa_attention")

from tests.models.families import DECODERS, text_dims, text_inputs  # noqa: E402


def _attention_calls(program):
    return [
        node for node in program.exported_program.graph.nodes
        if node.target is torch.ops.aten.scaled_dot_product_attention.default
    ]


@pytest.mark.parametrize("opset", [18, 23])
def test_grouped_query_heads_reach_sdpa_whole_and_match_eager(opset):
    torch.manual_seed(0)
    model = DECODERS["llama"](False).eval()  # 4 query heads, 2 key-value heads
    inputs = text_inputs(2, 7)
    original = sdpa_attention.use_gqa_in_sdpa
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = assert_exports_equivalent(
            model, (), inputs, dynamic_shapes=text_dims(list(inputs)), opset_version=opset,
            resized=[((), text_inputs(3, 12)), ((), text_inputs(1, 5))],
        )
    assert sdpa_attention.use_gqa_in_sdpa is original  # the eager model is left as it was
    if opset == 18:  # at 23 the attention fusion has replaced the calls by then
        calls = _attention_calls(program)
        assert len(calls) == 2 and all(call.kwargs.get("enable_gqa") for call in calls)
        assert calls[0].args[1].meta["val"].shape[1] == 2  # the key's 2 heads, not repeated to 4
