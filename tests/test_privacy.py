"""Privacy analysis and accountant: exact PBM RDP against brute force, Gaussian RDP against
dp_accounting, monotonicity, golden values, state round trips and bad inputs."""

import itertools

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from scipy.special import logsumexp
from scipy.stats import binom

from vfl_lightning.mechanisms.ldp import GaussianLDP
from vfl_lightning.mechanisms.pbm import PBM
from vfl_lightning.privacy.accountant import PrivacyAccountant
from vfl_lightning.privacy.analysis import (
    expected_uses,
    gaussian_rdp,
    ldp_feature_rdp,
    paper_feature_rdp,
    paper_sample_rdp,
    pbm_feature_rdp,
    pbm_rdp,
    pbm_sample_rdp,
    rdp_to_dp,
    sample_privacy_factor,
)

ORDERS = [1.5, 2.0, 3.0, 8.0, 32.0]


def sum_pmf(probabilities, b):
    """pmf of Σ_m Binom(b, p_m) by plain linear-space convolution (independent of the library)."""
    pmf = np.array([1.0])
    for p in probabilities:
        pmf = np.convolve(pmf, binom.pmf(np.arange(b + 1), b, p))
    return pmf


def brute_force_rdp(orders, *, b, beta, num_parties, num_changed, grid_points=4):
    """max over a grid of real inputs h ∈ [−1, 1] (C = 1) of D_α(P_d ‖ P_d') for one coordinate."""
    grid = 0.5 + beta * np.linspace(-1.0, 1.0, grid_points)
    orders = np.asarray(orders)[:, None]
    worst = np.zeros(orders.shape[0])
    others = num_parties - num_changed
    for changed in itertools.product(grid, repeat=2 * num_changed):
        before, after = changed[:num_changed], changed[num_changed:]
        for rest in itertools.product(grid, repeat=others):
            p = sum_pmf(list(before) + list(rest), b)
            q = sum_pmf(list(after) + list(rest), b)
            terms = orders * np.log(p)[None] + (1 - orders) * np.log(q)[None]
            value = logsumexp(terms, axis=1) / (orders[:, 0] - 1)
            worst = np.maximum(worst, value)
    return worst


@pytest.mark.parametrize(
    ("num_parties", "b", "beta"), [(1, 3, 0.2), (2, 2, 0.1), (3, 3, 0.25), (3, 2, 0.05)]
)
def test_feature_rdp_equals_brute_force_worst_case(num_parties, b, beta):
    exact = pbm_rdp(orders=ORDERS, b=b, beta=beta, num_parties=num_parties)
    brute = brute_force_rdp(ORDERS, b=b, beta=beta, num_parties=num_parties, num_changed=1)
    np.testing.assert_allclose(exact, brute, rtol=1e-9)


@pytest.mark.parametrize(("num_parties", "b", "beta"), [(2, 2, 0.15), (3, 2, 0.25)])
def test_sample_rdp_equals_brute_force_worst_case(num_parties, b, beta):
    exact = pbm_rdp(orders=ORDERS, b=b, beta=beta, num_parties=num_parties, num_changed=num_parties)
    brute = brute_force_rdp(
        ORDERS, b=b, beta=beta, num_parties=num_parties, num_changed=num_parties, grid_points=3
    )
    np.testing.assert_allclose(exact, brute, rtol=1e-9)


@pytest.mark.parametrize(
    ("num_parties", "b", "beta", "num_changed"),
    [
        (2, 3, 0.1, 1),
        (4, 3, 0.15, 1),
        (3, 4, 0.25, 1),
        (5, 2, 0.05, 1),
        (3, 3, 0.2, 2),
        (3, 2, 0.1, 3),
    ],
)
def test_default_worst_case_equals_exhaustive_vertex_search(num_parties, b, beta, num_changed):
    """The exhaustive search is a proven upper bound; the default must reach it."""
    common = dict(orders=ORDERS, b=b, beta=beta, num_parties=num_parties, num_changed=num_changed)
    np.testing.assert_allclose(pbm_rdp(**common), pbm_rdp(**common, exhaustive=True), rtol=1e-12)


def test_single_party_release_is_binomial_divergence():
    b, beta = 5, 0.2
    p = binom.pmf(np.arange(b + 1), b, 0.5 + beta)
    q = binom.pmf(np.arange(b + 1), b, 0.5 - beta)
    expected = [np.log((p**a * q ** (1 - a)).sum()) / (a - 1) for a in ORDERS]
    np.testing.assert_allclose(pbm_rdp(orders=ORDERS, b=b, beta=beta, num_parties=1), expected)


