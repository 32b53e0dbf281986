"""Party encoders: each maps one party's feature slice to its embedding h_m (width P)."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch
from torch import nn

from vfl_lightning.models.widths import check_width, check_widths

ACTIVATIONS = {"none": nn.Identity, "tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}


def activation_layer(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class MLPEncoder(nn.Module):
    """Flatten, then ``hidden`` fully connected layers, then a linear map to ``embedding_dim``.

    ``hidden=[]`` gives a linear party model. ``output_activation`` bounds the embedding (``tanh``
    keeps it in [-1, 1], as PBM-VFL assumes).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        embedding_dim: int = 16,
        hidden: Sequence[int] = (64,),
        activation: str = "relu",
        output_activation: str = "none",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.embedding_dim = check_width("party.embedding_dim", embedding_dim)
        layers: list[nn.Module] = [nn.Flatten()]
        width = prod(self.input_shape)
        for size in check_widths("party.hidden", hidden):
            layers += [nn.Linear(width, size), activation_layer(activation)]
            width = size
        layers += [nn.Linear(width, self.embedding_dim, bias=bias)]
        layers.append(activation_layer(output_activation))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNNEncoder(nn.Module):
    """Two 3x3 convolutions (same padding, ReLU), adaptive average pooling to at most 4x4, then a
    linear map to ``embedding_dim``. Works on image slices of any size ``(C, H, W)``."""

    def __init__(
        self,
        input_shape: Sequence[int],
        embedding_dim: int = 16,
        channels: Sequence[int] = (16, 32),
        output_activation: str = "none",
        pooled_size: int = 4,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(
                f"party=cnn needs image slices of shape (C, H, W), got {tuple(input_shape)}; "
                "use an image partition (quadrants, halves, strips) or party=mlp"
            )
        channels = check_widths("party.channels (two conv layers)", channels, count=2)
        self.input_shape = tuple(input_shape)
        self.embedding_dim = check_width("party.embedding_dim", embedding_dim)
        c, h, w = self.input_shape
        pooled = (min(h, pooled_size), min(w, pooled_size))
        self.net = nn.Sequential(
            nn.Conv2d(c, channels[0], 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels[0], channels[1], 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(pooled),
            nn.Flatten(),
            nn.Linear(channels[1] * pooled[0] * pooled[1], self.embedding_dim),
            activation_layer(output_activation),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
