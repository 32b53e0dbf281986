"""Gradient defenses a server applies to the gradients it sends: noise, sparsification, and the
distance-correlation penalty (Sun et al.'s dCor) between each party's message and the labels.
Plain torch; randomness only from the generator passed in."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

NOISE_DISTRIBUTIONS = ("gaussian", "laplace")


def add_gradient_noise(
    gradient: torch.Tensor, *, scale: float, distribution: str, generator: torch.Generator
) -> torch.Tensor:
    """g + scale·n, n ~ N(0, 1) or Laplace(0, 1) element-wise, drawn from ``generator``."""
    if distribution == "gaussian":
        noise = torch.randn(
            gradient.shape, generator=generator, dtype=gradient.dtype, device=gradient.device
        )
    elif distribution == "laplace":
        uniform = torch.rand(
            gradient.shape, generator=generator, dtype=gradient.dtype, device=gradient.device
        )
        centred = uniform - 0.5
        noise = -centred.sign() * torch.log1p(-2.0 * centred.abs()).clamp_min(-1e30)
    else:
        raise ValueError(
            f"noise distribution must be one of {NOISE_DISTRIBUTIONS}, got {distribution!r}"
        )
    return gradient + scale * noise


def sparsify(gradient: torch.Tensor, *, keep_fraction: float) -> torch.Tensor:
    """Gradient sparsification: keep the ceil(keep_fraction·n) entries of largest magnitude of
    the message, zero the rest."""
    flat = gradient.reshape(-1)
    keep = max(1, math.ceil(keep_fraction * flat.numel()))
    if keep >= flat.numel():
        return gradient
    kept = flat.abs().topk(keep).indices
    sparse = torch.zeros_like(flat)
    sparse[kept] = flat[kept]
    return sparse.reshape(gradient.shape)


def _centred_distances(x: torch.Tensor) -> torch.Tensor:
    distances = torch.cdist(x, x)
    return distances - distances.mean(0) - distances.mean(1, keepdim=True) + distances.mean()


def distance_correlation(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sample distance correlation of the rows of ``x`` and ``y`` (Székely et al. 2007), in
    [0, 1]: 0 only for independent samples."""
    a, b = _centred_distances(x), _centred_distances(y)
    covariance = (a * b).mean()
    variances = (a * a).mean() * (b * b).mean()
    return covariance.clamp_min(0.0).sqrt() / variances.sqrt().sqrt().clamp_min(1e-12)


def dcor_gradient(
    message: torch.Tensor, labels: torch.Tensor, num_classes: int, *, weight: float
) -> torch.Tensor:
    """weight · d dCor(message, onehot(labels)) / d message: the gradient of the penalty the
    server adds for this party's message."""
    rows = message.detach().reshape(message.shape[0], -1).to(torch.float64).requires_grad_()
    onehot = F.one_hot(labels, num_classes).to(torch.float64)
    (grad,) = torch.autograd.grad(distance_correlation(rows, onehot), rows)
    return (weight * grad).reshape(message.shape)