def test_large_sum_is_finite_and_close_to_gaussian_limit():
    """M b = 1024 trials: log-space keeps it exact; small α approaches α Δ² / (2σ²)."""
    b, beta, num_parties = 64, 0.01, 16
    rdp = pbm_rdp(orders=[1.1, 2.0], b=b, beta=beta, num_parties=num_parties)
    gaussian = np.array([1.1, 2.0]) * (2 * beta * b) ** 2 / (2 * num_parties * b * (0.25 - beta**2))
    np.testing.assert_allclose(rdp, gaussian, rtol=0.02)


def test_rdp_grows_with_b_beta_and_order():
    base = dict(orders=ORDERS, num_parties=4)
    small = pbm_rdp(**base, b=2, beta=0.05)
    assert np.all(pbm_rdp(**base, b=16, beta=0.05) > small)
    assert np.all(pbm_rdp(**base, b=2, beta=0.15) > small)
    assert np.all(np.diff(small) > 0)
    assert np.all(pbm_rdp(**base, b=2, beta=0.05, num_changed=4) > small)


def test_gaussian_rdp_matches_dp_accounting():
    sigma, sensitivity = 3.0, 2.0 * 4.0
    accountant = RdpAccountant(orders=ORDERS)
    accountant.compose(GaussianDpEvent(noise_multiplier=sigma / sensitivity))
    np.testing.assert_allclose(
        gaussian_rdp(orders=ORDERS, sensitivity=sensitivity, sigma=sigma),
        accountant._rdp,
        rtol=1e-12,
    )


def test_matched_ldp_has_the_papers_per_coordinate_form():
    """σ² = 2M/(bβ²), C = 1: per release and coordinate ε(α) = α b β² / M (C0 = 1)."""
    b, beta, num_parties = 8, 0.1, 4
    sigma = GaussianLDP(num_parties=num_parties, b=b, beta=beta).sigma
    rdp = ldp_feature_rdp(orders=ORDERS, sigma=sigma, C=1.0, embedding_dim=1, uses=1.0)
    np.testing.assert_allclose(rdp, np.array(ORDERS) * b * beta**2 / num_parties)


def test_sample_privacy_factor_matches_the_papers_two_party_case():
    orders = np.array(ORDERS)
    np.testing.assert_allclose(sample_privacy_factor(orders, 2), 4 * orders + 1 / (orders - 1))
    for m in (2, 3, 5):
        assert np.all(sample_privacy_factor(orders, m) > m * orders)
    feature = paper_feature_rdp(
        orders=orders, c0=1.0, b=4, beta=0.1, num_parties=3, embedding_dim=2, uses=5
    )
    sample = paper_sample_rdp(
        orders=orders, c0=1.0, b=4, beta=0.1, num_parties=3, embedding_dim=2, uses=5
    )
    np.testing.assert_allclose(feature, 5 * 2 * 4 * 0.01 * orders / 3)
    assert np.all(sample > feature)


def accountant_for(mechanism, steps, *, batch_size=100, num_samples=1000, embedding_dim=16):
    accountant = PrivacyAccountant(mechanism, embedding_dim=embedding_dim, num_samples=num_samples)
    for _ in range(steps):
        accountant.record(batch_size)
    return accountant


def test_accountant_golden_values_against_brute_force():
    """Feature and sample ε of (M=2, b=2, β=0.1, P=16) after 30 steps of 100 of 1000 samples."""
    accountant = accountant_for(PBM(num_parties=2, b=2, beta=0.1), steps=30)
    orders = list(accountant.orders)
    uses = 30 * 100 / 1000
    brute_feature = brute_force_rdp(orders, b=2, beta=0.1, num_parties=2, num_changed=1)
    brute_sample = brute_force_rdp(
        orders, b=2, beta=0.1, num_parties=2, num_changed=2, grid_points=3
    )
    feature_eps, feature_alpha = compute_epsilon(orders, list(16 * uses * brute_feature), 1e-5)
    sample_eps, _ = compute_epsilon(orders, list(16 * uses * brute_sample), 1e-5)
    spent = accountant.spent()
    assert spent["feature_eps"] == pytest.approx(feature_eps, rel=1e-9)
    assert spent["sample_eps"] == pytest.approx(sample_eps, rel=1e-9)
    assert spent["alpha"] == feature_alpha
    assert spent["feature_eps"] == pytest.approx(16.75471677064, rel=1e-6)
    assert spent["sample_eps"] == pytest.approx(39.72356163068, rel=1e-6)


