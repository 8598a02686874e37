"""Importing dynexport changes nothing in torch: the kernels it registers for capture (meta
kernels for fake quantization) exist only while a model is being captured."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_IMPORT_THEN_EXPORT = textwrap.dedent("""
    import torch

    def meta_kernels():  # torch's own modules that dynexport imports register kernels of their namespaces
        return {k for k in torch._C._dispatch_get_registrations_for_dispatch_key("Meta") if k.startswith("aten::")}

    before = meta_kernels()
    import dynexport
    import dynexport.ops
    assert meta_kernels() == before, sorted(meta_kernels() ^ before)
    assert "aten::fake_quantize_per_tensor_affine_cachemask" not in before

    class FakeQuantized(torch.nn.Module):
        def forward(self, x):
            return torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127) * 2

    model, x = FakeQuantized(), torch.randn(4, 3)
    program = dynexport.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    for rows in (4, 7):
        y = torch.randn(rows, 3)
        torch.testing.assert_close(program(y), model(y))
    assert meta_kernels() == before, sorted(meta_kernels() ^ before)
""")


def test_importing_and_exporting_leave_torch_dispatcher_as_it_was():
    result = subprocess.run([sys.executable, "-c", _IMPORT_THEN_EXPORT], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
