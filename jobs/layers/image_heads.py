"""An image classifier: a torchvision ResNet body on 1-channel input, then a swappable head (tversky.md §3.2).

The paper compares a linear head with a `TverskyProjection` head on a ResNet-50. `ImageClassifier` holds the
backbone and the head as separate children (`backbone.*`, `head.*` in the state dict) so the head can be
swapped, counted, frozen apart and inspected (its Tversky prototypes) without touching the backbone.

`create_backbone("none", ...)` is no network at all: the head reads the flattened pixels, so its parameters live in
input space and can be drawn as images (the paper's prototype pictures beside a linear layer's weights).

The ResNet is torchvision's (`weights=None`: nothing is downloaded) with two changes:
- `conv1` takes `in_channels` (1 for grey-scale digits) instead of 3;
- `stem="small"` replaces the 7x7/2 conv + 3x3/2 max-pool with a 3x3/1 conv and no pool, as He et al. (2016) §4.2
  do for 32x32 CIFAR images: the ImageNet stem shrinks a 32x32 input to 8x8 before the first block. It costs
  16x the FLOPs, so the CPU default keeps the ImageNet stem.
The input is normalised inside the model (buffers `mean`, `std`), so the model takes images in [0, 1].
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

Backbone = Literal["resnet18", "resnet50", "none"]
Stem = Literal["imagenet", "small"]
BACKBONES: tuple[str, ...] = get_args(Backbone)
STEMS: tuple[str, ...] = get_args(Stem)


def create_backbone(
    name: str, in_channels: int = 1, stem: str = "imagenet", image_size: int = 32
) -> tuple[nn.Module, int]:
    """`create_resnet`, or for name "none" a flatten ([B, C, S, S] -> [B, C·S·S]): (module, D)."""
    if name == "none":
        return nn.Flatten(), in_channels * image_size * image_size
    return create_resnet(name, in_channels, stem)


def create_resnet(name: str, in_channels: int = 1, stem: str = "imagenet") -> tuple[nn.Module, int]:
    """A torchvision ResNet without its classifier (`fc` is Identity): (module [B, C, H, W] -> [B, D], D)."""
    from torchvision import models

    if name not in BACKBONES or name == "none":
        raise ValueError(f"unknown ResNet {name!r}; known: resnet18, resnet50")
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; known: {', '.join(STEMS)}")
    net = getattr(models, name)(weights=None)
    width = net.conv1.out_channels  # 64
    if stem == "imagenet":
        net.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
    else:
        net.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # torchvision's init for convs
    feat_dim = net.fc.in_features  # 512 (resnet18) or 2048 (resnet50)
    net.fc = nn.Identity()
    return net, feat_dim


class ImageClassifier(nn.Module):
    """forward(images [B, C, H, W] in [0, 1]) -> logits [B, classes] = head(backbone((images - mean) / std)).

    freeze_backbone: the backbone's weights get no gradient. freeze_statistics (with it): its BatchNorm layers stay
    in eval mode when the model trains, so the running statistics are the ones it came with (a backbone trained in a
    first stage, as an ImageNet one is frozen); without it they keep adapting, which a *random* backbone needs: a
    random ResNet's BN in eval mode (running mean 0, var 1) is the identity, so activations grow block after block.
    """

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Module,
        mean: float = 0.0,
        std: float = 1.0,
        freeze_backbone: bool = False,
        freeze_statistics: bool = False,
    ) -> None:
        super().__init__()
        if not std > 0:
            raise ValueError(f"std: must be > 0, got {std!r}")
        if freeze_statistics and not freeze_backbone:
            raise ValueError("freeze_statistics: needs freeze_backbone (a trained backbone keeps its BN statistics)")
        self.backbone = backbone
        self.head = head
        self.register_buffer("mean", torch.tensor(float(mean)))
        self.register_buffer("std", torch.tensor(float(std)))
        self.freeze_backbone = freeze_backbone
        self.freeze_statistics = freeze_statistics
        if freeze_backbone:
            self.backbone.requires_grad_(False)

    def train(self, mode: bool = True) -> ImageClassifier:
        super().train(mode)
        if self.freeze_statistics:
            self.backbone.eval()
        return self

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] in [0, 1] -> [B, D] pooled backbone features (the head's input)."""
        return self.backbone((images - self.mean) / self.std)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))

    def extra_repr(self) -> str:
        return f"freeze_backbone={self.freeze_backbone}, freeze_statistics={self.freeze_statistics}"


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
