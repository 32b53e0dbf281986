"""Empirical lower bounds on ε by the f-DP one-run analysis of Mahloujifar, Melis and Chaudhuri,
"Auditing f-Differential Privacy in One Run" (pure numpy/scipy, keyword-only arguments).

m canaries each carry an independent fair coin; the auditor guesses k of the coins (abstaining on
the others) and gets c right. Under a hypothesis "every canary's view is f-DP with respect to its
coin, whatever the other coins" (:mod:`~vfl_lightning.privacy.analysis.tradeoff`), write
r_i = E[C·1(C >= i)]/m and h_i = E[(k − C)·1(C >= i)]/m (the chance that a random canary is
guessed right, or wrong, while at least i guesses are right). Flipping one canary's coin turns
"guessed right and C >= i" into "guessed wrong and C >= i − 1" of the neighbouring run, so
r_i <= F(h_{i−1}) with F = 1 − f, and r_{i−1} = r_i + (i − 1)/(k − i + 1) · (h_{i−1} − h_i).
If P[C >= c] were at least α, then r_c >= α·c/m and h_c >= α·(k − c)/m at the least, and the
recursion h_{i−1} = max(h_i, F^{-1}(r_i)) carries those lower bounds down to r_0 + h_0, which is
exactly k/m: a lower bound above k/m is a contradiction, and the hypothesis is rejected at level
α (:func:`fdp_rejects`). The bound is the ε at δ of the least private hypothesis of a family
that the guesses reject (:func:`fdp_lower_bound`).

Assumptions, to be upheld by the caller: the coins are independent fair coins unknown to the
auditor; the number of guesses k is fixed without looking at a score or a coin (here from the
hypothesis the audit tests and the number of canaries released, :func:`planned_guesses`), or
several are tried and paid for by a Bonferroni correction; the family holds the audited mechanism's trade-off at some strength.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr

from vfl_lightning.privacy.analysis.audit import checked_guesses
from vfl_lightning.privacy.analysis.tradeoff import GaussianFamily, InverseBlowup, TradeOffFamily


def _check_counts(canaries: int, guesses: int, correct: int) -> None:
    if not 0 <= int(correct) <= int(guesses) <= int(canaries) or int(canaries) < 1:
        raise ValueError(
            "counts must satisfy 0 <= correct <= guesses <= canaries, canaries >= 1, got "
            f"correct={correct}, guesses={guesses}, canaries={canaries}"
        )


def _check_level(level: float) -> None:
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"the failure probability must be in (0, 1), got {level}")


def fdp_rejects(
    *, canaries: int, guesses: int, correct: int, level: float, inverse_blowup: InverseBlowup
) -> bool:
    """Whether ``correct`` right guesses of ``guesses`` (of ``canaries`` coins) reject, at failure
    probability ``level``, the hypothesis whose F^{-1} is ``inverse_blowup`` (module docstring)."""
    _check_counts(canaries, guesses, correct)
    _check_level(level)
    m, k, c = int(canaries), int(guesses), int(correct)
    if c == 0:
        return False
    right, wrong = level * c / m, level * (k - c) / m
    for i in range(c - 1, -1, -1):
        needed = max(wrong, inverse_blowup(right))
        if needed == wrong:
            break  # neither value changes again
        right = min(right + i / (k - i) * (needed - wrong), 1.0)
        wrong = needed
    return right + wrong > k / m


def largest_rejected(
    *,
    canaries: int,
    guesses: int,
    correct: int,
    level: float,
    family: TradeOffFamily,
    tolerance: float = 1e-3,
) -> float:
    """The largest strength of ``family`` the guesses reject (0 when they reject none), by
    bisection to ``tolerance``: rejection falls as the strength grows (the hypotheses nest)."""

    def rejected(strength: float) -> bool:
        return fdp_rejects(
            canaries=canaries,
            guesses=guesses,
            correct=correct,
            level=level,
            inverse_blowup=family.inverse_blowup(strength),
        )

    if correct == 0 or not rejected(0.0):
        return 0.0
    top = family.max_strength
    if rejected(top):
        return top
    low, high = 0.0, top
    while high - low > tolerance * max(high, 1e-3):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


def guesses_made(scores: np.ndarray, coins: np.ndarray, count: int) -> tuple[int, int]:
    """(guesses, correct) when the auditor guesses its ``count`` most confident canaries (largest
    |score|; a NaN score, a canary never observed, is never guessed): coin 1 for a score > 0."""
    guessed = np.isfinite(scores)
    order = np.argsort(-np.where(guessed, np.abs(scores), -1.0), kind="stable")
    top = order[: min(int(count), int(guessed.sum()))]
    right = (scores[top] > 0) == (coins[top] == 1)
    return len(top), int(right.sum())


def fdp_lower_bound(
    *,
    scores: Sequence[float],
    coins: Sequence[int],
    family: TradeOffFamily,
    delta: float,
    guesses: Sequence[int],
    confidence: float = 0.95,
) -> dict:
    """The f-DP one-run bound from the auditor's ``scores`` (> 0: coin 1; NaN: abstain) against
    the true ``coins``: for every number of guesses in ``guesses`` (fixed before the run) the
    largest strength of ``family`` rejected at failure probability (1 − ``confidence``)/len
    (Bonferroni), the best of them, and its ε at ``delta``.

    Returns ``eps_lower``, ``strength_lower`` (the family's parameter: μ, ε or β), ``guesses``
    and ``correct`` of the best, ``guess_acc`` (over every canary with a score), ``n``
    (canaries), ``eps_lower_max`` (the bound had every one of those guesses been right) and
    ``family``.
    """
    scores, coins = checked_guesses(scores, coins)
    counts = [int(k) for k in guesses]
    n = int(scores.size)
    if not counts or any(not 1 <= k <= n for k in counts):
        raise ValueError(f"every number of guesses must be in [1, {n}], got {counts}")
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    level = (1.0 - float(confidence)) / len(counts)
    best = {"strength_lower": 0.0, "guesses": 0, "correct": 0}
    ceiling = 0.0
    for count in counts:
        made, correct = guesses_made(scores, coins, count)
        if made == 0:
            continue
        common = {"canaries": n, "guesses": made, "level": level, "family": family}
        strength = largest_rejected(correct=correct, **common)
        if strength > best["strength_lower"] or best["guesses"] == 0:
            best = {"strength_lower": strength, "guesses": made, "correct": correct}
        ceiling = max(ceiling, largest_rejected(correct=made, **common))
    guessed = np.isfinite(scores)
    right = guessed & ((scores > 0) == (coins == 1))
    made = int(guessed.sum())
    return best | {
        "eps_lower": family.epsilon(best["strength_lower"], delta),
        "guess_acc": float(right.sum() / made) if made else None,
        "n": n,
        "eps_lower_max": family.epsilon(ceiling, delta),
        "family": family.name,
    }


def gaussian_expected_correct(mu: float, fraction: float) -> float:
    """Under μ-GDP with the likelihood-ratio score (N(±μ/2, 1) by the coin), the share of right
    guesses among the ``fraction`` of canaries with the largest |score|."""
    low, high = 0.0, 40.0
    for _ in range(100):  # the threshold τ with P(|score| > τ) = fraction
        tau = 0.5 * (low + high)
        share = float(ndtr(mu / 2 - tau) + ndtr(-mu / 2 - tau))
        low, high = (tau, high) if share > fraction else (low, tau)
    tau = 0.5 * (low + high)
    right = float(ndtr(mu / 2 - tau))
    return right / max(right + float(ndtr(-mu / 2 - tau)), 1e-300)


def planned_guesses(*, canaries: int, mu: float, confidence: float = 0.95) -> int:
    """The number of guesses to make, fixed before the run from the canary count and the
    strength μ of the hypothesis tested (a Gaussian stand-in: the μ-GDP curve with the tested
    ε at δ): the k, among halvings of ``canaries`` by √2 down to 10, whose expected right
    guesses under μ-GDP reject the largest μ (no correction: one k is tried)."""
    if int(canaries) < 1:
        raise ValueError(f"canaries must be >= 1, got {canaries}")
    family, level = GaussianFamily(), 1.0 - float(confidence)
    candidates = sorted({max(1, round(canaries * 2 ** (-j / 2))) for j in range(40)})
    candidates = [k for k in candidates if k >= min(10, canaries)]
    best, best_strength = int(canaries), -1.0
    for k in candidates:
        correct = int(round(k * gaussian_expected_correct(mu, k / canaries)))
        strength = largest_rejected(
            canaries=canaries, guesses=k, correct=correct, level=level, family=family
        )
        if strength > best_strength:
            best, best_strength = k, strength
    return best