def test_accountant_eps_grows_with_b_beta_and_epochs():
    def feature_eps(b, beta, steps):
        return accountant_for(PBM(num_parties=4, b=b, beta=beta), steps).spent()["feature_eps"]

    base = feature_eps(2, 0.05, 10)
    assert feature_eps(16, 0.05, 10) > base
    assert feature_eps(2, 0.15, 10) > base
    assert feature_eps(2, 0.05, 20) > base
    ldp = accountant_for(GaussianLDP(num_parties=4, b=2, beta=0.05), 10).spent()
    assert ldp["sample_eps"] > ldp["feature_eps"] > 0


def test_accountant_before_any_release_and_uses():
    accountant = PrivacyAccountant(
        PBM(num_parties=4, b=4, beta=0.1), embedding_dim=16, num_samples=1437
    )
    assert accountant.spent()["feature_eps"] == 0.0
    for batch in (100,) * 14 + (37,):
        accountant.record(batch)
    accountant.end_epoch()
    assert (
        accountant.uses
        == pytest.approx(1.0)
        == expected_uses(steps=1, batch_size=1437, num_samples=1437)
    )
    assert accountant.epoch_history == [1437]
    per_use = pbm_feature_rdp(
        orders=accountant.orders, b=4, beta=0.1, num_parties=4, embedding_dim=16, uses=1.0
    )
    np.testing.assert_allclose(accountant.rdp("feature"), per_use)
    sample = pbm_sample_rdp(
        orders=accountant.orders, b=4, beta=0.1, num_parties=4, embedding_dim=16, uses=1.0
    )
    np.testing.assert_allclose(accountant.rdp("sample"), sample)


