"""FedVS under runtime=ray: exact decoding from the coded embeddings that really arrive first (a
straggler is never among them), the local runtime's ledger and clock, resume, a dead actor, and
what stays refused."""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
from conftest import (
    actor_parameters,
    actor_states,
    compose_config,
    kill_party,
    load_actor_states,
    ray_party_dir,
    saved_party_states,
)
from conftest import last_checkpoint as last

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.errors import ConfigError, PartyLost
from vfl_lightning.mechanisms.analytic_gaussian import privatize_embedding
from vfl_lightning.mechanisms.base import release_round
from vfl_lightning.mechanisms.fedvs import segment_rows
from vfl_lightning.mechanisms.field import field_matmul, quantize
from vfl_lightning.models.pn import PolynomialNetwork
from vfl_lightning.train import attach_ray_parties, build, train
from vfl_lightning.wire import DOWNLINK, PEER, UPLINK

FOUR_CLIENTS = ["experiment=fedvs_digits", "data.num_parties=4", "test=false"]
"""N = 4 clients, K = T = 1: R = 3, so one straggler can be left out of every round."""


@pytest.fixture(scope="module")
def ray_fedvs(ray_session, tmp_path_factory):
    """(cfg, datamodule, module) of a 4-client FedVS run whose clients are Ray actors, built once
    for the module (starting the actors is most of the cost); the last test kills one."""
    cfg = compose_config(
        tmp_path_factory.mktemp("ray_fedvs"),
        *FOUR_CLIENTS,
        "runtime=ray",
        "runtime.party_seeds=derived",
        "runtime.time_scale=0.01",
        "trainer.max_steps=4",
        "trainer.limit_val_batches=1",
        "callbacks.checkpoint=null",
    )
    L.seed_everything(cfg.seed, workers=True)
    datamodule, module = build(cfg)
    attach_ray_parties(cfg, module)
    yield cfg, datamodule, module
    module.party_side.close()


def party_columns(cfg, num_parties: int, stage: str) -> list[torch.Tensor]:
    """Every client's columns of ``stage`` (the test reads them; the server holds none)."""
    factory = PartyFactory.from_config(cfg)
    return [factory.own_columns(m)[0][stage] for m in range(num_parties)]


def on_grid(states: list[dict], bits: int) -> list[dict]:
    """The actors' states with every weight rounded to the 2^-bits grid, where stochastic
    rounding (eq. 3) is exact, so the quantized models are known to the test."""
    actors = []
    for actor in states:
        model = dict(actor["model"])
        model["weight"] = torch.round(model["weight"] * 2**bits) / 2**bits
        actors.append(actor | {"model": model})
    return actors


def test_decodes_exactly_from_the_first_R_arrivals_never_the_straggler(ray_fedvs):
    cfg, datamodule, module = ray_fedvs
    parties, codec = module.party_side, module.codec
    saved = actor_states(parties)
    load_actor_states(parties, on_grid(saved, codec.l_w))
    N, p = module.num_parties, codec.prime
    train_xs = party_columns(cfg, module.num_parties, "train")
    power = [PolynomialNetwork(x.shape[1:], num_layers=2).power_features(x) for x in train_xs]
    weights = [w for name, w in actor_parameters(parties) if name.endswith("weight")]
    quantized_x = [quantize(f, codec.l_x, p) for f in power]
    quantized_w = [quantize(w, codec.l_w, p) for w in weights]
    bits = parties.share_data()
    assert bits == [len(train_xs[0]) * f.shape[1] * 31 for f in power]
    positions = torch.arange(7, 7 + datamodule.per_segment_batch)
    plain = torch.zeros(len(positions), 16, dtype=torch.long)
    for x, w in zip(quantized_x, quantized_w, strict=True):
        plain = (plain + field_matmul(x[positions], w, p)) % p
    for straggler in range(N):
        # 0.5 s of real delay for one client, none for the others: it cannot be among the first R
        upload = np.where(np.arange(N) == straggler, 50.0, 0.0)
        parties.share_models(np.zeros(N))
        modelled = [n for n in range(N) if n != straggler]
        responders, coded = parties.coded_embeddings(positions, upload, modelled)
        assert len(responders) == len(set(responders)) == codec.threshold == 3
        assert straggler not in responders
        assert coded.dtype == torch.int64
        decoded = codec.code.decode(coded, responders)
        assert torch.equal(decoded[0], plain)
        average = codec.decode_average(coded, responders)
        assert torch.equal(average, codec.code.dequantize_average(plain[None], 8, 8)[0])
    load_actor_states(parties, saved)


