"""Party encoders: each maps one party's feature slice to its embedding h_m (width P)."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch
from torch import nn

from vfl_lightning.models.widths import check_width, depth_widths

ACTIVATIONS = {"none": nn.Identity, "tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}


def activation_layer(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class MLPEncoder(nn.Module):
    """Flatten, then ``hidden`` fully connected layers, then a linear map to ``embedding_dim``.

    ``hidden=[]`` gives a linear party model. ``output_activation`` bounds the embedding (``tanh``
    keeps it in [-1, 1], as PBM-VFL assumes). ``num_layers`` (FedVS Table 1's depth) counts the
    linear layers, the output layer included: ``num_layers=1`` is linear, ``num_layers=3`` has two
    hidden layers of widths from ``hidden`` (its last width repeated); None keeps ``hidden``.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        embedding_dim: int = 16,
        hidden: Sequence[int] = (64,),
        activation: str = "relu",
        output_activation: str = "none",
        bias: bool = True,
        num_layers: int | None = None,
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.embedding_dim = check_width("party.embedding_dim", embedding_dim)
        hidden = depth_widths("party.hidden", hidden, num_layers, fixed=1)
        layers: list[nn.Module] = [nn.Flatten()]
        width = prod(self.input_shape)
        for size in hidden:
            layers += [nn.Linear(width, size), activation_layer(activation)]
            width = size
        layers += [nn.Linear(width, self.embedding_dim, bias=bias)]
        layers.append(activation_layer(output_activation))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNNEncoder(nn.Module):
    """3x3 convolutions (same padding, ReLU), one per entry of ``channels``, adaptive average
    pooling to at most 4x4, then a linear map to ``embedding_dim``. Works on image slices of any
    size ``(C, H, W)``. ``num_layers`` (FedVS Table 1's depth) sets the number of convolutions,
    with widths from ``channels`` (its last width repeated); None keeps ``channels``."""

    def __init__(
        self,
        input_shape: Sequence[int],
        embedding_dim: int = 16,
        channels: Sequence[int] = (16, 32),
        output_activation: str = "none",
        pooled_size: int = 4,
        num_layers: int | None = None,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(
                f"party=cnn needs image slices of shape (C, H, W), got {tuple(input_shape)}; "
                "use an image partition (quadrants, halves, strips) or party=mlp"
            )
        channels = depth_widths("party.channels", channels, num_layers)
        if not channels:
            raise ValueError("party.channels must name at least one convolution width, got []")
        self.input_shape = tuple(input_shape)
        self.embedding_dim = check_width("party.embedding_dim", embedding_dim)
        c, h, w = self.input_shape
        pooled = (min(h, pooled_size), min(w, pooled_size))
        layers: list[nn.Module] = []
        for width in channels:
            layers += [nn.Conv2d(c, width, 3, padding=1), nn.ReLU()]
            c = width
        self.net = nn.Sequential(
            *layers,
            nn.AdaptiveAvgPool2d(pooled),
            nn.Flatten(),
            nn.Linear(c * pooled[0] * pooled[1], self.embedding_dim),
            activation_layer(output_activation),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
