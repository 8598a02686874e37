"""Views of contiguous tensors during capture: dynexport.contiguous_views."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from dynexport.contiguous_views import contiguous_views_direct
from tests.equivalence import assert_exports_equivalent


def _symbolic(mode: FakeTensorMode, *sizes: int) -> torch.Tensor:
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(sizes))
    return mode.from_tensor(torch.empty(*sizes), symbolic_context=context)


def _windows_merged(patched: bool) -> tuple[list[str], torch.Tensor]:
    """The guards Swin's view of its attention windows back into a map of windows (padded rows
    and columns of 4) adds, and that view."""
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    batch, rows, columns, channels = _symbolic(mode, 2, 13, 10, 8).shape
    with mode, (contiguous_views_direct() if patched else contextlib.nullcontext()):
        across, down = (rows + (4 - rows % 4) % 4) // 4, (columns + (4 - columns % 4) % 4) // 4
        windows = torch.empty(batch * across * down, 16, channels)
        before = len(shape_env.guards)
        merged = windows.view(batch, across, down, 4, 4, channels)
    return [str(guard.expr) for guard in shape_env.guards[before:]], merged


def test_view_of_a_contiguous_tensor_of_the_same_element_count_skips_the_search_guards():
    guards, merged = _windows_merged(patched=True)
    assert merged.shape[3:5] == (4, 4) and merged.is_contiguous()
    # torch's own search asks about each split it tries (`Ne(s0, s0*(h//4)*(w//4))`, ...)
    searched = _windows_merged(patched=False)[0]
    assert set(guards) < set(searched) and len(searched) - len(guards) >= 5


def test_inferred_length_of_an_exact_division_is_the_quotient():
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    batch, windows, channels = _symbolic(mode, 2, 6, 8).shape
    with mode, contiguous_views_direct():
        tokens = torch.empty(batch * windows, 16, channels)
        before = len(shape_env.guards)
        rows = tokens.view(-1, 4, 4, channels)
    assert rows.shape[0] == batch * windows and len(shape_env.guards) == before


def test_view_whose_element_count_is_not_provably_the_same_is_left_to_torch():
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    x = _symbolic(mode, 2, 12, 20, 3)
    with mode, contiguous_views_direct():
        batch, rows, columns, channels = x.shape
        x.view(batch, rows // 4, 4, columns // 4, 4, channels)  # whole windows only if 4 divides the sides
        x.view(batch, -1, 4, channels)  # the -1 exact only if 4 divides rows * columns
    guards = [str(guard.expr) for guard in shape_env.guards]
    assert any("Mod" in guard for guard in guards), guards


def test_view_of_a_strided_input_is_left_to_torch():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = _symbolic(mode, 2, 6, 4)
    with mode, contiguous_views_direct():
        rows = x[:, 1:]  # not contiguous: the batch stride still spans 6 rows
        flattened = rows.view(rows.shape[0], -1)
        assert flattened.stride() == (x.stride(0), 1)
        with pytest.raises(ValueError, match="Cannot view a tensor"):
            rows.view(-1, rows.shape[2])


def test_torch_kernels_are_restored_after_the_block():
    kernels = dict(fake_impls.op_implementations_dict)
    with contiguous_views_direct():
        assert fake_impls.op_implementations_dict[torch.ops.aten.view.default] is not kernels[torch.ops.aten.view.default]
    assert fake_impls.op_implementations_dict == kernels


class _WindowAttention(torch.nn.Module):
    """Swin's window partition: pad the map to whole windows, attend within each, merge back."""

    def __init__(self, window: int = 4, channels: int = 8):
        super().__init__()
        self.window = window
        self.qkv = torch.nn.Linear(channels, 3 * channels)

    def forward(self, x):  # (batch, height, width, channels)
        batch, height, width, channels = x.shape
        s = self.window
        x = F.pad(x, (0, 0, 0, (s - width % s) % s, 0, (s - height % s) % s))
        _, rows, columns, _ = x.shape
        x = x.view(batch, rows // s, s, columns // s, s, channels).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, channels)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.view(batch, rows // s, columns // s, s, s, channels).permute(0, 1, 3, 2, 4, 5).reshape(batch, rows, columns, channels)
        return x[:, :height, :width, :].contiguous()


def test_window_attention_over_dynamic_sides_matches_eager():
    torch.manual_seed(0)
    assert_exports_equivalent(
        _WindowAttention().eval(), (torch.randn(2, 12, 16, 8),),
        dynamic_shapes=({0: Dim("batch"), 1: 4 * Dim("h"), 2: 4 * Dim("w")},),
        resized=[(torch.randn(3, 8, 20, 8),), (torch.randn(1, 4, 4, 8),), (torch.randn(2, 32, 4, 8),)],
    )


class _ShiftedWindowAttention(_WindowAttention):
    """Swin's shifted block: the map rolled by half a window, and a mask written region by region
    into a zeros map (in-place writes into views: the program is re-traced to functionalize it,
    its views again without torch's search)."""

    def forward(self, x):
        batch, height, width, channels = x.shape
        s = self.window
        regions = x.new_zeros(1, height, width, 1)
        regions[:, -s:, :, :] = 1
        regions[:, :, -s:, :] += 2
        shifted = torch.roll(x, (-(s // 2), -(s // 2)), (1, 2)) + regions
        return torch.roll(super().forward(shifted), (s // 2, s // 2), (1, 2))


def test_shifted_window_attention_over_dynamic_sides_matches_eager():
    torch.manual_seed(0)
    assert_exports_equivalent(
        _ShiftedWindowAttention().eval(), (torch.randn(2, 12, 16, 8),),
        dynamic_shapes=({0: Dim("batch"), 1: 4 * Dim("h"), 2: 4 * Dim("w")},),
        resized=[(torch.randn(3, 8, 20, 8),), (torch.randn(1, 4, 4, 8),)],
    )


class _TokensAfterTheFirst(torch.nn.Module):
    def forward(self, x):  # (batch, tokens, channels): the slice is not contiguous
        rest = x[:, 1:]
        return rest.view(rest.shape[0], -1) * 2


def test_view_of_a_strided_input_matches_eager():
    assert_exports_equivalent(
        _TokensAfterTheFirst(), (torch.randn(2, 6, 4),),
        dynamic_shapes=({0: Dim("batch"), 1: Dim("tokens", min=3)},),
        resized=[(torch.randn(3, 9, 4),), (torch.randn(1, 3, 4),)],
    )
