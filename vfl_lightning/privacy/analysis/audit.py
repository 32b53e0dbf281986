"""Empirical lower bounds on ε from a canary audit (pure numpy/scipy, keyword-only arguments).

The statistics are the one-run method of Steinke, Nasr and Jagielski, "Privacy auditing with one
(1) training run" (NeurIPS 2023). m canaries each carry an independent fair coin S_i (here: which
of two values a canary's audited features take). The auditor makes at most r guesses of the coins
(it may abstain on the others) and gets v right. If the mechanism is (ε, δ)-DP with respect to
every single coin, Theorem 3 of that paper bounds the chance of v or more correct guesses by

    P[W >= v] <= f(v) + 2·m·δ · max_{1<=i<=v} (f(v − i) − f(v)) / i,
    f(u) = P[Binomial(r, e^ε / (1 + e^ε)) >= u],

so every ε whose bound is below 1 − confidence is rejected, and the largest rejected ε is a lower
bound on the true ε that is wrong with probability at most 1 − confidence.

Assumptions, to be upheld by the caller:
- the coins are independent fair coins, drawn before the run and unknown to the auditor (coins the
  auditor is told, e.g. for calibration, are not counted in m);
- "(ε, δ)-DP" is with respect to changing one coin, with everything else of the run fixed: the
  bound is about the whole view the auditor's guesses depend on;
- the number of guesses r is fixed before the auditor sees the run (abstentions may depend on it);
  choosing the best of several r is paid for by a Bonferroni correction
  (:func:`canary_audit_bound`);
- δ is the δ at which the ε being tested is stated (the accountant's δ).

The bound is a lower bound on ε, never an estimate of it: with m canaries it cannot exceed about
ln(m / 3) at 95 % confidence, however much the auditor learns (:func:`largest_lower_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import bdtrc, expit, gammaln, log_expit


def _check_counts(canaries: int, guesses: int, correct: int) -> None:
    if not 0 <= int(correct) <= int(guesses) <= int(canaries):
        raise ValueError(
            "counts must satisfy 0 <= correct <= guesses <= canaries, got "
            f"correct={correct}, guesses={guesses}, canaries={canaries}"
        )


def _check_delta(delta: float) -> None:
    if not 0.0 <= float(delta) < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def one_run_p_value(
    *, canaries: int, guesses: int, correct: int, epsilon: float, delta: float
) -> float:
    """The largest chance, under (``epsilon``, ``delta``)-DP, of ``correct`` or more right
    guesses among ``guesses`` guesses of ``canaries`` independent fair coins (Theorem 3 of the
    one-run paper, see the module docstring)."""
    _check_counts(canaries, guesses, correct)
    _check_delta(delta)
    if not epsilon >= 0.0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    m, r, v = int(canaries), int(guesses), int(correct)
    q = float(expit(epsilon))
    tail = 1.0 if v == 0 else float(bdtrc(v - 1, r, q))  # P[B >= v], B ~ Binomial(r, q)
    if v == 0 or delta == 0.0:
        return min(1.0, tail)
    values = np.arange(v - 1, -1, -1, dtype=np.float64)  # P[B = v-1], P[B = v-2], ..., P[B = 0]
    below = np.exp(
        gammaln(r + 1.0)
        - gammaln(values + 1.0)
        - gammaln(r - values + 1.0)
        + values * float(log_expit(epsilon))
        + (r - values) * float(log_expit(-epsilon))
    )
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(1.0, tail + 2.0 * m * float(delta) * alpha)


def epsilon_lower_bound(
    *, canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> float:
    """The largest ε that ``correct`` right guesses out of ``guesses`` (of ``canaries`` coins)
    reject at ``confidence``: a lower bound on the true ε at ``delta``, wrong with probability at
    most 1 − ``confidence``; 0 when not even ε = 0 is rejected. Bisection to 1e-4 in ε."""
    _check_counts(canaries, guesses, correct)
    _check_delta(delta)
    _check_confidence(confidence)
    level = 1.0 - float(confidence)

    def rejected(epsilon: float) -> bool:
        p = one_run_p_value(
            canaries=canaries, guesses=guesses, correct=correct, epsilon=epsilon, delta=delta
        )
        return p <= level

    if guesses == 0 or not rejected(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejected(high):
        low, high = high, 2.0 * high
        if high > 1e4:
            raise ValueError("no ε up to 1e4 is consistent with these guesses: check the counts")
    while high - low > 1e-4:
        middle = 0.5 * (low + high)
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


def largest_lower_bound(*, canaries: int, delta: float, confidence: float = 0.95) -> float:
    """The bound an auditor that guesses every one of ``canaries`` coins right would get: no
    audit with that many canaries can show a larger ε."""
    return epsilon_lower_bound(
        canaries=canaries, guesses=canaries, correct=canaries, delta=delta, confidence=confidence
    )


def guess_counts(canaries: int, *, smallest: int = 10) -> list[int]:
    """The numbers of guesses tried by :func:`canary_audit_bound`: every canary, then half as
    many, down to ``smallest`` (fixed by ``canaries`` alone, before any guess is seen)."""
    if int(canaries) < 1:
        raise ValueError(f"canaries must be >= 1, got {canaries}")
    counts = [int(canaries)]
    while counts[-1] // 2 >= smallest:
        counts.append(counts[-1] // 2)
    return counts


def checked_guesses(scores: Sequence[float], coins: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(scores as float64, coins as int64): one score per canary, coins 0 or 1, or a ValueError."""
    scores = np.asarray(scores, dtype=np.float64)
    coins = np.asarray(coins, dtype=np.int64)
    if scores.shape != coins.shape or scores.ndim != 1:
        raise ValueError(
            f"scores and coins must be 1-d of one length, got {scores.shape}, {coins.shape}"
        )
    if not np.isin(coins, (0, 1)).all():
        raise ValueError("coins must be 0 or 1")
    return scores, coins


