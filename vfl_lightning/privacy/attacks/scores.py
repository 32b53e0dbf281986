"""Scores of an attack against the main task: VFLAIR's defense capability score (DCS) and the
leak AUC of a label-scoring attack. Plain torch."""

from __future__ import annotations

import math

import torch

DCS_BETA = 0.5
"""VFLAIR's weight of the main-task term in the DCS (β = 0.5: attack and utility weigh alike)."""


def defense_capability_score(
    *,
    attack_performance: float,
    attack_baseline: float,
    main_performance: float,
    main_reference: float,
    beta: float = DCS_BETA,
) -> float:
    """DCS = 1 / (1 + sqrt((1−β)(AP−AP*)² + β(MP−MP*)²)) (VFLAIR): 1 when the attack does no
    better than its no-information value AP* and the main task keeps MP* (the same protocol's
    metric without defense); lower is a worse trade-off."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"DCS beta must be in [0, 1], got {beta}")
    distance = (1.0 - beta) * (attack_performance - attack_baseline) ** 2
    distance += beta * (main_performance - main_reference) ** 2
    return 1.0 / (1.0 + math.sqrt(distance))


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for ``labels`` (1 positive), ties counted half
    (the Mann-Whitney statistic)."""
    scores = scores.to(torch.float64)
    positive = labels.bool()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes, got {n_pos} positive and {n_neg} negative")
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    sorted_scores = scores[order]
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    unique, inverse = torch.unique(sorted_scores, return_inverse=True)
    rank_sums = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, ranks[order])
    counts = torch.bincount(inverse, minlength=len(unique)).to(torch.float64)
    ranks[order] = (rank_sums / counts)[inverse]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def leak_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """max(AUC, 1 − AUC): the attacker may rank either way round (0.5: no leak, 1: full)."""
    auc = roc_auc(scores, labels)
    return max(auc, 1.0 - auc)
