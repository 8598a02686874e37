"""The wider zoo: timm families and the rest of torchvision (segmentation, video, optical flow,
the transformer classifiers), each built small with random weights (nothing downloaded),
exported with a dynamic batch, and dynamic spatial dims where the model allows, then compared
with eager PyTorch in onnxruntime at the export size and at another (docs/models.md lists each
family's dims and limits).

Dims are plain ``Dim``s with wide ranges: what a model requires of them (a multiple of its
stride, a minimum size) torch.export states as suggested fixes, which capture applies
(dynexport/dim_refinement.py); models that branch on divisibility or on a feature map's size
are declared multiples of their stride from a minimum. A handful of families run by default;
the rest are slow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.equivalence import BATCH, assert_exports_equivalent
from tests.models.test_torchvision import calibrated

Dim = torch.export.Dim


@dataclasses.dataclass(frozen=True)
class Family:
    """One model: ``build(library)`` makes it (the ``timm`` or ``torchvision`` fixture's module);
    it takes ``inputs`` tensors of shape ``(batch, *example)``, exported at batch 2 and checked
    again at batch 3 with shape ``(3, *other)``; ``dynamic`` names the input dims (0 is the batch)
    exported dynamic besides the batch, each declared a multiple of ``multiple`` from ``minimum``
    (the smallest size the model takes; ``multiple``, or 2 for plain dims, if None), or of the
    entries of ``multiple`` and ``minimum`` in the order of ``dynamic`` when they are tuples."""

    name: str
    build: Callable[[Any], torch.nn.Module]
    example: tuple[int, ...] = (3, 64, 64)
    other: tuple[int, ...] = (3, 96, 128)
    dynamic: tuple[int, ...] = (2, 3)
    inputs: int = 1
    multiple: int | tuple[int, ...] = 1
    minimum: int | None | tuple[int, ...] = None

    def tensors(self, batch: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(batch * 1000 + sum(shape))
        return tuple(torch.rand(batch, *shape, generator=generator) for _ in range(self.inputs))


def timm_family(
    name: str, *, example=(3, 64, 64), other=(3, 96, 128), dynamic=(2, 3), multiple=1, minimum=None, **config
) -> Family:
    def build(timm):
        return timm.create_model(name, pretrained=False, num_classes=10, **config)

    return Family(name, build, example, other, dynamic, multiple=multiple, minimum=minimum)


def still(name: str, **config) -> Family:
    """A timm family whose image size is fixed by the model (position embeddings, attention
    biases sized at construction): the batch alone is dynamic."""
    return timm_family(name, other=(3, 64, 64), dynamic=(), **config)


TIMM = [
    timm_family("resnet10t"),
    timm_family("mobilenetv3_small_050"),
    timm_family("convnext_atto"),
    timm_family("deit_tiny_patch16_224", img_size=64, depth=2, dynamic_img_size=True),
    # Each branch resizes the image to its own size (120 and 112 pixels, multiples of its patch)
    # with bicubic interpolation, unless it has that size already: torch.export raises the height's
    # minimum to 121, and the width, which that branch never reads, stays free.
    timm_family("crossvit_tiny_240", img_size=120, depth=((1, 1, 0),), example=(3, 128, 128), other=(3, 160, 96)),
]
SLOW_TIMM = [
    timm_family("efficientnet_b0"),
    timm_family("vit_tiny_patch16_224", img_size=64, depth=2, dynamic_img_size=True),
    still("swin_tiny_patch4_window7_224", img_size=64, window_size=4, embed_dim=24, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1)),
    timm_family("regnetx_002"),
    timm_family("rexnet_100"),
    timm_family("ghostnet_050"),
    # At 64 pixels its last attention gate pools a 2x2 map to 1x1, and torch specializes size-1
    # dims: the example is 128, and the sides' minimum becomes 97.
    timm_family("ghostnetv2_100", example=(3, 128, 128), other=(3, 160, 192)),
    timm_family("poolformer_s12"),
    timm_family("nf_regnet_b0"),
    timm_family("res2net50_26w_4s", layers=(1, 1, 1, 1)),
    timm_family("pvt_v2_b0"),
    timm_family("edgenext_xx_small"),
    timm_family("fastvit_t8"),
    timm_family("efficientvit_b0"),
    still("levit_128s", img_size=64),
    # Its blocks branch on whether feature maps divide into 2x2 patches (else they interpolate),
    # so sides are multiples of 32; at 64 pixels its last stage holds one patch, and torch
    # specializes size-1 dims.
    timm_family("mobilevit_xxs", example=(3, 128, 128), other=(3, 192, 256), multiple=32),
    still("coat_lite_tiny", img_size=64),
    still("twins_svt_small", img_size=64, depths=(1, 1, 1, 1)),
    still("cait_xxs24_224", img_size=64, depth=2),
    still("beit_base_patch16_224", img_size=64, embed_dim=48, depth=2, num_heads=2),
    timm_family("dla46_c"),
    timm_family("hrnet_w18_small"),
    timm_family("tresnet_m", layers=(1, 1, 1, 1)),
    timm_family("xception41"),
    timm_family("inception_v3", example=(3, 160, 160), other=(3, 192, 224)),
]


def torchvision_family(name: str, builder: Callable[[Any], torch.nn.Module], **shapes) -> Family:
    return Family(name, builder, **shapes)


def tiny_vit(tv):
    return tv.models.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)


def tiny_swin(tv):
    return tv.models.swin_transformer.SwinTransformer(
        patch_size=[4, 4], embed_dim=24, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=[4, 4],
        stochastic_depth_prob=0.0, num_classes=10,
    )


def tiny_maxvit(tv):
    return tv.models.maxvit.MaxVit(
        input_size=(64, 64), stem_channels=16, partition_size=4, block_channels=[16, 32], block_layers=[1, 1],
        head_dim=8, stochastic_depth_prob=0.0, num_classes=10,
    )


def tiny_convnext(tv):
    from torchvision.models.convnext import CNBlockConfig

    return tv.models.convnext.ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)


def tiny_swin3d(tv):
    return tv.models.video.swin_transformer.SwinTransformer3d(
        patch_size=[2, 4, 4], embed_dim=24, depths=[1, 1], num_heads=[1, 1], window_size=[2, 4, 4],
        stochastic_depth_prob=0.0, num_classes=10,
    )


def tiny_mvit(tv):
    from torchvision.models.video.mvit import MSBlockConfig

    blocks = [
        MSBlockConfig(num_heads=1, input_channels=16, output_channels=16, kernel_q=[3, 3, 3], kernel_kv=[3, 3, 3], stride_q=[1, 1, 1], stride_kv=[1, 4, 4]),
        MSBlockConfig(num_heads=2, input_channels=16, output_channels=32, kernel_q=[3, 3, 3], kernel_kv=[3, 3, 3], stride_q=[1, 2, 2], stride_kv=[1, 2, 2]),
    ]
    return tv.models.video.mvit.MViT(
        spatial_size=(32, 32), temporal_size=4, block_setting=blocks, residual_pool=True, residual_with_cls_embed=False,
        rel_pos_embed=True, proj_after_attn=True, num_classes=10,
    )


class FlowWithTwoUpdates(torch.nn.Module):
    """RAFT with two refinement steps (12 by default): the same graph, repeated fewer times."""

    def __init__(self, raft: torch.nn.Module):
        super().__init__()
        self.raft = raft

    def forward(self, image1, image2):
        return self.raft(image1, image2, num_flow_updates=2)


def segmentation(name: str) -> Callable[[Any], torch.nn.Module]:
    return lambda tv: getattr(tv.models.segmentation, name)(weights=None, weights_backbone=None, num_classes=5, aux_loss=False)


def video(name: str) -> Callable[[Any], torch.nn.Module]:
    return lambda tv: getattr(tv.models.video, name)(weights=None, num_classes=10)


# 16 frames: the ResNet-3D family halves time three times, and a clip that ends in one frame
# has torch specialize that size-1 dim.
CLIP, OTHER_CLIP = (3, 16, 32, 32), (3, 24, 48, 40)

TORCHVISION = [
    torchvision_family("lraspp_mobilenet_v3_large", segmentation("lraspp_mobilenet_v3_large")),
    torchvision_family("mc3_18", video("mc3_18"), example=CLIP, other=OTHER_CLIP, dynamic=(2, 3, 4)),
    Family(
        "raft_small",
        lambda tv: FlowWithTwoUpdates(tv.models.optical_flow.raft_small(weights=None)),
        # Its correlation pyramid needs feature maps of 16 or more: images of 128 or more.
        example=(3, 128, 128), other=(3, 160, 192), inputs=2,
    ),
    # Sides from 160, multiples of 32: below, the last stage's map pads to one window, where the
    # model skips the shift and torch specializes the size-1 window count (docs/models.md).
    torchvision_family("swin", tiny_swin, example=(3, 160, 160), other=(3, 192, 224), multiple=32, minimum=160),
]
SLOW_TORCHVISION = [
    torchvision_family("r3d_18", video("r3d_18"), example=CLIP, other=OTHER_CLIP, dynamic=(2, 3, 4)),
    torchvision_family("vit", tiny_vit, other=(3, 64, 64), dynamic=()),
    torchvision_family("maxvit", tiny_maxvit, other=(3, 64, 64), dynamic=()),
    torchvision_family("convnext", tiny_convnext),
    torchvision_family(
        "googlenet",
        lambda tv: tv.models.googlenet(weights=None, aux_logits=False, init_weights=True, num_classes=10),
        # Plain dims make torch.export's solver fail on its ceil-mode pooling's guards.
        example=(3, 128, 128), other=(3, 160, 192), multiple=32,
    ),
    torchvision_family(
        "inception_v3",
        lambda tv: tv.models.inception_v3(weights=None, aux_logits=False, init_weights=True, num_classes=10),
        example=(3, 160, 160), other=(3, 192, 224),
    ),
    torchvision_family("fcn_resnet50", segmentation("fcn_resnet50")),
    torchvision_family("deeplabv3_mobilenet_v3_large", segmentation("deeplabv3_mobilenet_v3_large")),
    torchvision_family("r2plus1d_18", video("r2plus1d_18"), example=CLIP, other=OTHER_CLIP, dynamic=(2, 3, 4)),
    # Its last map is pooled by a 2x7x7 window: at 224 pixels (its minimum) the pooled map is
    # 1x1, which torch specializes; from a 256 example capture raises the sides' minimum to 241
    # and the frames' to 21 (two pooled frames).
    torchvision_family("s3d", video("s3d"), example=(3, 21, 256, 256), other=(3, 24, 288, 264), dynamic=(2, 3, 4)),
    # Its blocks reshape to the configured size (mvit.py: ``thw = (self.pos_encoding.temporal_size,)
    # + self.pos_encoding.spatial_size``): eager takes that size only.
    torchvision_family("mvit", tiny_mvit, example=(3, 4, 32, 32), other=(3, 4, 32, 32), dynamic=()),
    # Where a stage's map is no larger than the window, the model shrinks the window to the map
    # (then a size-dependent window and bias): every stage keeps more than one window, frames
    # from 8 and sides from 64, multiples of the patch times the window (sides: times the merge's
    # 2) so that no stage pads.
    torchvision_family(
        "swin3d", tiny_swin3d, example=(3, 8, 64, 64), other=(3, 12, 96, 64), dynamic=(2, 3, 4),
        multiple=(4, 32, 32), minimum=(8, 64, 64),
    ),
]


def sides(name: str, multiple: int, minimum: int | None) -> Any:
    if multiple == 1:
        return Dim(name, min=minimum or 2, max=1024)
    return multiple * Dim(f"{name}_{multiple}", min=-(-(minimum or multiple) // multiple), max=1024 // multiple)


def dynamic_shapes(family: Family) -> tuple[dict[int, Any], ...]:
    """The batch and ``family.dynamic``'s dims of each input, as the test exports them."""
    multiples, minimums = (
        value if isinstance(value, tuple) else (value,) * len(family.dynamic) for value in (family.multiple, family.minimum)
    )
    dims = {0: BATCH} | {d: sides(f"size{d}", m, low) for d, m, low in zip(family.dynamic, multiples, minimums)}
    return (dims,) * family.inputs


def export_and_compare(model: torch.nn.Module, family: Family) -> None:
    torch.manual_seed(0)
    calibrated(model, *family.tensors(4, family.example))
    example, other = family.tensors(2, family.example), family.tensors(3, family.other)
    with torch.no_grad():
        scale = max(float(leaf.abs().max()) for x in (example, other) for leaf in torch.utils._pytree.tree_leaves(model(*x)))
    # Deep float32 networks round differently in onnxruntime (its own convolution algorithms):
    # differences are measured against the largest output.
    assert_exports_equivalent(
        model, example, dynamic_shapes=dynamic_shapes(family), resized=[other], atol=1e-3 * scale, rtol=0
    )


def params(families: list[Family], slow: list[Family]) -> list:
    return [pytest.param(f, id=f.name) for f in families] + [
        pytest.param(f, id=f.name, marks=pytest.mark.slow) for f in slow
    ]


@pytest.mark.parametrize("family", params(TIMM, SLOW_TIMM))
def test_timm_family(timm, family):
    torch.manual_seed(0)
    export_and_compare(family.build(timm), family)


@pytest.mark.parametrize("family", params(TORCHVISION, SLOW_TORCHVISION))
def test_torchvision_family(torchvision, family):
    torch.manual_seed(0)
    export_and_compare(family.build(torchvision), family)
