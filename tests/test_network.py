"""One clock for every protocol: the network config group times every algo's rounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import fit

from vfl_lightning.wire import Network, SimulatedClock

ALGOS = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "algo").glob("*.yaml"))
FEDVS_DIGITS = ["experiment=fedvs_digits", "algo.max_simulated_s=null"]


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_logs_simulated_time(make_cfg, algo):
    extra = FEDVS_DIGITS if algo.startswith("fedvs") else []
    cfg = make_cfg(*extra, f"algo={algo}", "trainer.max_steps=10", "trainer.limit_val_batches=0")
    trainer, module, _ = fit(cfg)
    assert module.wire.clock.now > 0
    assert trainer.callback_metrics["time/simulated_s"] == torch.tensor(module.wire.clock.now)


def test_a_synchronous_round_lasts_latency_plus_size_over_bandwidth(make_cfg):
    batch, width, parties = 32, 16, 4
    cfg = make_cfg(
        "algo=npq",
        "network.mbps=100",
        "network.latency_s=0.25",
        "data.drop_last=true",
        "trainer.max_steps=3",
        "trainer.limit_val_batches=0",
    )
    _, module, _ = fit(cfg)
    assert module.num_parties == parties and module.widths == [width] * parties
    bits = batch * width * 32
    one_way = 0.25 + bits / 100e6
    assert module.wire.clock.now == pytest.approx(3 * 2 * one_way, rel=1e-12)


def test_stragglers_slow_every_protocol_down(make_cfg):
    steps = ["trainer.max_steps=5", "trainer.limit_val_batches=0"]
    plain = fit(make_cfg("algo=npq", *steps))[1].wire.clock.now
    slowed = fit(make_cfg("algo=npq", "network=fedvs", *steps))[1].wire.clock.now
    # 4 parties, the last two with means 2 + 4i/4 = 3 and 4 s: a round waits for the slowest
    assert plain < 0.01 and 5 * 1.0 < slowed < 5 * 20.0


def test_clock_draws_only_for_the_parties_that_took_part():
    network = Network(fast_mean=1.0)
    clock = SimulatedClock(network, num_parties=3, seed=0)
    reference = network.stragglers(3, seed=7177)
    clock.sync_round([0, 600, 0], [0, 300, 0])
    expected = reference.draw()[1] + 600 / 300e6 + 300 / 300e6
    assert clock.now == pytest.approx(expected, rel=1e-12)
    clock.sync_round([0, 0, 0], [0, 0, 0])
    assert clock.now == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mbps": 0}, r"network.mbps must be > 0, got 0.0"),
        ({"latency_s": -1}, r"network.latency_s must be >= 0, got -1.0"),
        ({"macs_per_second": -5}, r"network.macs_per_second must be > 0, got -5.0"),
        ({"straggler_fraction": 2}, r"network.straggler_fraction must be in \[0, 1\], got 2.0"),
        ({"fast_mean": -0.1}, r"network.fast_mean must be >= 0, got -0.1"),
    ],
)
def test_bad_network_values_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        Network(**options)
