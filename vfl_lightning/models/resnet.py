"""ResNet-18 for CIFAR-sized images (He et al. 2016, the CIFAR variant: a 3x3 stem without max
pooling), as one party model (``party=resnet18``) or split after its first convolution between
the parties (``party=resnet18_stem``) and the server (``head=resnet18_body``), as in the cascaded
hybrid ZOO VFL paper's CIFAR-10 experiment."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vfl_lightning.models.encoders import activation_layer
from vfl_lightning.models.widths import check_width, over_rows

STAGE_WIDTHS = (64, 128, 256, 512)
STAGE_STRIDES = (1, 2, 2, 2)
BLOCKS_PER_STAGE = 2


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection (a 1x1 projection when the
    stride or the width changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def residual_stages(in_channels: int) -> nn.Sequential:
    """ResNet-18's four stages of two basic blocks (widths 64-512, strides 1, 2, 2, 2), then
    global average pooling and flattening to 512 features. Any input of at least 1x1 works."""
    layers: list[nn.Module] = []
    for width, stride in zip(STAGE_WIDTHS, STAGE_STRIDES, strict=True):
        for block in range(BLOCKS_PER_STAGE):
            layers.append(BasicBlock(in_channels, width, stride if block == 0 else 1))
            in_channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())


def image_shape(input_shape: Sequence[int], name: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(
            f"party={name} needs image slices of shape (C, H, W), got {tuple(input_shape)}; "
            "use an image partition (quadrants, halves, strips) or party=mlp"
        )
    return tuple(int(s) for s in input_shape)


class ResNet18Encoder(nn.Module):
    """CIFAR-style ResNet-18 on a party's image slice ``(C, H, W)`` of any size and channel
    count: 3x3 stem convolution (64 channels, stride 1, no max pooling), batch norm, ReLU, the
    four residual stages, global average pooling, and a linear map from 512 to ``embedding_dim``
    in place of the classifier. With C=3 and ``embedding_dim=10`` it is the 11,173,962-parameter
    CIFAR-10 ResNet-18."""

    def __init__(
        self,
        input_shape: Sequence[int],
        embedding_dim: int = 64,
        output_activation: str = "none",
    ) -> None:
        super().__init__()
        self.input_shape = image_shape(input_shape, "resnet18")
        self.embedding_dim = check_width("party.embedding_dim", embedding_dim)
        self.net = nn.Sequential(
            conv3x3(self.input_shape[0], STAGE_WIDTHS[0]),
            nn.BatchNorm2d(STAGE_WIDTHS[0]),
            nn.ReLU(),
            residual_stages(STAGE_WIDTHS[0]),
            nn.Linear(STAGE_WIDTHS[-1], self.embedding_dim),
            activation_layer(output_activation),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ResNet18Stem(nn.Module):
    """The client part of the split ResNet-18: its first convolution (3x3, ``channels`` filters,
    stride 1, no bias) on the party's image slice ``(C, H, W_m)``.

    The embedding is the (channels, H, W_m) feature map flattened in column-major order (width,
    then height, then channel; ``embedding_dim = channels * H * W_m``), so that concatenating the
    embeddings of parties holding side-by-side slices (partition halves or strips, left to
    right) gives the full (channels, H, W) map in the same order, which
    :class:`ResNet18Body` reshapes back.
    """

    def __init__(self, input_shape: Sequence[int], channels: int = 64) -> None:
        super().__init__()
        self.input_shape = image_shape(input_shape, "resnet18_stem")
        self.channels = check_width("party.channels", channels)
        c, h, w = self.input_shape
        self.embedding_dim = self.channels * h * w
        self.conv = conv3x3(c, self.channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).permute(0, 3, 2, 1).flatten(1)


class ResNet18Body(nn.Module):
    """The server part of the split ResNet-18: everything after the first convolution (batch
    norm, ReLU, the four residual stages, pooling, the classifier to ``num_classes``).

    Its input is the concatenation (fusion concat) of :class:`ResNet18Stem` embeddings of
    side-by-side image slices: a (channels, height, W) feature map in column-major order, read
    back for any total width W. ``in_features`` must be a multiple of channels x height.
    """

    def __init__(
        self, in_features: int, num_classes: int, channels: int = 64, height: int = 32
    ) -> None:
        super().__init__()
        self.channels = check_width("head.channels", channels)
        self.height = check_width("head.height", height)
        column = self.channels * self.height
        if in_features % column != 0:
            raise ValueError(
                f"head=resnet18_body reads its input as a (head.channels={self.channels}, "
                f"head.height={self.height}, W) map, so the fused width must be a multiple of "
                f"{column}, got {in_features}: use party=resnet18_stem with party.channels="
                f"{self.channels} on images {self.height} pixels high, and mechanism.fusion=concat"
            )
        self.width = in_features // column
        self.net = nn.Sequential(
            nn.BatchNorm2d(self.channels),
            nn.ReLU(),
            residual_stages(self.channels),
            nn.Linear(STAGE_WIDTHS[-1], num_classes),
        )

    def forward(self, fused: torch.Tensor) -> torch.Tensor:
        return over_rows(fused, self._rows)

    def _rows(self, fused: torch.Tensor) -> torch.Tensor:
        columns = fused.reshape(fused.shape[0], self.width, self.height, self.channels)
        return self.net(columns.permute(0, 3, 2, 1))