def canary_audit_bound(
    *,
    scores: Sequence[float],
    coins: Sequence[int],
    delta: float,
    confidence: float = 0.95,
    counts: Sequence[int] | None = None,
) -> dict:
    """The audit's lower bound from the auditor's ``scores`` (> 0: it guesses coin 1, < 0: coin
    0, NaN: it abstains) against the true ``coins`` (0 or 1), one per audited canary.

    For every r in ``counts`` (default :func:`guess_counts` of the number of canaries with a
    score: a canary never observed is never guessed) the auditor guesses only its r most
    confident canaries (largest |score|) and the bound is taken at confidence
    1 − (1 − ``confidence``) / len(counts) (Bonferroni over the r tried), so the largest of them
    is a lower bound at ``confidence``. Returns ``eps_lower``, the ``guesses`` and ``correct`` of
    the r that gave it, ``guess_acc`` (every non-abstained guess), ``n`` (canaries) and
    ``eps_lower_max`` (:func:`largest_lower_bound` at the corrected confidence).
    """
    scores, coins = checked_guesses(scores, coins)
    n = int(scores.size)
    _check_confidence(confidence)
    guessed = np.isfinite(scores)
    made = int(guessed.sum())
    if counts is None and made == 0:
        cap = largest_lower_bound(canaries=n, delta=delta, confidence=confidence)
        return {"eps_lower": 0.0, "guesses": 0, "correct": 0, "guess_acc": None, "n": n} | {
            "eps_lower_max": cap
        }
    counts = guess_counts(made) if counts is None else [int(c) for c in counts]
    if not counts or any(not 1 <= c <= n for c in counts):
        raise ValueError(f"every number of guesses must be in [1, {n}], got {counts}")
    corrected = 1.0 - (1.0 - float(confidence)) / len(counts)
    right = guessed & ((scores > 0) == (coins == 1))
    order = np.argsort(-np.where(guessed, np.abs(scores), -1.0), kind="stable")
    best = {"eps_lower": 0.0, "guesses": 0, "correct": 0}
    for r in counts:
        top = order[:r]
        correct = int(right[top].sum())
        bound = epsilon_lower_bound(
            canaries=n, guesses=r, correct=correct, delta=delta, confidence=corrected
        )
        if bound > best["eps_lower"] or best["guesses"] == 0:
            best = {"eps_lower": bound, "guesses": r, "correct": correct}
    return best | {
        "guess_acc": float(right.sum() / made) if made else None,
        "n": n,
        "eps_lower_max": largest_lower_bound(canaries=n, delta=delta, confidence=corrected),
    }


def linear_scores(
    *,
    known_releases: np.ndarray,
    known_coins: Sequence[int],
    releases: np.ndarray,
) -> np.ndarray:
    """The auditor's scores: a linear rule fitted on the canaries whose coins it was told.

    ``known_releases`` (k × d) and ``releases`` (n × d) hold one row per canary (e.g. the mean
    of the values received for it); the direction is the difference of the two known classes'
    means, each coordinate divided by its pooled within-class variance (a diagonal LDA), and a
    release scores by its projection from the midpoint of the two means (> 0: coin 1). Rows
    with a NaN (a canary never observed) score NaN (abstain).
    """
    known = np.asarray(known_releases, dtype=np.float64)
    known_coins = np.asarray(known_coins, dtype=np.int64)
    releases = np.asarray(releases, dtype=np.float64)
    if known.ndim != 2 or releases.ndim != 2 or known.shape[1] != releases.shape[1]:
        raise ValueError(
            f"releases must be 2-d with one width, got {known.shape} and {releases.shape}"
        )
    observed = np.isfinite(known).all(axis=1)
    ones, zeros = known[observed & (known_coins == 1)], known[observed & (known_coins == 0)]
    if len(ones) < 1 or len(zeros) < 1:
        raise ValueError("the known canaries must include both coins, each observed at least once")
    mean_one, mean_zero = ones.mean(axis=0), zeros.mean(axis=0)
    spread = np.concatenate([ones - mean_one, zeros - mean_zero])
    variance = (spread**2).sum(axis=0) / max(1, len(spread) - 2)
    variance = variance + 1e-12 + 1e-6 * float(variance.mean())
    direction = (mean_one - mean_zero) / variance
    return (releases - 0.5 * (mean_one + mean_zero)) @ direction