def test_trains_like_the_local_runtime_on_the_protocol_ledger_and_clock(ray_fedvs, tmp_path):
    """The same rounds: the same peer bits per client, uplink and downlink totals, rounds and
    simulated time (delays are drawn on the server's clock); the responders are real arrivals."""
    cfg, datamodule, module = ray_fedvs
    module.wire.ledger.serialized_bytes = 0  # what the decoding test sent is not this run's
    trainer = L.Trainer(
        max_steps=4, limit_val_batches=1, logger=False, enable_checkpointing=False, callbacks=[]
    )
    trainer.fit(module, datamodule=datamodule)
    local_cfg = compose_config(
        tmp_path, *FOUR_CLIENTS, "trainer.max_steps=4", "callbacks.checkpoint=null"
    )
    L.seed_everything(local_cfg.seed, workers=True)
    local_data, local = build(local_cfg)
    L.Trainer(
        max_steps=4, limit_val_batches=1, logger=False, enable_checkpointing=False, callbacks=[]
    ).fit(local, datamodule=local_data)
    remote, here = module.wire.ledger, local.wire.ledger
    assert remote.rounds == here.rounds == 4
    assert remote.bits[PEER] == here.bits[PEER]
    for direction in (UPLINK, DOWNLINK):
        assert remote.total_bits(direction) == here.total_bits(direction)
    assert module.wire.clock.now == local.wire.clock.now
    assert sum(module.responder_counts) == 4 * 3
    assert math.isfinite(float(trainer.callback_metrics["train/loss_epoch"]))
    (validated,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    assert 0.0 <= validated["val/acc"] <= 1.0
    # shares, 4 x 3 coded embeddings of 64 x 16 int32 and 4 x 4 gradients of 64 x 16 float32
    payload = sum(remote.bits[PEER]) / 8 + 4 * (3 + 4) * 64 * 16 * 4
    assert payload < remote.serialized_bytes < 1.2 * payload
    assert here.serialized_bytes == 0


def test_evaluation_decodes_the_average_from_coded_embeddings_exactly(ray_fedvs):
    """Under Ray, FedVS evaluation goes through the coded path: each client shares its
    evaluation split once and its model per evaluation, and no plain embedding is sent. On weights
    on the 2^-l_w grid the decoded average is exactly the average of the quantized products."""
    cfg, _, module = ray_fedvs
    parties, codec = module.party_side, module.codec
    saved = actor_states(parties)
    load_actor_states(parties, on_grid(saved, codec.l_w))
    try:
        val_xs = party_columns(cfg, module.num_parties, "val")
        weights = [w for name, w in actor_parameters(parties) if name.endswith("weight")]
        idx = torch.tensor([5, 0, 17, 3, 3, 40])
        fresh = 1 << 40  # above every validation round the module's own evaluations used
        parties.restart_stream("val", release_round("val", fresh))
        decoded = parties.eval_average(val_xs, idx, "val")
        total = torch.zeros(len(idx), 16, dtype=torch.long)
        plain = torch.zeros(len(idx), 16)
        for x, w in zip(val_xs, weights, strict=True):
            power = PolynomialNetwork(x.shape[1:], num_layers=2).power_features(x[idx])
            product = field_matmul(
                quantize(power, codec.l_x, codec.prime), quantize(w, 8, codec.prime), codec.prime
            )
            total = (total + product) % codec.prime
            plain += power @ w / module.num_parties
        expected = codec.code.dequantize_average(total[None], codec.l_x, codec.l_w)[0]
        assert decoded.dtype == torch.float32
        assert torch.equal(decoded, expected.to(torch.float32))
        assert torch.allclose(decoded, plain, atol=0.05)
        with pytest.raises(RuntimeError, match="coded path"):
            parties.eval_embeddings(val_xs, idx, "val")
        # a second evaluation shares the models again (a new exchange), the data shares once
        exchange = parties.eval_exchanges["val"]
        parties.restart_stream("val", release_round("val", fresh + 1))
        assert torch.equal(parties.eval_average(val_xs, idx, "val"), decoded)
        assert parties.eval_exchanges["val"] == exchange + 1
    finally:
        load_actor_states(parties, saved)


def test_a_dead_actor_stops_the_round_in_one_line(ray_fedvs):
    import ray

    _, _, module = ray_fedvs
    parties = module.party_side
    ray.kill(parties.actors[2])
    rounds = module.wire.ledger.rounds
    parties.share_models(np.zeros(4))
    with pytest.raises(PartyLost) as error:
        parties.coded_embeddings(torch.arange(4), np.zeros(4), [0, 1, 3])
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"party 2's Ray actor died at training round {rounds} (model shares)")


