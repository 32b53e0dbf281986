"""The f-DP one-run bound (Mahloujifar, Melis and Chaudhuri), validated where the answer is known:
soundness on randomized response (exactly, over the distribution of right guesses), on the
Gaussian mechanism and on PBM's exact single release through the mechanism itself (the bound
exceeds the true ε in at most the stated share of audits), and power (how much of the
accountant's ε 10^4 canaries show)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

from vfl_lightning.mechanisms import PBM
from vfl_lightning.privacy.analysis import DEFAULT_ORDERS, pbm_rdp, rdp_to_dp
from vfl_lightning.privacy.analysis.fdp_audit import (
    fdp_lower_bound,
    fdp_rejects,
    guesses_made,
    largest_rejected,
    planned_guesses,
)
from vfl_lightning.privacy.analysis.tradeoff import EpsilonDeltaFamily, GaussianFamily
from vfl_lightning.privacy.analysis.tradeoff_pbm import (
    PBMFamily,
    hockey_stick,
    polygon_pair,
    release_profile,
    vertex_pair,
)

DELTA = 1e-5


def gaussian_accountant(mu: float) -> float:
    """The accountant's ε at δ = 1e-5 of μ-GDP: Gaussian RDP α μ²/2, converted as it converts."""
    rdp = np.asarray(DEFAULT_ORDERS) * mu**2 / 2
    return rdp_to_dp(orders=DEFAULT_ORDERS, rdp=rdp, delta=DELTA)[0]


def gaussian_scores(rng: np.random.Generator, canaries: int, mu: float):
    """Coins and the likelihood-ratio scores of μ-GDP canaries: N(±μ/2, 1) by the coin."""
    coins = rng.integers(0, 2, canaries)
    return coins, (2 * coins - 1) * mu / 2 + rng.standard_normal(canaries)


def test_randomized_response_soundness_is_exact():
    """ε-DP randomized response, every canary guessed: right guesses are Binomial(m, e^ε/(1+e^ε)).
    Summed over that exact distribution (no sampling), the (ε, 0) hypothesis is rejected with
    probability at most 5 %, and more than 2 % (the test is not needlessly weak: 2.9–4.6 %)."""
    m = 200
    for eps in (0.5, 1.0, 2.0):
        inverse = EpsilonDeltaFamily(0.0).inverse_blowup(eps)
        q = 1 / (1 + math.exp(-eps))
        rejected = sum(
            binom.pmf(v, m, q)
            for v in range(m + 1)
            if fdp_rejects(canaries=m, guesses=m, correct=v, level=0.05, inverse_blowup=inverse)
        )
        assert 0.02 < rejected <= 0.05, (eps, rejected)


def test_rejection_nests_and_no_information_rejects_nothing():
    """A stronger hypothesis is rejected whenever a weaker one is; half the guesses right rejects
    not even perfect privacy."""
    family = GaussianFamily()
    verdicts = [
        fdp_rejects(
            canaries=1000,
            guesses=100,
            correct=85,
            level=0.05,
            inverse_blowup=family.inverse_blowup(mu),
        )
        for mu in np.linspace(0.0, 3.0, 31)
    ]
    assert verdicts[0] and not verdicts[-1]
    assert verdicts == sorted(verdicts, reverse=True)
    assert (
        largest_rejected(canaries=1000, guesses=1000, correct=500, level=0.05, family=family) == 0.0
    )


