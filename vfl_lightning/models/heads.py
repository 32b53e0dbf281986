"""Fusion heads: the server model from the fused embedding to class logits (never softmax)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


class LinearHead(nn.Linear):
    """One linear layer to ``num_classes`` logits (multinomial logistic regression)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__(in_features, num_classes)


class MLPHead(nn.Sequential):
    """``hidden`` Linear+ReLU layers, then a linear layer to ``num_classes`` logits."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (64,)) -> None:
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, int(size)), nn.ReLU()]
            width = int(size)
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)