def test_accountant_state_round_trip_and_refusals():
    accountant = accountant_for(PBM(num_parties=4, b=4, beta=0.1), steps=7)
    accountant.end_epoch()
    restored = accountant_for(PBM(num_parties=4, b=4, beta=0.1), steps=0)
    restored.load_state_dict(accountant.state_dict())
    assert restored.spent() == accountant.spent()
    assert restored.epoch_history == [700]
    with pytest.raises(ValueError, match="privacy accountant state was written for"):
        accountant_for(PBM(num_parties=4, b=8, beta=0.1), steps=0).load_state_dict(
            accountant.state_dict()
        )
    with pytest.raises(ValueError, match="privacy accountant state was written for"):
        accountant_for(GaussianLDP(num_parties=4, b=4, beta=0.1), steps=0).load_state_dict(
            accountant.state_dict()
        )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: pbm_rdp(orders=[1.0, 2.0], b=2, beta=0.1, num_parties=2),
            r"Rényi orders must all be > 1",
        ),
        (
            lambda: pbm_rdp(orders=[2.0], b=2, beta=0.0, num_parties=2),
            r"beta must be in \(0, 0.25\]",
        ),
        (
            lambda: pbm_rdp(orders=[2.0], b=2, beta=0.3, num_parties=2),
            r"beta must be in \(0, 0.25\]",
        ),
        (
            lambda: pbm_rdp(orders=[2.0], b=0, beta=0.1, num_parties=2),
            r"b must be an integer >= 1, got 0",
        ),
        (
            lambda: pbm_rdp(orders=[2.0], b=2, beta=0.1, num_parties=2, num_changed=3),
            r"num_changed must be in \[1, 2\]",
        ),
        (
            lambda: gaussian_rdp(orders=[2.0], sensitivity=1.0, sigma=0.0),
            r"sigma must be > 0, got 0.0",
        ),
        (
            lambda: rdp_to_dp(orders=[2.0], rdp=[1.0], delta=0.0),
            r"delta must be in \(0, 1\), got 0.0",
        ),
        (lambda: rdp_to_dp(orders=[2.0, 3.0], rdp=[1.0], delta=1e-5), r"rdp has shape"),
        (lambda: sample_privacy_factor([2.0], 1), r"num_parties >= 2, got 1"),
        (
            lambda: PrivacyAccountant(
                PBM(num_parties=2, b=2, beta=0.1), embedding_dim=4, num_samples=10, delta=1.5
            ),
            r"delta must be in \(0, 1\), got 1.5",
        ),
        (
            lambda: PrivacyAccountant(
                PBM(num_parties=2, b=2, beta=0.1), embedding_dim=0, num_samples=10
            ),
            r"embedding_dim must be >= 1, got 0",
        ),
        (
            lambda: PrivacyAccountant(object(), embedding_dim=4, num_samples=10),
            r"no privacy accounting for mechanism object",
        ),
    ],
)
def test_privacy_bad_inputs(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("algo", ["pbm", "ldp"])
def test_logged_epsilon_is_the_analysis_functions_value(make_cfg, algo):
    """What a training run logs is rdp_to_dp of the privacy.analysis curves: the accountant only
    counts releases and passes the mechanism's parameters."""
    import lightning as L
    import torch
    from hydra.utils import instantiate

    from vfl_lightning.privacy.analysis import DEFAULT_ORDERS, ldp_sample_rdp
    from vfl_lightning.privacy.callback import PrivacyCallback
    from vfl_lightning.train import build

    cfg = make_cfg(f"algo={algo}", "mechanism.b=4", "mechanism.beta=0.1", "trainer.max_steps=3")
    L.seed_everything(cfg.seed)
    datamodule, module = build(cfg)
    callback = PrivacyCallback()
    trainer = instantiate(
        cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[callback]
    )
    trainer.fit(module, datamodule=datamodule)
    uses = 3 * cfg.data.batch_size / len(datamodule.splits["train"])
    assert callback.accountant.uses == uses
    common = {"orders": DEFAULT_ORDERS, "embedding_dim": 16, "uses": uses}
    if algo == "pbm":
        pbm = {"b": 4, "beta": 0.1, "num_parties": 4}
        feature, sample = pbm_feature_rdp(**common, **pbm), pbm_sample_rdp(**common, **pbm)
    else:
        ldp = {"sigma": module.mechanism.sigma, "C": 1.0}
        feature = ldp_feature_rdp(**common, **ldp)
        sample = ldp_sample_rdp(**common, **ldp, num_parties=4)
    feature_eps, feature_alpha = rdp_to_dp(orders=DEFAULT_ORDERS, rdp=feature, delta=1e-5)
    sample_eps, _ = rdp_to_dp(orders=DEFAULT_ORDERS, rdp=sample, delta=1e-5)
    spent = callback.accountant.spent()
    assert (spent["feature_eps"], spent["sample_eps"]) == (feature_eps, sample_eps)
    assert spent["alpha"] == feature_alpha
    logged = trainer.callback_metrics
    assert logged["privacy/feature_eps"] == torch.tensor(feature_eps, dtype=torch.float32)
    assert logged["privacy/sample_eps"] == torch.tensor(sample_eps, dtype=torch.float32)


def test_evaluation_eps_is_the_training_formula_at_the_most_released_eval_sample():
    """Parallel composition: val and test samples are disjoint, so the evaluation ε is the
    training formula's ε at the largest release count of one evaluation sample, whatever the
    count of the others and of the training samples."""
    mechanism = PBM(num_parties=2, b=2, beta=0.1)
    accountant = accountant_for(mechanism, steps=5)
    assert accountant.spent()["eval_feature_eps"] == 0.0
    for _ in range(3):  # three full validation passes of 300 samples, batches of 100
        for start in range(0, 300, 100):
            accountant.record_evaluation("val", range(start, start + 100), 300)
    accountant.record_evaluation("val", range(0, 100), 300)  # a sanity check's first batch
    accountant.record_evaluation("test", range(0, 50), 50)
    assert accountant.eval_uses == 4
    matching = accountant_for(mechanism, steps=40)  # 40 x 100 / 1000 = 4 uses per sample
    spent, expected = accountant.spent(), matching.spent()
    assert spent["eval_feature_eps"] == pytest.approx(expected["feature_eps"], rel=1e-12)
    assert spent["eval_sample_eps"] == pytest.approx(expected["sample_eps"], rel=1e-12)
    assert spent["feature_eps"] == accountant_for(mechanism, steps=5).spent()["feature_eps"]
    restored = accountant_for(mechanism, steps=0)
    restored.load_state_dict(accountant.state_dict())
    assert restored.eval_uses == 4
    assert restored.spent() == spent
