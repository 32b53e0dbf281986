"""The f-DP hypotheses of PBM releases of one party's value (a
:class:`~vfl_lightning.privacy.analysis.tradeoff.TradeOffFamily` whose strength is β): the exact
trade-off of one release in the worst case over the other parties, composed over a canary's
releases through ``dp_accounting``'s privacy loss distributions (pure numpy/scipy).

One release of one coordinate is Σq over M parties' b trials each. The audited party's b trials
have p = 1/2 ± β (its value at ±C, by the coin); each trial of another party has some p in
[1/2 − β, 1/2 + β], a mixture of the two extremes that does not depend on the coin. The release is
then a mixture, with weights the auditor does not see, of the vertex pairs (P_t, Q_t): t of the
other parties' (M − 1)·b trials high, the rest low. A mechanism every one of whose mixture
components is (ε, δ_t(ε))-DP is (ε, max_t δ_t(ε))-DP, so one release is f*-DP for the trade-off
f* of the profile max_t δ_t (no single vertex dominates the others: their profiles cross). f* is
tabulated on a grid of ε (fewer ε: a smaller f*, a weaker hypothesis), turned into the pair of
distributions whose trade-off it is (:func:`polygon_pair`), composed over the releases by
``dp_accounting`` with pessimistic rounding, and read back as F^{-1}. The ε reported for a β is
that of real inputs: the other parties at ±C (each party's b trials all high or all low), composed
with optimistic rounding, the largest over those configurations: never above f*'s.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy.stats import binom

from vfl_lightning.privacy.analysis.tradeoff import (
    InverseBlowup,
    TradeOffFamily,
    inverse_blowup_grid,
    profile_inverse_blowup,
    tabulated,
)

DISCRETIZATION = 1e-3
"""Width of the privacy-loss grid of the composition (``dp_accounting``'s discretization)."""
MAX_EPSILON = 50.0
"""The largest ε at which a composed profile is read (beyond it, δ is taken as 1)."""


def vertex_pair(b: int, beta: float, num_parties: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q): the pmfs of Σq when the audited party's b trials have p = 1/2 + β (P) or 1/2 − β
    (Q) and ``high`` of the other parties' (M − 1)·b trials have p = 1/2 + β, the rest 1/2 − β."""
    others = (num_parties - 1) * b
    up = binom.pmf(np.arange(high + 1), high, 0.5 + beta)
    down = binom.pmf(np.arange(others - high + 1), others - high, 0.5 - beta)
    rest = np.convolve(up, down)
    audited_high = binom.pmf(np.arange(b + 1), b, 0.5 + beta)
    audited_low = binom.pmf(np.arange(b + 1), b, 0.5 - beta)
    return np.convolve(audited_high, rest), np.convolve(audited_low, rest)


def hockey_stick(p: np.ndarray, q: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
    """δ(ε) = Σ max(0, P − e^ε Q) for every ε: the least δ with (ε, δ)-indistinguishability of P
    from Q in one order."""
    return np.maximum(p[None, :] - np.exp(epsilons)[:, None] * q[None, :], 0.0).sum(axis=1)


def release_profile(b: int, beta: float, num_parties: int, epsilons: np.ndarray) -> np.ndarray:
    """max over every vertex t and both orders of δ_t(ε) at ``epsilons``: one release's profile."""
    worst = np.zeros(len(epsilons))
    for high in range((num_parties - 1) * b + 1):
        p, q = vertex_pair(b, beta, num_parties, high)
        worst = np.maximum(worst, hockey_stick(p, q, epsilons))
        worst = np.maximum(worst, hockey_stick(q, p, epsilons))
    return np.minimum(worst, 1.0)


def polygon_pair(epsilons: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q) on finitely many outcomes whose trade-off is the largest symmetric trade-off
    function f with f(x) >= max(0, 1 − δ_j − e^{ε_j} x, e^{−ε_j} (1 − δ_j − x)) for every j: the
    upper envelope of those lines, a convex polygon. Outcome k is its k-th edge: Q-mass its width,
    P-mass its drop. ``epsilons`` must be >= 0 and reach where δ is 0 (a finite worst loss)."""
    eps = np.asarray(epsilons, dtype=np.float64)
    dels = np.asarray(deltas, dtype=np.float64)
    slopes = np.concatenate([-np.exp(eps), -np.exp(-eps), [0.0]])
    intercepts = np.concatenate([1.0 - dels, np.exp(-eps) * (1.0 - dels), [0.0]])
    order = np.lexsort((-intercepts, slopes))  # steepest first; the highest among equal slopes
    hull: list[int] = []
    for line in order:
        if hull and slopes[hull[-1]] == slopes[line]:
            continue
        while len(hull) >= 2:
            a, c = hull[-2], hull[-1]
            # c is useless if line overtakes a no later than c does
            left = (intercepts[line] - intercepts[a]) * (slopes[c] - slopes[a])
            right = (intercepts[c] - intercepts[a]) * (slopes[line] - slopes[a])
            if left >= right:
                hull.pop()
            else:
                break
        hull.append(line)
    # the envelope's vertices in [0, 1]: its breakpoints strictly inside, and both ends
    breaks = [
        (intercepts[a] - intercepts[c]) / (slopes[c] - slopes[a])
        for a, c in zip(hull[:-1], hull[1:], strict=True)
    ]
    xs = np.array([0.0, *[x for x in breaks if 0.0 < x < 1.0], 1.0])
    envelope = slopes[hull][None, :] * xs[:, None] + intercepts[hull][None, :]
    ys = np.clip(envelope.max(axis=1), 0.0, 1.0)
    # an outcome P alone can produce (infinite loss) holds 1 − f(0); then one per edge
    q_mass = np.concatenate([[0.0], np.diff(xs)])
    p_mass = np.concatenate([[1.0 - ys[0]], -np.diff(ys)])
    keep = (q_mass > 0) | (p_mass > 0)
    return np.clip(p_mass[keep], 0.0, None), np.clip(q_mass[keep], 0.0, None)


def log_pmf(masses: np.ndarray) -> dict[int, float]:
    return {i: math.log(m) for i, m in enumerate(masses) if m > 0.0}


def composed_loss(
    p: np.ndarray, q: np.ndarray, releases: int, *, pessimistic: bool
) -> pld.PrivacyLossDistribution:
    """The privacy loss distribution of ``releases`` releases of the pair (P, Q) (P's order)."""
    loss = pld.from_two_probability_mass_functions(
        log_pmf(q),
        log_pmf(p),
        pessimistic_estimate=pessimistic,
        value_discretization_interval=DISCRETIZATION,
    )
    return loss.self_compose(releases) if releases > 1 else loss


class PBMFamily(TradeOffFamily):
    """``releases`` PBM releases (coordinates × rounds) of one party's value among
    ``num_parties`` parties with ``b`` trials each, at strength β (see the module). Every F^{-1}
    is built once per β and kept."""

    name = "pbm"
    max_strength = 0.49

    def __init__(self, b: int, num_parties: int, releases: int) -> None:
        if int(b) < 1 or int(num_parties) < 1 or int(releases) < 1:
            raise ValueError(
                f"b, num_parties and releases must be >= 1, got {b}, {num_parties}, {releases}"
            )
        self.b, self.num_parties, self.releases = int(b), int(num_parties), int(releases)
        self._inverses: dict[float, InverseBlowup] = {}

    def worst_loss(self, beta: float) -> float:
        """The largest privacy loss of one release: the audited party's b trials, each
        log((1/2 + β)/(1/2 − β))."""
        return self.b * math.log((0.5 + beta) / (0.5 - beta))

    def inverse_blowup(self, strength: float) -> InverseBlowup:
        beta = self.check_strength(strength)
        if beta == 0.0:
            return lambda y: y
        if beta not in self._inverses:
            epsilons = np.linspace(0.0, self.worst_loss(beta) + 1e-9, 2001)
            p, q = polygon_pair(epsilons, release_profile(self.b, beta, self.num_parties, epsilons))
            composed = composed_loss(p, q, self.releases, pessimistic=True)
            top = min(MAX_EPSILON, max(1.0, composed.get_epsilon_for_delta(1e-15)))
            grid_eps = np.linspace(0.0, top, 501)
            with np.errstate(over="ignore", invalid="ignore"):
                grid_delta = np.asarray(composed.get_delta_for_epsilon(grid_eps), dtype=float)
            # a δ not computed is taken as 1: that pair then says nothing (a weaker hypothesis)
            grid_delta = np.clip(np.nan_to_num(grid_delta, nan=1.0), 0.0, 1.0)
            grid = inverse_blowup_grid(2001)
            values = profile_inverse_blowup(grid_eps, grid_delta, grid)
            self._inverses[beta] = tabulated(grid, values)
        return self._inverses[beta]

    def epsilon(self, strength: float, delta: float) -> float:
        """The largest ε at ``delta``, over the real inputs with every other party at ±C, of the
        composed releases (optimistic rounding: never above f*'s ε)."""
        beta = self.check_strength(strength)
        if beta == 0.0:
            return 0.0
        worst = 0.0
        for parties_high in range(self.num_parties):
            p, q = vertex_pair(self.b, beta, self.num_parties, parties_high * self.b)
            for upper, lower in ((p, q), (q, p)):
                loss = composed_loss(upper, lower, self.releases, pessimistic=False)
                worst = max(worst, float(loss.get_epsilon_for_delta(delta)))
        return worst
