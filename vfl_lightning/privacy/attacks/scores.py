"""Scores of a label-scoring attack: ROC AUC and leak AUC. Plain torch (the DCS is in
``privacy.analysis.dcs``, where reports can reach it)."""

from __future__ import annotations

import torch


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
