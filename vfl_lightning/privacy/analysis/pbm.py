"""Exact Rényi DP of one Poisson Binomial Mechanism release of a sum over M parties (one coordinate).

Computed numerically from the Binomial distributions (no unknown constant), in log space.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy.special import logsumexp
from scipy.stats import binom

from vfl_lightning.privacy.parameters import check_pbm_parameters


def check_orders(orders: Sequence[float]) -> np.ndarray:
    """The Rényi orders as a float array; every order must be > 1."""
    array = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if array.size == 0 or not np.all(array > 1.0):
        raise ValueError(f"Rényi orders must all be > 1, got {list(array)}")
    return array


MAX_ACCOUNTED_TRIALS = 4096
"""Largest M*b the exact accountant takes (one convolution holds ~(M*b)^2 / 2 floats)."""


def check_pbm_privacy_parameters(b: int, beta: float, num_parties: int, num_changed: int) -> None:
    """PBM's (b, β) by the mechanism's own validator, plus the adjacency of the release."""
    check_pbm_parameters(b, beta)
    if int(num_parties) < 1:
        raise ValueError(f"num_parties must be >= 1, got {num_parties}")
    if not 1 <= int(num_changed) <= int(num_parties):
        raise ValueError(f"num_changed must be in [1, {num_parties}], got {num_changed}")
    total = int(num_parties) * int(b)
    if total > MAX_ACCOUNTED_TRIALS:
        raise ValueError(
            f"num_parties * b = {total} is too large for the exact PBM accountant (at most "
            f"{MAX_ACCOUNTED_TRIALS}: it convolves Binomial pmfs over M*b + 1 counts, with memory "
            f"growing as (M*b)^2); lower mechanism.b to at most {MAX_ACCOUNTED_TRIALS // int(num_parties)}"
        )


def _log_convolve(log_a: np.ndarray, log_c: np.ndarray) -> np.ndarray:
    """log of the convolution of two pmfs given as log-pmfs (exact, no underflow)."""
    size = log_a.size + log_c.size - 1
    shifted = np.full((log_a.size, size), -np.inf)
    rows = np.repeat(np.arange(log_a.size), log_c.size)
    columns = (np.arange(log_a.size)[:, None] + np.arange(log_c.size)[None, :]).ravel()
    shifted[rows, columns] = (log_a[:, None] + log_c[None, :]).ravel()
    return logsumexp(shifted, axis=0)


@lru_cache(maxsize=256)
def _count_log_pmf(total_trials: int, high_trials: int, beta: float) -> np.ndarray:
    """log pmf of Σq when ``high_trials`` trials have p = 1/2+β and the rest p = 1/2−β."""
    high = binom.logpmf(np.arange(high_trials + 1), high_trials, 0.5 + beta)
    low_trials = total_trials - high_trials
    low = binom.logpmf(np.arange(low_trials + 1), low_trials, 0.5 - beta)
    result = _log_convolve(high, low)
    result.setflags(write=False)
    return result


def renyi_divergence(log_p: np.ndarray, log_q: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """D_α(P‖Q) = log(Σ_x P(x)^α Q(x)^{1−α}) / (α−1) for every order (full-support log-pmfs)."""
    orders = np.asarray(orders, dtype=np.float64)[:, None]
    return logsumexp(orders * log_p[None, :] + (1.0 - orders) * log_q[None, :], axis=1) / (
        orders[:, 0] - 1.0
    )


def pbm_rdp(
    *,
    orders: Sequence[float],
    b: int,
    beta: float,
    num_parties: int,
    num_changed: int = 1,
    exhaustive: bool = False,
) -> np.ndarray:
    """ε(α) of one PBM release Σ_m q_m, q_m ~ Binom(b, 1/2 + β h_m/C), for one coordinate.

    The adjacent inputs differ in ``num_changed`` = K of the M parties' values (K = 1: feature
    privacy, the paper's Theorem 6.1 setting; K = M: sample privacy, Theorem 6.2); ε(α) is the
    worst case over the changed values AND the other parties' values, all in [−C, C], i.e. every
    p in [1/2−β, 1/2+β].

    Why this worst case is the worst. Write Σq as a sum of n = M·b independent Bernoulli trials.
    The output pmf is affine in each single trial's probability, and (P, Q) ↦ Σ P^α Q^{1−α} is
    jointly convex for α > 1, so over the box where every trial of an unchanged party has some
    probability in [1/2−β, 1/2+β] (the same under both inputs) and every trial of a changed party
    has any pair of probabilities, the supremum sits at a vertex: each trial at 1/2−β or 1/2+β.
    A vertex is described by the number t of high trials under one input and t' under the other,
    with |t − t'| ≤ K·b, and its output law is F_t = Binom(t, 1/2+β) * Binom(n−t, 1/2−β). Real
    inputs give trial-level vertices only when a party's b trials agree, so the maximum over all
    pairs (F_t, F_t') is an upper bound on the true worst case (this is what ``exhaustive=True``
    returns; cost O(K·b·n²) per order), and it is the true worst case when attained at a pair that
    real inputs produce. The default evaluates only those real pairs at the full swing
    |t − t'| = K·b: the K changed parties go from one extreme to the other while each other party
    sits at an extreme (t' a multiple of b). By the mirror symmetry Σq ↦ n − Σq (F_t ↦ F_{n−t})
    one direction of the swing covers both orders of the divergence. That the vertex maximum is
    attained at such a pair is checked, not proven: tests compare the default with ``exhaustive``
    and with a brute-force search over a grid of real inputs.
    """
    check_pbm_privacy_parameters(b, beta, num_parties, num_changed)
    orders = tuple(check_orders(orders).tolist())
    key = (int(b), float(beta), int(num_parties), int(num_changed), bool(exhaustive))
    return _pbm_rdp(orders, *key).copy()


@lru_cache(maxsize=64)
def _pbm_rdp(
    orders: tuple[float, ...],
    b: int,
    beta: float,
    num_parties: int,
    num_changed: int,
    exhaustive: bool,
) -> np.ndarray:
    """:func:`pbm_rdp` of checked arguments, kept per argument tuple (read-only): a run's
    accountant asks for the same per-release curve at every epoch's log and validation."""
    orders = np.asarray(orders, dtype=np.float64)
    total = int(num_parties) * b
    swing = int(num_changed) * b
    if exhaustive:
        logs = [_count_log_pmf(total, t, beta) for t in range(total + 1)]
        offsets = range(1, swing + 1)
        starts = {d: range(0, total - d + 1) for d in offsets}
    else:
        offsets = (swing,)
        starts = {swing: range(0, total - swing + 1, b)}
        logs = {t: _count_log_pmf(total, t, beta) for t in range(0, total + 1, b)}
    worst = np.full(orders.shape, -np.inf)
    for d in offsets:
        for start in starts[d]:
            worst = np.maximum(worst, renyi_divergence(logs[start + d], logs[start], orders))
    worst.setflags(write=False)
    return worst


def pbm_feature_rdp(
    *,
    orders: Sequence[float],
    b: int,
    beta: float,
    num_parties: int,
    embedding_dim: int,
    uses: float,
) -> np.ndarray:
    """Feature privacy (one party's embedding changes), Theorem 6.1's composition done exactly.

    ε(α) = uses · P · ε_1(α): the P coordinates are independent releases (additive composition)
    and each sample's sum is released ``uses`` times (the paper's T·B/N). Different samples of a
    batch are released separately and disjointly (parallel composition, as in the paper's proof).
    """
    per_release = pbm_rdp(orders=orders, b=b, beta=beta, num_parties=num_parties, num_changed=1)
    return compose(per_release, count=uses * embedding_dim)


def pbm_sample_rdp(
    *,
    orders: Sequence[float],
    b: int,
    beta: float,
    num_parties: int,
    embedding_dim: int,
    uses: float,
) -> np.ndarray:
    """Sample privacy (all M embeddings of one sample change), Theorem 6.2's setting, exactly."""
    per_release = pbm_rdp(
        orders=orders, b=b, beta=beta, num_parties=num_parties, num_changed=num_parties
    )
    return compose(per_release, count=uses * embedding_dim)


def compose(rdp: np.ndarray, *, count: float) -> np.ndarray:
    """RDP of ``count`` adaptive releases of one mechanism: ε(α) adds up (Mironov 2017, Prop. 1)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return np.asarray(rdp, dtype=np.float64) * float(count)
