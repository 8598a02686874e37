"""Antialiased resampling: ``F.interpolate(..., antialias=True)`` in bilinear and bicubic modes
(``aten._upsample_bilinear2d_aa``, ``aten._upsample_bicubic2d_aa``; timm's ViT and DeiT resize
their position embeddings with the bicubic one under ``dynamic_img_size``).

PyTorch's antialiased kernels are PIL's: when downscaling, the filter is stretched by the scale
so that every input pixel contributes; at the borders, only the taps inside the image count and
their weights are normalized to sum to one; the cubic filter uses a = -0.5 (not the -0.75 of
plain bicubic). ONNX Resize from opset 18 does the same with ``antialias=1``, ``exclude_outside=1``
and ``cubic_coeff_a=-0.5``, from pixel centres ('half_pixel').
"""

from __future__ import annotations

import torch

from dynexport.ops._helpers import argument
from dynexport.ops.resampling import _interpolate, _resizable
from dynexport.registry import translates

aten = torch.ops.aten


def _antialiasable(node: torch.fx.Node) -> bool:
    """One Resize computes the node: floating point, pixel centres (PyTorch's aligned corners
    place the filter otherwise) and sizes or scales Resize can take."""
    return (
        node.args[0].meta["val"].dtype.is_floating_point
        and not argument(node, "align_corners")
        and _resizable(node)
    )


@translates(aten._upsample_bilinear2d_aa.default, aten._upsample_bilinear2d_aa.vec, checker=_antialiasable, min_opset=18)
def upsample_bilinear2d_aa(ctx, input, output_size, align_corners, *scales):
    return _interpolate(ctx, input, output_size, align_corners, mode="linear", antialias=1, exclude_outside=1)


@translates(aten._upsample_bicubic2d_aa.default, aten._upsample_bicubic2d_aa.vec, checker=_antialiasable, min_opset=18)
def upsample_bicubic2d_aa(ctx, input, output_size, align_corners, *scales):
    return _interpolate(
        ctx, input, output_size, align_corners, mode="cubic", cubic_coeff_a=-0.5, antialias=1, exclude_outside=1
    )
