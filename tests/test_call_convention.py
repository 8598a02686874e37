"""The call convention: a call flattened into the graph's inputs, the outputs put back into the
structure the model returns (dynexport/call_convention.py), in onnxruntime against eager."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import dynexport
from dynexport import runtime
from dynexport.call_convention import OutputLayout, flatten_call, graph_input_values
from tests.equivalence import assert_close


class ReturnsEveryKind(torch.nn.Module):
    """A tensor, None, a symbolic size and a Python constant, nested in a dict and a tuple."""

    def forward(self, x, offset, *, scale):
        return {"y": x * scale + offset, "none": None, "rows": x.shape[0], "pair": (x.sum(0), 2.5)}


@pytest.fixture(scope="module")
def program():
    x, scale = torch.randn(3, 4), torch.tensor(2.0)
    return dynexport.export(
        ReturnsEveryKind(), (x, 1), kwargs={"scale": scale},
        dynamic_shapes={"x": {0: Dim("batch")}, "offset": None, "scale": None},
    )


@pytest.mark.parametrize("batch", [3, 5])
def test_program_returns_the_models_structure_with_numbers_as_tensors(program, batch):
    x, scale = torch.randn(batch, 4), torch.tensor(2.0)
    expected = ReturnsEveryKind()(x, 1, scale=scale)
    actual = program(x, 1, scale=scale)
    assert set(actual) == set(expected) and actual["none"] is None
    assert_close(actual["y"], expected["y"])
    assert_close(actual["pair"][0], expected["pair"][0])
    assert int(actual["rows"]) == expected["rows"] == batch
    assert float(actual["pair"][1]) == expected["pair"][1]


@pytest.mark.parametrize("batch", [3, 5])
def test_output_layout_gives_the_python_values_the_model_returns(program, batch):
    x, scale = torch.randn(batch, 4), torch.tensor(2.0)
    layout = OutputLayout.of(program.exported_program)
    outputs = runtime.run_session(
        runtime.inference_session(program.model_proto.SerializeToString()),
        program.input_feeds(x, 1, scale=scale),
        program.model.graph.outputs,
    )
    expected = ReturnsEveryKind()(x, 1, scale=scale)
    actual = layout.unflatten(outputs, python_values=True)
    assert actual["rows"] == batch and type(actual["rows"]) is int
    assert actual["pair"][1] == 2.5 and actual["none"] is None
    assert_close(actual["y"], expected["y"])


def test_a_call_flattens_in_export_order_and_drops_baked_in_numbers(program):
    x, scale = torch.randn(4, 4), torch.tensor(2.0)
    leaves, _ = flatten_call(program.exported_program, (x, 1), {"scale": scale})
    assert leaves[0] is x and leaves[1] == 1 and leaves[2] is scale
    values = graph_input_values(program.exported_program, (x, 1), {"scale": scale})
    assert len(values) == 2 and values[0] is x and values[1] is scale
    assert list(program.input_feeds(x, 1, scale=scale)) == [v.name for v in program.model.graph.inputs]


def test_a_call_with_other_keywords_is_refused(program):
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="keyword arguments must be"):
        program(x, 1, shift=torch.tensor(2.0))
    with pytest.raises(ValueError, match="leaves"):
        program(x, 1, (2, 3), scale=torch.tensor(2.0))