def test_gaussian_soundness_over_repeated_audits():
    """300 audits of 1,000 μ-GDP canaries (μ = 1, true ε 4.38 at δ = 1e-5), planned guesses, GDP
    hypotheses. A valid bound exceeds the true ε in at most 5 % of audits; the test allows 30 of
    300 (10 %): were each audit over the true ε with probability exactly 5 %, it would fail with
    probability P[Binomial(300, 0.05) > 30] < 2e-4."""
    family, mu, audits = GaussianFamily(), 1.0, 300
    true_eps = family.epsilon(mu, DELTA)
    assert true_eps == pytest.approx(4.377, abs=1e-3)
    assert binom.sf(30, audits, 0.05) < 2e-4
    rng = np.random.default_rng(0)
    k = planned_guesses(canaries=1000, mu=mu)
    bounds = []
    for _ in range(audits):
        coins, scores = gaussian_scores(rng, 1000, mu)
        result = fdp_lower_bound(
            scores=scores, coins=coins, family=family, delta=DELTA, guesses=[k]
        )
        bounds.append(result["eps_lower"])
    bounds = np.array(bounds)
    assert (bounds > true_eps).sum() <= 30
    assert np.median(bounds) > 0.3 * true_eps  # the audits do find a bound


def test_gaussian_power_reaches_half_the_accountant():
    """10^4 canaries: the bound reaches at least half the accountant's ε (RDP-converted, what
    ``privacy/feature_eps`` reports) at μ = 0.5, 1 and 2 (accountant's ε 2.17, 4.75, 10.8)."""
    family = GaussianFamily()
    rng = np.random.default_rng(1)
    for mu in (0.5, 1.0, 2.0):
        coins, scores = gaussian_scores(rng, 10_000, mu)
        k = planned_guesses(canaries=10_000, mu=mu)
        result = fdp_lower_bound(
            scores=scores, coins=coins, family=family, delta=DELTA, guesses=[k]
        )
        accountant = gaussian_accountant(mu)
        assert 0.5 * accountant <= result["eps_lower"] <= family.epsilon(mu, DELTA), (mu, result)


def test_polygon_pair_realizes_the_profile():
    """The pair built from a release's worst-case profile has exactly that profile (both orders)."""
    epsilons = np.linspace(0.0, 4 * math.log(0.65 / 0.35) + 1e-9, 801)
    profile = release_profile(4, 0.15, 4, epsilons)
    p, q = polygon_pair(epsilons, profile)
    assert p.sum() == pytest.approx(1.0) and q.sum() == pytest.approx(1.0)
    back = np.maximum(hockey_stick(p, q, epsilons), hockey_stick(q, p, epsilons))
    assert np.abs(back - profile).max() < 1e-12


def test_pbm_family_epsilon_against_the_accountant():
    """One PBM release (M = 2, β = 0.25): the family's ε (the other party at ±C, exact up to
    dp_accounting's rounding) is below the RDP accountant's and close to it (b = 1: 1.09 vs
    1.12), and it grows with the number of releases."""
    for b in (1, 2):
        family = PBMFamily(b=b, num_parties=2, releases=1)
        exact = family.epsilon(0.25, DELTA)
        rdp = pbm_rdp(orders=DEFAULT_ORDERS, b=b, beta=0.25, num_parties=2)
        accountant = rdp_to_dp(orders=DEFAULT_ORDERS, rdp=rdp, delta=DELTA)[0]
        assert 0.85 * accountant <= exact <= accountant, (b, exact, accountant)
    assert PBMFamily(b=1, num_parties=2, releases=4).epsilon(0.25, DELTA) > exact


def pbm_single_release_scores(b: int, generator: torch.Generator, canaries: int):
    """Canaries through the real PBM (M = 2, β = 0.25, its secure sum): party 0 at ±C by the
    coin, party 1 at −C; the score is the log-likelihood ratio of the count the server decodes."""
    pbm = PBM(num_parties=2, b=b, beta=0.25, seed=0)
    coins = torch.randint(0, 2, (canaries,), generator=generator)
    party0 = (2 * coins - 1).float()[:, None]
    fused = pbm.release([party0, -torch.ones_like(party0)], generator=generator)
    counts = torch.round(fused.double() * 0.25 * b + b).long().numpy()[:, 0]
    high, low = vertex_pair(b, 0.25, 2, 0)
    return coins.numpy(), np.log(high[counts]) - np.log(low[counts])