# ----------------------------------------------------------------- refusals (no Ray needed)
@pytest.mark.parametrize("value", [0, -0.5, "fast", float("inf"), True])
def test_time_scale_must_be_a_positive_number(make_cfg, value):
    cfg = make_cfg("experiment=fedvs_digits", "runtime=ray", "runtime.party_seeds=derived")
    cfg.runtime.time_scale = value
    with pytest.raises(ConfigError) as error:
        train(cfg)
    assert str(error.value) == (
        "runtime.time_scale must be a finite number > 0 (real seconds slept per modelled "
        f"second of delay), got {value!r}"
    )


# ----------------------------------------------------------------- slow: whole runs
@pytest.mark.slow
def test_dead_actor_then_resume_equals_the_straight_run(make_cfg, ray_session):
    """A round's decoded sum is exact whoever responds, so a Ray run is deterministic: the run
    resumed from the checkpoint kept when a client died ends bit-identical to the straight one."""
    common = [
        *FOUR_CLIENTS,
        "runtime=ray",
        "runtime.party_seeds=derived",
        "trainer.limit_train_batches=3",
    ]
    common += ["trainer.limit_val_batches=1", "algo.max_simulated_s=null", "trainer.max_epochs=2"]
    straight = make_cfg(*common)
    expected = train(straight)
    killed, message = kill_party(make_cfg, common, epoch=1, batch=1, party=3)
    assert message.startswith("party 3's Ray actor died at training round 4 (model shares)")
    checkpoint = torch.load(last(killed), weights_only=False)
    assert (
        checkpoint["epoch"] == 0
        and len(saved_party_states(ray_party_dir(killed), checkpoint, 4)) == 4
    )
    resumed_cfg = make_cfg(*common, f"ckpt_path={last(killed)}")
    resumed = train(resumed_cfg)
    assert resumed["model_digest"] == expected["model_digest"]
    assert resumed["time/simulated_s"] == expected["time/simulated_s"]
    assert sum(resumed["fedvs/responder_counts"]) == 3 * resumed["comm/rounds"] == 18


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["fedvs_wait", "fedvs_ignore", "fedvs_wait_dp"])
def test_baselines_under_ray_keep_the_local_clock_and_uplink_what_arrived(
    make_cfg, ray_session, algo
):
    common = [*FOUR_CLIENTS, f"algo={algo}", "trainer.max_epochs=1"]
    common += ["trainer.limit_train_batches=4", "trainer.limit_val_batches=1"]
    remote = train(make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived"))
    local = train(make_cfg(*common))
    assert remote["time/simulated_s"] == local["time/simulated_s"]
    assert math.isfinite(remote["train/loss_epoch"]) and 0 <= remote["val/acc"] <= 1
    per_round = 64 * 16 * 4 / 1e6  # one float32 embedding of a batch, in MB
    if algo == "fedvs_wait":
        # every client, every round: the same plain float32 arithmetic as the local runtime
        assert remote["comm/uplink_mb"] == local["comm/uplink_mb"] == 4 * 4 * per_round
        assert remote["model_digest"] == local["model_digest"]
    elif algo == "fedvs_ignore":
        assert 4 * per_round <= remote["comm/uplink_mb"] <= 4 * 4 * per_round
    else:
        assert remote["comm/uplink_mb"] == local["comm/uplink_mb"] == 4 * 4 * per_round
        assert remote["fedvs/dp_sigma"] == local["fedvs/dp_sigma"] > 1
        # the clients add the noise and never send the clean embedding: no acc_clean under Ray
        assert "val/acc_clean" in local and "val/acc_clean" not in remote


@pytest.mark.slow
def test_wait_dp_clients_add_the_calibrated_noise_themselves(ray_session, tmp_path):
    cfg = compose_config(
        tmp_path, *FOUR_CLIENTS, "algo=fedvs_wait_dp", "runtime=ray", "runtime.party_seeds=derived"
    )
    L.seed_everything(cfg.seed, workers=True)
    datamodule, module = build(cfg)
    attach_ray_parties(cfg, module)
    try:
        parties, dp = module.party_side, module.dp
        idx = torch.arange(256)
        xs = [x[idx] for x in party_columns(cfg, module.num_parties, "val")]
        weights = [w for name, w in actor_parameters(parties) if name.endswith("weight")]
        noisy = parties.eval_embeddings(xs, idx, "val")
        assert parties.clean_embeddings(xs) is None
        for x, w, h in zip(xs, weights, noisy, strict=True):
            clean = PolynomialNetwork(x.shape[1:], num_layers=2).power_features(x) @ w
            residual = h - privatize_embedding(clean, clip=dp.clip, sigma=0.0, generator=None)
            # 256 x 16 draws of N(0, sigma^2): the sample std is within 5% of sigma
            assert abs(float(residual.std()) / dp.sigma - 1) < 0.05
    finally:
        module.party_side.close()


def test_evaluation_rows_map_to_their_segment_and_position():
    """K = 3 segments of S = 7 (a split of 19 rows padded to 21): every sample i is read back from
    the decoded average's row of (segment i // S, position i mod S), whatever the batch order."""
    segment, K = 7, 3
    idx = torch.tensor([18, 0, 7, 14, 3, 10, 3, 17])
    positions, rows = segment_rows(idx, segment)
    assert positions.tolist() == [0, 3, 4]
    # the decoded average, segment-major: row k * len(positions) + j is sample k * S + positions[j]
    average = torch.tensor([k * segment + int(p) for k in range(K) for p in positions])
    assert torch.equal(average[rows], idx)


@pytest.mark.slow
def test_coded_evaluation_in_two_segments_scores_as_the_local_plain_evaluation(
    make_cfg, ray_session
):
    """K = 2 (R = 5 of 8 clients): the whole validation split, decoded from coded embeddings,
    scores as the local runtime's plain evaluation (a misplaced row would score near chance)."""
    common = ["experiment=fedvs_digits", "algo.K=2", "trainer.max_epochs=4", "test=false"]
    common += ["algo.max_simulated_s=null", "runtime.time_scale=0.001"]
    remote = train(make_cfg(*common, "runtime=ray"))
    local = train(make_cfg(*common[:-1]))
    assert local["val/acc"] > 0.6
    assert abs(remote["val/acc"] - local["val/acc"]) <= 0.05, (remote["val/acc"], local["val/acc"])
