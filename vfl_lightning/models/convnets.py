"""Convolutional models of the papers' experiments: FedBCD's MNIST-CNN party model and the VGG13
server of FedVS Table 1."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from vfl_lightning.models.encoders import activation_layer
from vfl_lightning.models.resnet import image_shape
from vfl_lightning.models.widths import check_width, check_widths, over_rows


class FedBCDCNN(nn.Module):
    """FedBCD's MNIST-CNN party model: two 3x3 convolutions of ``channels`` filters (same
    padding, ReLU), then one fully connected layer of ``embedding_dim`` units (256 in the paper)
    with ``output_activation``. No pooling: the paper names none."""

    def __init__(
        self,
        input_shape: Sequence[int],
        embedding_dim: int = 256,
        channels: int = 64,
        output_activation: str = "relu",
    ) -> None:
        super().__init__()
        self.input_shape = image_shape(input_shape, "fedbcd_cnn")
        self.embedding_dim = check_width("party.embedding_dim", embedding_dim)
        channels = check_width("party.channels", channels)
        c, h, w = self.input_shape
        self.net = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(channels * h * w, self.embedding_dim),
            activation_layer(output_activation),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


VGG13_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""Configuration B of Simonyan & Zisserman (VGG13): 3x3 convolutions and 2x2 max pooling ("M")."""


class VGG13Head(nn.Module):
    """VGG13 as the server model: the fused embedding read as a ``channels`` x s x s image
    (``in_features = channels * s^2``), VGG13's ten 3x3 convolutions (ReLU, optional batch norm)
    and five 2x2 max poolings (ceil mode, so any s >= 1 works: 28 -> 14 -> 7 -> 4 -> 2 -> 1),
    adaptive average pooling to ``pooled_size`` x ``pooled_size``, then ``hidden`` Linear+ReLU
    layers and a linear layer to ``num_classes``. ``hidden=[4096, 4096]``, ``pooled_size=7``,
    ``channels=3`` and 1000 classes give the 133,047,848 parameters of the ImageNet VGG13."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        channels: int = 1,
        hidden: Sequence[int] = (),
        pooled_size: int = 1,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        channels = check_width("head.channels", channels)
        pooled_size = check_width("head.pooled_size", pooled_size)
        side = math.isqrt(in_features // channels)
        if channels * side * side != in_features:
            raise ValueError(
                f"head=vgg13 reads the fused input as a head.channels={channels} x s x s image, so "
                f"its width must be {channels} * s^2, got {in_features}: set party.embedding_dim "
                f"(e.g. {channels * 28 * 28} for 28 x 28)"
            )
        self.side = side
        self.channels = channels
        layers: list[nn.Module] = []
        width = channels
        for entry in VGG13_LAYERS:
            if entry == "M":
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
                continue
            layers.append(nn.Conv2d(width, entry, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(entry))
            layers.append(nn.ReLU())
            width = entry
        self.features = nn.Sequential(*layers)
        classifier: list[nn.Module] = [nn.AdaptiveAvgPool2d(pooled_size), nn.Flatten()]
        width *= pooled_size * pooled_size
        for size in check_widths("head.hidden", hidden):
            classifier += [nn.Linear(width, size), nn.ReLU()]
            width = size
        classifier.append(nn.Linear(width, num_classes))
        self.classifier = nn.Sequential(*classifier)

    def forward(self, fused: torch.Tensor) -> torch.Tensor:
        return over_rows(fused, self._rows)

    def _rows(self, fused: torch.Tensor) -> torch.Tensor:
        image = fused.reshape(fused.shape[0], self.channels, self.side, self.side)
        return self.classifier(self.features(image))
