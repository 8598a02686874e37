"""export_modules_as_functions: module calls become ONNX local functions."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest
import torch
from torch import nn

import dynexport
from dynexport.examples import EXAMPLES
from dynexport.module_functions import DOMAIN
from tests.equivalence import assert_exports_equivalent


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(torch.relu(self.lin(x)) + x * 0.5)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.second = Block()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.second(self.first(x)))


def _function_calls(program):
    return Counter(node.op_type for node in program.model.graph if node.domain == DOMAIN)


def test_selected_class_becomes_one_shared_function():
    torch.manual_seed(0)
    program = assert_exports_equivalent(
        Stack().eval(), (torch.randn(3, 4),), export_modules_as_functions={Block},
        dynamic_shapes=({0: torch.export.Dim("batch")},), resized=[(torch.randn(6, 4),)],
    )
    assert _function_calls(program) == {"Block": 2}
    assert [f.name for f in program.model_proto.functions] == ["Block"]
    assert program.model.opset_imports[DOMAIN] == 1
    onnx.checker.check_model(program.model_proto, full_check=True)


def test_true_nests_every_module():
    torch.manual_seed(0)
    program = assert_exports_equivalent(Stack().eval(), (torch.randn(3, 4),), export_modules_as_functions=True)
    assert _function_calls(program) == {"Block": 2, "Linear": 1}
    functions = {f.name: f for f in program.model_proto.functions}
    assert {"Block", "Linear", "LayerNorm"} <= set(functions)
    inner = Counter(node.op_type for node in functions["Block"].node if node.domain == DOMAIN)
    assert inner == {"Linear": 1, "LayerNorm": 1}


def test_modules_with_different_bodies_get_separate_definitions():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            self.b = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

        def forward(self, x):
            return self.b(self.a(x))

    program = assert_exports_equivalent(
        Mixed().eval(), (torch.randn(2, 4),), export_modules_as_functions={nn.Sequential}
    )
    assert sorted(f.name for f in program.model_proto.functions) == ["Sequential", "Sequential_1"]


def test_transformer_example_as_functions():
    model, args, dynamic_shapes, resized = EXAMPLES["tiny_gpt"]()
    block_type = type(model.blocks[0])
    program = assert_exports_equivalent(
        model, args, dynamic_shapes=dynamic_shapes, resized=[resized], atol=1e-4,
        export_modules_as_functions={block_type},
    )
    assert _function_calls(program) == {block_type.__name__: len(model.blocks)}


def test_bad_selection_is_rejected():
    with pytest.raises(TypeError, match="export_modules_as_functions"):
        dynexport.export(Stack(), (torch.randn(2, 4),), export_modules_as_functions={"Block"})
