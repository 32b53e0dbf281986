"""Fusion heads: the server model from the fused embedding to class logits (never softmax)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vfl_lightning.models.widths import check_widths


class LinearHead(nn.Linear):
    """One linear layer to ``num_classes`` logits (multinomial logistic regression)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__(in_features, num_classes)


class MLPHead(nn.Sequential):
    """``hidden`` Linear+ReLU layers, then a linear layer to ``num_classes`` logits."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (64,)) -> None:
        layers: list[nn.Module] = []
        width = in_features
        for size in check_widths("head.hidden", hidden):
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)


class BiasHead(nn.Module):
    """Logits = fused input + a per-class bias: the "model without split" of Fu et al.'s direct
    label-inference attack (the server sums the parties' outputs). Needs in_features = classes."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        if in_features != num_classes:
            raise ValueError(
                f"head=bias adds a bias to the fused input, so its width must equal num_classes="
                f"{num_classes}, got {in_features}: set party.embedding_dim={num_classes}"
            )
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, fused: torch.Tensor) -> torch.Tensor:
        return fused + self.bias