def test_pbm_single_release_soundness():
    """200 audits of 2,000 canaries of one PBM release each (b = 1, 2): the hypothesis at the
    true β is rejected (so the bound exceeds the true ε) in at most 22 of 200 audits (were each
    rejected with probability 5 %, P[Binomial(200, 0.05) > 22] < 2e-4)."""
    assert binom.sf(22, 200, 0.05) < 2e-4
    for b in (1, 2):
        family = PBMFamily(b=b, num_parties=2, releases=1)
        inverse = family.inverse_blowup(0.25)
        generator = torch.Generator().manual_seed(b)
        k = planned_guesses(canaries=2000, mu=1.0)
        rejected = 0
        for _ in range(200):
            coins, scores = pbm_single_release_scores(b, generator, 2000)
            made, correct = guesses_made(scores, coins, k)
            rejected += fdp_rejects(
                canaries=2000, guesses=made, correct=correct, level=0.05, inverse_blowup=inverse
            )
        assert rejected <= 22, (b, rejected)


def test_pbm_single_release_bound():
    """The whole bound on one PBM release of 2·10^4 canaries stays below the true ε and shows
    more than half of it."""
    for b in (1, 2):
        family = PBMFamily(b=b, num_parties=2, releases=1)
        coins, scores = pbm_single_release_scores(b, torch.Generator().manual_seed(10 + b), 20_000)
        k = planned_guesses(canaries=20_000, mu=1.0)
        result = fdp_lower_bound(
            scores=scores, coins=coins, family=family, delta=DELTA, guesses=[k]
        )
        exact = family.epsilon(0.25, DELTA)
        assert 0.5 * exact <= result["eps_lower"] <= exact, (b, exact, result)


def test_planned_guesses_and_bad_inputs():
    assert planned_guesses(canaries=1000, mu=1.0) == planned_guesses(canaries=1000, mu=1.0)
    assert 10 <= planned_guesses(canaries=10_000, mu=0.5) < 10_000
    with pytest.raises(ValueError, match=r"0 <= correct <= guesses <= canaries"):
        fdp_rejects(canaries=10, guesses=11, correct=5, level=0.05, inverse_blowup=lambda y: y)
    with pytest.raises(ValueError, match=r"failure probability must be in \(0, 1\), got 1.5"):
        fdp_rejects(canaries=10, guesses=10, correct=5, level=1.5, inverse_blowup=lambda y: y)
    with pytest.raises(ValueError, match=r"gaussian strength must be in \[0, 60.0\], got -1"):
        GaussianFamily().inverse_blowup(-1)
    with pytest.raises(ValueError, match=r"every number of guesses must be in \[1, 2\]"):
        fdp_lower_bound(
            scores=[0.1, 0.2], coins=[0, 1], family=GaussianFamily(), delta=DELTA, guesses=[3]
        )


def test_release_scores_read_what_the_server_received():
    """The PBM score reads each coordinate's count back from the dequantized sum the server
    computed and looks up its log-likelihood ratio; the LDP score is (2C/σ²)·Σ_j y_j."""
    from vfl_lightning.privacy.analysis.release_scores import (
        gaussian_release_scores,
        pbm_count_scores,
        pbm_release_scores,
    )

    pbm = PBM(num_parties=4, b=4, beta=0.1, seed=0)
    counts = torch.tensor([[0, 3, 16], [8, 9, 1]])
    received = pbm.dequantize(counts).numpy()
    table = pbm_count_scores(b=4, beta=0.1, num_parties=4)
    expected = table[counts.numpy()].sum(axis=1)
    got = pbm_release_scores(received, b=4, beta=0.1, clip_bound=1.0, num_parties=4)
    assert np.allclose(got, expected)
    assert table[8] == pytest.approx(0.0, abs=1e-12) and np.all(np.diff(table) > 0)
    rows = np.array([[1.0, -0.5], [0.25, 0.25]])
    assert np.allclose(gaussian_release_scores(rows, clip_bound=1.0, sigma=2.0), [0.25, 0.25])
