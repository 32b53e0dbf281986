"""The audit's statistics, validated where the answer is known (pure math, fast): the one-run bound
against randomized response (where it is tight), the Gaussian mechanism of known σ (soundness
over repeated audits, power where ε is large) and one release of PBM through the mechanism itself
(against the exact RDP-derived ε of that release)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binom

from vfl_lightning.mechanisms import PBM
from vfl_lightning.mechanisms.analytic_gaussian import gaussian_delta
from vfl_lightning.privacy.analysis import DEFAULT_ORDERS, pbm_rdp, rdp_to_dp
from vfl_lightning.privacy.analysis.audit import (
    canary_audit_bound,
    epsilon_lower_bound,
    guess_counts,
    largest_lower_bound,
    linear_scores,
    one_run_p_value,
)

DELTA = 1e-5


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact ε at ``delta`` of y = ±1 + N(0, σ²) (sensitivity 2; Balle & Wang's δ(ε))."""
    return brentq(
        lambda eps: gaussian_delta(sigma=sigma, epsilon=eps, sensitivity=2.0) - delta, 0.0, 500.0
    )


def gaussian_audit(rng: np.random.Generator, canaries: int, sigma: float) -> dict:
    """One audit of the Gaussian mechanism: canary i releases (2 S_i − 1) + N(0, σ²); the auditor
    scores each release by itself (the likelihood-ratio test) and guesses its most confident."""
    coins = rng.integers(0, 2, canaries)
    releases = (2 * coins - 1) + sigma * rng.standard_normal(canaries)
    return canary_audit_bound(scores=releases, coins=coins, delta=DELTA)


def test_p_value_is_theorem_3_of_the_one_run_paper():
    """f(v) + 2mδ·max_i (f(v−i) − f(v))/i, f(u) = P[Binomial(r, e^ε/(1+e^ε)) ≥ u], term by term."""
    for m, r, v, eps, delta in [(500, 200, 150, 1.0, 1e-5), (500, 200, 200, 3.0, 1e-3)]:
        q = math.exp(eps) / (1 + math.exp(eps))
        f = [binom.sf(u - 1, r, q) for u in range(v + 1)]
        alpha = max((f[v - i] - f[v]) / i for i in range(1, v + 1))
        expected = min(1.0, f[v] + 2 * m * delta * alpha)
        got = one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=eps, delta=delta)
        assert got == pytest.approx(expected, rel=1e-9)


def test_randomized_response_soundness_is_exact_and_tight():
    """ε-DP randomized response is the case where the one-run bound is tight: each guess is right
    with probability exactly e^ε/(1+e^ε). Summed over the exact distribution of correct guesses
    (no sampling, so this test cannot flake), the bound exceeds the true ε with probability at
    most 5 %, and more than 3 % (the bound is not needlessly loose)."""
    m = 200
    for eps in (0.5, 1.0, 2.0):
        q = 1 / (1 + math.exp(-eps))
        wrong = sum(
            binom.pmf(v, m, q)
            for v in range(m + 1)
            if epsilon_lower_bound(canaries=m, guesses=m, correct=v, delta=0.0) > eps
        )
        assert 0.03 < wrong <= 0.05, (eps, wrong)


def test_gaussian_soundness_over_repeated_audits():
    """200 audits of 200 canaries each, Gaussian mechanism σ = 2 (ε = 4.38 at δ = 1e-5). A valid
    bound exceeds ε in at most 5 % of
    audits; the test allows 24 of 200 (12 %): if each audit independently exceeded ε with
    probability exactly 5 %, the test would fail with probability P[Binomial(200, 0.05) > 24]
    = 2.6e-5. Measured: 0 of 200 exceed ε (largest bound 1.67)."""
    sigma, audits = 2.0, 200
    eps = gaussian_epsilon(sigma, DELTA)
    assert binom.sf(24, audits, 0.05) < 1e-4
    rng = np.random.default_rng(0)
    bounds = np.array([gaussian_audit(rng, 200, sigma)["eps_lower"] for _ in range(audits)])
    assert (bounds > eps).sum() <= 24
    assert (bounds > eps).mean() <= 0.05
    assert bounds.max() > 0.25 * eps  # the audits do find a positive bound


