"""Label leakage from the gradients a passive party receives (Li et al., "Label leakage and
protection in two-party split learning", ICLR 2022): norm and direction scoring. Plain torch."""

from __future__ import annotations

import torch

from vfl_lightning.privacy.attacks.views import PartyView

SCORINGS = ("norm", "direction")


def norm_scores(gradient: torch.Tensor) -> torch.Tensor:
    """Norm scoring: ||g_i|| of each row (confidently fitted samples get small gradients, so the
    less fitted class, typically the minority, ranks high)."""
    return gradient.to(torch.float64).norm(dim=1)


def direction_scores(gradient: torch.Tensor, known_positive: int) -> torch.Tensor:
    """Direction scoring: cos(g_i, g_k) with the gradient of the known positive row k (with a
    softmax-cross-entropy server, rows of one class point one way, of the other the opposite)."""
    rows = gradient.to(torch.float64)
    reference = rows[known_positive]
    norms = rows.norm(dim=1) * reference.norm()
    return (rows @ reference) / norms.clamp_min(torch.finfo(torch.float64).tiny)


class GradientScorer:
    """The passive party's adversary: scores every row of each gradient it received; with
    ``scoring='direction'`` it needs the row index of one sample it knows to be positive."""

    def __init__(self, scoring: str) -> None:
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        self.scoring = scoring

    def score(self, view: PartyView, known_positive: int | None = None) -> torch.Tensor:
        if self.scoring == "norm":
            return norm_scores(view.gradient)
        if known_positive is None:
            raise ValueError("direction scoring needs the row of a known positive sample")
        return direction_scores(view.gradient, known_positive)
