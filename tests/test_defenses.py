"""Defenses: the math of each (noise moments, exact sparsification, randomized response rates,
distance correlation) and the server-side gradient filter on the wire."""

import math

import pytest
import torch

from vfl_lightning.privacy.defenses.callback import GradientNoise
from vfl_lightning.privacy.defenses.gradient import (
    add_gradient_noise,
    dcor_gradient,
    distance_correlation,
    sparsify,
)
from vfl_lightning.privacy.defenses.label_dp import keep_probability, randomized_response
from vfl_lightning.train import train
from vfl_lightning.wire import DOWNLINK, Wire

SHORT = ["trainer.limit_val_batches=1", "callbacks.checkpoint=null", "test=false"]


@pytest.mark.parametrize(("distribution", "variance"), [("gaussian", 1.0), ("laplace", 2.0)])
def test_gradient_noise_has_the_scale_it_names(distribution, variance):
    generator = torch.Generator().manual_seed(0)
    n, scale = 200_000, 0.3
    noisy = add_gradient_noise(
        torch.ones(n, dtype=torch.float64),
        scale=scale,
        distribution=distribution,
        generator=generator,
    )
    noise = noisy - 1.0
    sd_mean = scale * math.sqrt(variance / n)
    assert abs(float(noise.mean())) < 5 * sd_mean
    assert float(noise.var()) == pytest.approx(variance * scale**2, rel=0.03)


def test_sparsification_keeps_exactly_the_largest_entries():
    gradient = torch.tensor([[0.1, -5.0, 0.3], [2.0, -0.2, 0.0]])
    assert sparsify(gradient, keep_fraction=0.3).tolist() == [[0.0, -5.0, 0.0], [2.0, 0.0, 0.0]]
    assert torch.equal(sparsify(gradient, keep_fraction=1.0), gradient)


def test_randomized_response_keeps_each_label_at_its_rate():
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 10, (100_000,), generator=generator)
    noisy = randomized_response(labels, epsilon=2.0, num_classes=10, generator=generator)
    kept = float((noisy == labels).double().mean())
    p = keep_probability(2.0, 10)
    assert p == pytest.approx(math.e**2 / (math.e**2 + 9))
    assert abs(kept - p) < 5 * math.sqrt(p * (1 - p) / len(labels))
    assert int(noisy.min()) == 0 and int(noisy.max()) == 9
    with pytest.raises(ValueError, match=r"defense.epsilon must be > 0, got 0"):
        randomized_response(labels, epsilon=0, num_classes=10, generator=generator)


def test_distance_correlation_and_its_penalty_gradient():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(1024, 4, generator=generator, dtype=torch.float64)
    assert float(distance_correlation(x, x)) == pytest.approx(1.0)
    assert float(distance_correlation(x, 3 * x + 1)) == pytest.approx(1.0)
    independent = torch.randn(1024, 4, generator=generator, dtype=torch.float64)
    assert float(distance_correlation(x, independent)) < 0.2
    labels = (x[:, 0] > 0).long()
    onehot = torch.nn.functional.one_hot(labels, 2).double()
    before = float(distance_correlation(x, onehot))
    stepped = x - 50.0 * dcor_gradient(x, labels, 2, weight=1.0)
    assert float(distance_correlation(stepped, onehot)) < before


def test_the_server_sends_the_filtered_gradient_and_the_party_observes_it():
    wire = Wire(2)
    wire.gradient_filters.append(lambda party, g: g * (party + 2))
    heard = []
    wire.listeners.append(lambda party, message: heard.append((party, message.kind)))
    sent = wire.downlink([torch.ones(3), torch.ones(3)])
    assert [s.tolist() for s in sent] == [[2.0] * 3, [3.0] * 3]
    assert wire.observed[DOWNLINK][1].tolist() == [3.0] * 3
    assert heard == [(0, "gradient"), (1, "gradient")]
    uplinked = wire.uplink([torch.ones(3), torch.ones(3)])
    assert all(u.tolist() == [1.0] * 3 for u in uplinked)


def test_bad_defense_parameters_are_refused():
    with pytest.raises(ValueError, match=r"defense.scale must be > 0, got -1"):
        GradientNoise(scale=-1)
    with pytest.raises(ValueError, match=r"defense.distribution must be one of .*got 'cauchy'"):
        GradientNoise(scale=1, distribution="cauchy")


@pytest.mark.parametrize(
    "defense",
    [
        ["defense=gradient_noise", "defense.distribution=laplace"],
        ["defense=gradient_sparsification"],
        ["defense=dcor"],
        ["defense=label_dp"],
    ],
)
def test_each_defense_trains_and_is_recorded(make_cfg, defense):
    plain = train(make_cfg("algo=splitnn", "trainer.max_epochs=1", *SHORT))
    defended = train(make_cfg("algo=splitnn", "trainer.max_epochs=1", *SHORT, *defense))
    assert defended["defense/name"] == defense[0].split("=")[1]
    assert defended["model_digest"] != plain["model_digest"]
    assert defended["val/acc"] > 0.15  # chance: 0.1


def test_a_sparsified_gradient_is_counted_in_its_top_k_form(make_cfg):
    """Under gradient sparsification the server sends each party the kept entries only (their
    packed indices and float32 values): the ledger counts that form, not the dense tensor."""
    common = ["algo=splitnn", "trainer.max_epochs=1", "trainer.limit_train_batches=10", *SHORT]
    plain = train(make_cfg(*common))
    sparse = train(make_cfg(*common, "defense=gradient_sparsification"))
    assert sparse["comm/uplink_mb"] == plain["comm/uplink_mb"]
    # splitnn on digits: 4 parties, batch 32, width 16 -> 512 entries, 52 kept at 32 + 9 bits
    rounds = sparse["comm/rounds"]
    assert rounds == 10
    assert plain["comm/downlink_mb"] == rounds * 4 * 512 * 32 / 8e6
    assert sparse["comm/downlink_mb"] == pytest.approx(rounds * 4 * 52 * 41 / 8e6)
