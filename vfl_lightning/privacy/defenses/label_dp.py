"""Label differential privacy by randomized response (Ghazi et al., "Deep learning with label
differential privacy", NeurIPS 2021: RR-ε). Plain torch."""

from __future__ import annotations

import math

import torch


def keep_probability(epsilon: float, num_classes: int) -> float:
    """P(reported label = true label) = e^ε / (e^ε + K − 1): ε-label-DP randomized response."""
    return math.exp(epsilon) / (math.exp(epsilon) + num_classes - 1)


def randomized_response(
    labels: torch.Tensor, *, epsilon: float, num_classes: int, generator: torch.Generator
) -> torch.Tensor:
    """Each label kept with :func:`keep_probability`, else replaced by one of the other K − 1
    classes uniformly: an ε-label-DP release of every training label, drawn once."""
    if not epsilon > 0.0:
        raise ValueError(f"defense.epsilon must be > 0, got {epsilon}")
    keep = torch.rand(labels.shape, generator=generator) < keep_probability(epsilon, num_classes)
    shift = torch.randint(1, num_classes, labels.shape, generator=generator)
    return torch.where(keep, labels, (labels + shift) % num_classes)