def test_gaussian_power_where_epsilon_is_large():
    """With 10^4 canaries the bound comes within a factor 3 of the analytic ε: σ = 2 (ε = 4.38)
    and σ = 1 (ε = 10.0) give 2.00 and 3.74 (factors 2.2 and 2.7); it cannot pass ln(10^4/3)."""
    rng = np.random.default_rng(1)
    for sigma in (2.0, 1.0):
        eps = gaussian_epsilon(sigma, DELTA)
        result = gaussian_audit(rng, 10_000, sigma)
        assert eps / 3 <= result["eps_lower"] <= eps, (sigma, eps, result)


def test_pbm_one_release_against_its_exact_epsilon():
    """One PBM release (M = 2 parties, the real mechanism with its secure sum): canary i's party-0
    value is ±C by its coin, party 1's sits at −C (the accountant's worst case). The auditor fits
    its rule on 2,000 canaries whose coins it is told and guesses 18,000. The bound stays below
    the exact ε of that one release and reaches 70 % of it: over generator seeds 0-5, 1.00-1.10
    against 1.12 (b = 1) and 1.71-2.01 against 2.21 (b = 2), β = 0.25."""
    for b in (1, 2):
        pbm = PBM(num_parties=2, b=b, beta=0.25, seed=0)
        generator = torch.Generator().manual_seed(b)
        coins = torch.randint(0, 2, (20_000,), generator=generator)
        party0 = (2 * coins - 1).float()[:, None]
        fused = pbm.release([party0, -torch.ones_like(party0)], generator=generator)
        received = fused.double().numpy()
        scores = linear_scores(
            known_releases=received[:2000],
            known_coins=coins[:2000].numpy(),
            releases=received[2000:],
        )
        result = canary_audit_bound(scores=scores, coins=coins[2000:].numpy(), delta=DELTA)
        rdp = pbm_rdp(orders=DEFAULT_ORDERS, b=b, beta=0.25, num_parties=2)
        exact = rdp_to_dp(orders=DEFAULT_ORDERS, rdp=rdp, delta=DELTA)[0]
        assert 0.7 * exact <= result["eps_lower"] <= exact, (b, exact, result)


def test_no_information_gives_no_bound_and_perfect_guesses_the_cap():
    rng = np.random.default_rng(2)
    coins = rng.integers(0, 2, 1000)
    blind = canary_audit_bound(scores=rng.standard_normal(1000), coins=coins, delta=DELTA)
    assert blind["eps_lower"] < 0.3
    perfect = canary_audit_bound(scores=2.0 * coins - 1, coins=coins, delta=DELTA)
    assert perfect["guess_acc"] == 1.0
    assert perfect["eps_lower"] == perfect["eps_lower_max"]
    # about ln(m / 3) with every guess right, whatever the mechanism
    assert largest_lower_bound(canaries=1000, delta=0.0) == pytest.approx(
        math.log(1000 / 3), abs=0.1
    )


def test_abstentions_and_guess_counts():
    assert guess_counts(200) == [200, 100, 50, 25, 12]
    coins = np.array([1, 0] * 50)
    scores = np.where(coins == 1, 1.0, -1.0)
    scores[:10] = np.nan  # never observed: no guess
    result = canary_audit_bound(scores=scores, coins=coins, delta=DELTA)
    assert result["guess_acc"] == 1.0 and result["n"] == 100


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match=r"0 <= correct <= guesses <= canaries"):
        epsilon_lower_bound(canaries=10, guesses=11, correct=5, delta=DELTA)
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 1.5"):
        epsilon_lower_bound(canaries=10, guesses=10, correct=5, delta=DELTA, confidence=1.5)
    with pytest.raises(ValueError, match=r"delta must be in \[0, 1\), got 1.0"):
        epsilon_lower_bound(canaries=10, guesses=10, correct=5, delta=1.0)
    with pytest.raises(ValueError, match=r"coins must be 0 or 1"):
        canary_audit_bound(scores=[0.1, 0.2], coins=[0, 2], delta=DELTA)
    with pytest.raises(ValueError, match=r"known canaries must include both coins"):
        linear_scores(
            known_releases=np.ones((3, 2)), known_coins=[1, 1, 1], releases=np.ones((4, 2))
        )
