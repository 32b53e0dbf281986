"""Privacy hypotheses as trade-off functions (f-DP, Dong, Roth and Su, "Gaussian Differential
Privacy"), ordered by one strength: what an f-DP audit rejects (pure numpy/scipy).

A family holds hypotheses H_t, t >= 0: "every canary's view is f_t-DP with respect to its coin".
f_t falls as t grows (larger t: less private; t = 0: f(x) = 1 - x, no information), so rejecting H_t
rejects every H_s with s <= t. An audit needs two things of H_t: the inverse blow-up
F_t^{-1}(y) (F_t = 1 - f_t: the largest probability an event can have under one coin when it has
probability x under the other; its inverse is the least x for a given y) and the ε at δ of f_t,
never above it, to report. Every computed F_t^{-1} is at most the true one: the hypothesis a test
rejects is never stronger than H_t, so rounding can only weaken the audit, never make it unsound.

- :class:`GaussianFamily`: μ-GDP (the Gaussian mechanism of sensitivity Δ and noise σ is exactly
  μ-GDP with μ = Δ/σ, composed releases add μ² up).
- :class:`EpsilonDeltaFamily`: (ε, δ)-DP at one δ, whatever the mechanism (randomized response is
  the ε-DP member, δ = 0).
- :class:`~vfl_lightning.privacy.analysis.tradeoff_pbm.PBMFamily`: PBM releases of one party's
  value (:mod:`~vfl_lightning.privacy.analysis.tradeoff_pbm`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr, ndtri

InverseBlowup = Callable[[float], float]


class TradeOffFamily(ABC):
    """Hypotheses H_t ordered by ``strength`` t in [0, ``max_strength``] (see the module)."""

    name = ""
    max_strength = math.inf

    @abstractmethod
    def inverse_blowup(self, strength: float) -> InverseBlowup:
        """y -> F_t^{-1}(y) for y in [0, 1], never above the true value."""

    @abstractmethod
    def epsilon(self, strength: float, delta: float) -> float:
        """The ε at ``delta`` of f_t (never above it)."""

    def check_strength(self, strength: float) -> float:
        if not 0.0 <= float(strength) <= self.max_strength:
            raise ValueError(
                f"{self.name} strength must be in [0, {self.max_strength}], got {strength}"
            )
        return float(strength)


def gaussian_log_delta(epsilon: float, mu: float) -> float:
    """log δ(ε) of μ-GDP: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth and Su, Cor. 2.13),
    in log space."""
    high = float(log_ndtr(-epsilon / mu + mu / 2))
    low = epsilon + float(log_ndtr(-epsilon / mu - mu / 2))
    if low >= high:
        return -math.inf
    return high + math.log1p(-math.exp(low - high))


class GaussianFamily(TradeOffFamily):
    """μ-GDP: f_μ(x) = Φ(Φ^{-1}(1 − x) − μ), so F_μ^{-1}(y) = Φ(Φ^{-1}(y) − μ)."""

    name = "gaussian"
    max_strength = 60.0

    def inverse_blowup(self, strength: float) -> InverseBlowup:
        mu = self.check_strength(strength)

        def inverse(y: float) -> float:
            if y <= 0.0 or y >= 1.0:
                return min(max(y, 0.0), 1.0)
            return float(ndtr(ndtri(y) - mu))

        return inverse

    def epsilon(self, strength: float, delta: float) -> float:
        """The exact ε at ``delta`` of μ-GDP (0 when δ(0) <= ``delta``)."""
        mu = self.check_strength(strength)
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        target = math.log(delta)
        if mu == 0.0 or gaussian_log_delta(0.0, mu) <= target:
            return 0.0
        high = 1.0
        while gaussian_log_delta(high, mu) > target:
            high *= 2.0
        return brentq(lambda e: gaussian_log_delta(e, mu) - target, 0.0, high, xtol=1e-9)


class EpsilonDeltaFamily(TradeOffFamily):
    """(ε, δ)-DP at the one ``delta``: f(x) = max(0, 1 − δ − e^ε x, e^{−ε}(1 − δ − x)), so
    F^{-1}(y) = max(0, (y − δ) e^{−ε}, 1 − δ − e^ε (1 − y)). It assumes nothing of the mechanism."""

    name = "epsilon_delta"
    max_strength = 50.0

    def __init__(self, delta: float) -> None:
        if not 0.0 <= float(delta) < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {delta}")
        self.delta = float(delta)

    def inverse_blowup(self, strength: float) -> InverseBlowup:
        eps = self.check_strength(strength)
        delta, up, down = self.delta, math.exp(eps), math.exp(-eps)

        def inverse(y: float) -> float:
            return max(0.0, (y - delta) * down, 1.0 - delta - up * (1.0 - y))

        return inverse

    def epsilon(self, strength: float, delta: float) -> float:
        """ε itself, for the family's own δ (at another δ the member says nothing)."""
        if not math.isclose(delta, self.delta) and delta < self.delta:
            raise ValueError(f"this family's hypotheses are stated at δ = {self.delta}")
        return self.check_strength(strength)


def profile_inverse_blowup(
    epsilons: np.ndarray, deltas: np.ndarray, grid: np.ndarray
) -> np.ndarray:
    """F^{-1} on ``grid`` (sorted values of y in [0, 1]) of a mechanism that is
    (ε_j, δ_j)-DP for every pair given (both orders of the neighbours: a symmetric profile):
    max_j max(0, (y − δ_j) e^{−ε_j}, 1 − δ_j − e^{ε_j} (1 − y)). Fewer pairs give a smaller
    value (a weaker hypothesis), never a larger one."""
    eps = np.asarray(epsilons, dtype=np.float64)[None, :]
    dels = np.asarray(deltas, dtype=np.float64)[None, :]
    y = np.asarray(grid, dtype=np.float64)[:, None]
    first = (y - dels) * np.exp(-eps)
    second = 1.0 - dels - np.exp(eps) * (1.0 - y)
    return np.maximum(np.maximum(first, second).max(axis=1), 0.0)


def tabulated(grid: np.ndarray, values: np.ndarray) -> InverseBlowup:
    """y -> ``values`` at the largest point of ``grid`` not above y: for an increasing F^{-1}
    tabulated on ``grid`` (grid[0] = 0), a value never above F^{-1}(y)."""
    grid = np.asarray(grid, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)

    def inverse(y: float) -> float:
        index = int(np.searchsorted(grid, y, side="right")) - 1
        return float(values[max(index, 0)])

    return inverse


def inverse_blowup_grid(points: int = 4001) -> np.ndarray:
    """0, then ``points`` − 1 values of y log-spaced from 1e-12 to 1: where F^{-1} is tabulated."""
    return np.concatenate([[0.0], np.logspace(-12.0, 0.0, points - 1)])


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP has exactly ``epsilon`` at ``delta`` (0 for ε = 0)."""
    if not epsilon > 0.0:
        return 0.0
    family = GaussianFamily()
    high = 1.0
    while family.epsilon(high, delta) < epsilon:
        high *= 2.0
        if high > family.max_strength:
            return family.max_strength
    return brentq(lambda mu: family.epsilon(mu, delta) - epsilon, 0.0, high, xtol=1e-9)
