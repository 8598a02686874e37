"""A representative subset of the model suite exported at the low opsets deployments pin (17, and
13, the lowest dynexport accepts): each graph is checked in onnxruntime (tests/equivalence.py) and,
where it is installed, in OpenVINO, at the export size and at resized inputs."""

from __future__ import annotations

import importlib.util

import pytest

from tests.equivalence import assert_exports_equivalent
from tests.models.cases import CASES
from tests.openvino_runner import assert_openvino_matches

LOW_OPSETS = [17, 13]

# A CNN with BatchNorm and pooling, an AlexNet-like one with max pooling, an MLP, a transformer
# encoder and a GPT-like LM (the shipped examples), an LSTM/GRU tagger, a tiny BERT and a tiny
# GPT-2 with its KV cache.
SUBSET = [
    "tiny_resnet",
    "alexnet_like",
    "mlp",
    "transformer_encoder",
    "tiny_gpt",
    "lstm_gru_tagger",
    "bert",
    "gpt2_kv_cache",
]

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


@pytest.mark.parametrize("opset", LOW_OPSETS)
@pytest.mark.parametrize("name", SUBSET)
def test_model_at_low_opset(name, opset):
    case = CASES[name]()
    (args, kwargs), resized = case.calls[0], case.resized
    program = assert_exports_equivalent(
        case.model,
        args,
        kwargs,
        resized=resized,
        dynamic_shapes=case.dynamic_shapes,
        opset_version=opset,
        atol=case.atol,
    )
    default_domain = {o.domain: o.version for o in program.model_proto.opset_import}.get("")
    assert default_domain == opset
    if HAS_OPENVINO:
        assert_openvino_matches(program, case.model, case.calls, atol=case.atol)
