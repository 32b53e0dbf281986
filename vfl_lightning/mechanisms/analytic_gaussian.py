"""Gaussian noise for the Wait-DP baseline of FedVS: clip each embedding row, add N(0, sigma^2)
with sigma from the analytic Gaussian mechanism (Balle & Wang 2018, Theorem 8) for (eps, delta).
"""

from __future__ import annotations

import math

import torch
from scipy.stats import norm


def gaussian_delta(*, sigma: float, epsilon: float, sensitivity: float) -> float:
    """delta of the Gaussian mechanism with L2 ``sensitivity`` and noise ``sigma`` at ``epsilon``:
    Phi(D/(2s) - e s/D) - e^e Phi(-D/(2s) - e s/D) (Balle & Wang 2018, Theorem 8)."""
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    return float(norm.cdf(a - b) - math.exp(epsilon + norm.logcdf(-a - b)))


def analytic_gaussian_sigma(*, epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma whose Gaussian mechanism is (epsilon, delta)-DP (bisection, rel. tol 1e-9)."""
    if not epsilon > 0:
        raise ValueError(f"algo.dp.epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"algo.dp.delta must be in (0, 1), got {delta}")
    if not sensitivity > 0:
        raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
    low, high = 1e-6 * sensitivity, sensitivity
    while gaussian_delta(sigma=high, epsilon=epsilon, sensitivity=sensitivity) > delta:
        low, high = high, 2 * high
    while high - low > 1e-9 * high:
        mid = 0.5 * (low + high)
        if gaussian_delta(sigma=mid, epsilon=epsilon, sensitivity=sensitivity) > delta:
            low = mid
        else:
            high = mid
    return high


def clip_rows(embedding: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row to L2 norm at most ``clip`` (bounds one sample's embedding)."""
    norms = embedding.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return embedding * (clip / norms).clamp(max=1.0)


def privatize_embedding(
    embedding: torch.Tensor, *, clip: float, sigma: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Wait-DP (FedVS §6.2, after Thapa et al.): clip rows to ``clip``, add N(0, sigma^2) noise."""
    noise = torch.randn(
        embedding.shape, generator=generator, dtype=embedding.dtype, device=embedding.device
    )
    return clip_rows(embedding, clip) + sigma * noise


class WaitDP:
    """The Wait-DP baseline's noise (FedVS §6.2): every embedding row clipped to L2 norm ``clip``
    plus N(0, σ²), σ from :func:`analytic_gaussian_sigma` for (``epsilon``, ``delta``) per
    release with sensitivity 2·clip; ``at_eval``: validation and test see noisy embeddings too."""

    def __init__(
        self, epsilon: float = 5.0, delta: float = 1e-5, clip: float = 1.0, at_eval: bool = True
    ) -> None:
        if not clip > 0:
            raise ValueError(f"algo.dp.clip must be > 0, got {clip}")
        self.clip = float(clip)
        self.at_eval = bool(at_eval)
        self.sigma = analytic_gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=2 * clip)

    @property
    def noise_multiplier(self) -> float:
        """σ/clip: the Gaussian noise of one element over the rows' L2 clipping bound."""
        return self.sigma / self.clip

    def __call__(self, embedding: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return privatize_embedding(embedding, clip=self.clip, sigma=self.sigma, generator=generator)
