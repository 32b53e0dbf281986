"""Polynomial-network party model of FedVS (eq. 1): h = sum_{i=1..D} x^i W^i, bias absorbed.

The power features [x, x^2, ..., x^D, 1] are exposed separately so that FedVS can quantize and
secret-share exactly what the model multiplies by its single weight matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from vfl_lightning.models.widths import check_count, check_width


class PolynomialNetwork(nn.Module):
    """FedVS eq. 1 with the bias absorbed as a constant-1 feature (the paper's footnote 1).

    ``num_layers`` is the paper's number of layers D, the highest power (``degree``). ``weight`` is
    one (D*d + 1) x ``embedding_dim`` matrix: rows i*d..(i+1)*d-1 are W^{i+1}, the last row is the
    bias. Inputs of any shape are flattened to d features.
    """

    def __init__(
        self, input_shape: Sequence[int], embedding_dim: int = 16, num_layers: int = 1
    ) -> None:
        super().__init__()
        degree = check_count("party.num_layers", num_layers)
        self.input_shape = tuple(input_shape)
        self.in_features = math.prod(self.input_shape)
        self.degree = degree
        self.embedding_dim = check_width("party.embedding_dim", embedding_dim)
        fan_in = degree * self.in_features + 1
        self.weight = nn.Parameter(torch.empty(fan_in, self.embedding_dim))
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(self.weight, -bound, bound)

    @property
    def num_power_features(self) -> int:
        return self.degree * self.in_features + 1

    def power_features(self, x: torch.Tensor) -> torch.Tensor:
        """(X^1, ..., X^D, 1) elementwise powers, concatenated (Algorithm 1 line 3)."""
        return self.powers(x.reshape(x.shape[0], -1))

    def powers(self, flat: torch.Tensor) -> torch.Tensor:
        """:meth:`power_features` of already flat inputs (..., d): (..., D*d + 1), along the
        last axis (several parties' batches stacked along the first)."""
        powers = [flat]
        for _ in range(1, self.degree):
            powers.append(powers[-1] * flat)
        powers.append(torch.ones_like(flat[..., :1]))
        return torch.cat(powers, dim=-1)

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        """Eq. 1 on precomputed power features."""
        return features @ self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(self.power_features(x))
