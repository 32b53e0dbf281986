"""Passive model completion (Fu et al., USENIX Security 2022): a party fits a small head on its
own frozen party model from a few labelled samples per class. Plain torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HEAD_STEPS = 300
HEAD_LR = 0.05
HEAD_WEIGHT_DECAY = 1e-3


def labelled_rows(labels: torch.Tensor, per_class: int, generator: torch.Generator) -> torch.Tensor:
    """``per_class`` random row indices of every class in ``labels`` (all of a smaller class)."""
    rows = []
    for c in labels.unique().tolist():
        members = (labels == c).nonzero().squeeze(1)
        order = torch.randperm(len(members), generator=generator)
        rows.append(members[order[:per_class]])
    return torch.cat(rows)


@torch.no_grad()
def frozen_embeddings(party_model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """The party model's outputs on ``features`` (evaluation mode, no gradient), flattened."""
    party_model.eval()
    return party_model(features).reshape(features.shape[0], -1).to(torch.float64)


def complete_model(
    embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A softmax-regression head on standardized ``embeddings`` (zero start, Adam, weight decay:
    deterministic). Returns (mean, std, weights) of the completed model's head."""
    mean, std = embeddings.mean(0), embeddings.std(0, unbiased=False).clamp_min(1e-6)
    inputs = (embeddings - mean) / std
    weights = torch.zeros(inputs.shape[1] + 1, num_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([weights], lr=HEAD_LR, weight_decay=HEAD_WEIGHT_DECAY)
    design = torch.cat([inputs, torch.ones(inputs.shape[0], 1, dtype=torch.float64)], dim=1)
    for _ in range(HEAD_STEPS):
        optimizer.zero_grad()
        F.cross_entropy(design @ weights, labels).backward()
        optimizer.step()
    return mean, std, weights.detach()


def predict(head: tuple[torch.Tensor, torch.Tensor, torch.Tensor], embeddings: torch.Tensor):
    mean, std, weights = head
    inputs = (embeddings - mean) / std
    design = torch.cat([inputs, torch.ones(inputs.shape[0], 1, dtype=torch.float64)], dim=1)
    return (design @ weights).argmax(dim=1)
