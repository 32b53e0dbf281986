"""Fusion heads: the server model from the fused embedding to class logits (never softmax)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vfl_lightning.models.widths import check_widths, over_rows


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


class WeightNormLinear(nn.Module):
    """A linear layer with weight normalization (Salimans & Kingma 2016): weight row i is
    ``scale[i] * direction[i] / ||direction[i]||``. Initialized as ``nn.Linear`` (the scale is
    the initial rows' norms, so the initial weight is the linear layer's)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        linear = nn.Linear(in_features, out_features)
        self.direction = nn.Parameter(linear.weight.detach().clone())
        self.scale = nn.Parameter(linear.weight.detach().norm(dim=1))
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norms = self.direction.norm(dim=1, keepdim=True)
        return F.linear(x, self.scale[:, None] * self.direction / norms, self.bias)


class CreditServerHead(nn.Sequential):
    """FedVS's Credit Card server: Linear, BatchNorm, Linear, ReLU, BatchNorm, weight-normalized
    Linear, with ``hidden`` = the two hidden widths (the paper gives none). The paper ends in a
    sigmoid; this head returns the logits of ``num_classes`` classes, which the cross-entropy
    loss turns into probabilities (for 2 classes, the softmax of the two logits is the sigmoid of
    their difference)."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (64, 32)):
        first, second = check_widths("head.hidden (two widths)", hidden, count=2)
        super().__init__(
            nn.Linear(in_features, first),
            nn.BatchNorm1d(first),
            nn.Linear(first, second),
            nn.ReLU(),
            nn.BatchNorm1d(second),
            WeightNormLinear(second, num_classes),
        )

    def forward(self, fused: torch.Tensor) -> torch.Tensor:
        return over_rows(fused, super().forward)
