"""Message canaries (``audit=canary_message``): placed at the party's clipped embedding before the
mechanism, counted as ordinary releases, guessed by the server's likelihood-ratio test, bounded
by the f-DP one-run analysis beside the accountant's ε for exactly those releases; refusals and
resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import RAY_TWO_PARTIES, resume_against_straight

from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms import GaussianLDP
from vfl_lightning.privacy.analysis.tradeoff import GaussianFamily
from vfl_lightning.train import train

SHORT = ["trainer.limit_val_batches=1", "test=false", "callbacks.checkpoint=null"]
LDP = ["algo=ldp", "mechanism.sigma=8.0", "audit=canary_message", "audit.canary_message.count=600"]


def test_canaries_are_the_worst_case_input_before_the_mechanism(make_cfg, monkeypatch):
    """Party 0's release of a canary row is +C in every element (coin 1) or −C (coin 0) when it
    reaches the mechanism; every other row and party releases its own embedding. The run's
    accountant counts the canaries as ordinary releases: after 2 epochs the audit's accountant ε
    (the most-released canary's 2 releases) is the run's own feature ε."""
    from vfl_lightning.algorithms.local_parties import LocalParties

    seen = []
    send, encode = LocalParties.send, GaussianLDP.encode

    def send_spy(self, xs, idx, *, stage, round):
        if stage == "train":
            seen.append({"idx": idx.clone()})
        return send(self, xs, idx, stage=stage, round=round)

    def encode_spy(self, embeddings, **kwargs):
        if seen and "released" not in seen[-1]:
            seen[-1]["released"] = [h.clone() for h in embeddings]
        return encode(self, embeddings, **kwargs)

    monkeypatch.setattr(LocalParties, "send", send_spy)
    monkeypatch.setattr(GaussianLDP, "encode", encode_spy)
    cfg = make_cfg(*LDP, "trainer.max_epochs=2", *SHORT)
    results = train(cfg)
    assert results["audit/canary_message/releases"] == 2
    assert results["audit/canary_message/eps_accountant"] == results["privacy/feature_eps"]
    from vfl_lightning.data import VerticalDataModule

    record = VerticalDataModule(
        name="digits", num_parties=4, canaries=dict(cfg.data.canaries)
    ).canary_records["canary_message"]
    assert record.level == "message" and record.parties == (0,)
    coin = dict(zip(record.rows.tolist(), record.coins.tolist(), strict=True))
    canaries = 0
    for batch in seen[:5]:
        for position, row in enumerate(batch["idx"].tolist()):
            released = [h[position] for h in batch["released"]]
            if row in coin:
                canaries += 1
                assert torch.equal(released[0], torch.full((16,), 2.0 * coin[row] - 1.0)), row
            else:
                assert released[0].abs().max() < 1.0  # its tanh embedding, not a canary
            assert all(h.abs().max() < 1.0 for h in released[1:])  # the other parties' own
    assert 0 < canaries < 5 * 32


def test_ldp_bound_below_the_true_epsilon(make_cfg):
    """LDP, σ = 8, 2 epochs: each canary's releases are exactly μ-GDP with μ = 2C√(P·R)/σ = 1.41.
    The bound is positive and below that mechanism's exact ε, itself below the accountant's."""
    results = train(make_cfg(*LDP, "trainer.max_epochs=2", *SHORT))
    mu = 2.0 * 1.0 * (16 * 2) ** 0.5 / 8.0
    exact = GaussianFamily().epsilon(mu, 1e-5)
    assert results["audit/canary_message/family"] == "gaussian"
    assert results["audit/canary_message/n"] == results["audit/canary_message/released"] == 600
    assert 0.0 < results["audit/canary_message/eps_lower"] <= exact
    assert exact <= results["audit/canary_message/eps_accountant"]
    assert 0.5 < results["audit/canary_message/guess_acc"] < 1.0


def test_pbm_bound_below_the_accountant(make_cfg):
    """PBM, b = 1, β = 0.05, one epoch: the server reads the secure sum; the bound (PBM's family
    of trade-off functions) is positive and below the accountant's ε."""
    results = train(
        make_cfg(
            "algo=pbm",
            "mechanism.b=1",
            "mechanism.beta=0.05",
            "audit=canary_message",
            "audit.canary_message.count=600",
            "trainer.max_epochs=1",
            *SHORT,
        )
    )
    assert results["audit/canary_message/family"] == "pbm"
    bound, accountant = (
        results[f"audit/canary_message/{k}"] for k in ("eps_lower", "eps_accountant")
    )
    assert 0.0 <= bound <= accountant
    assert accountant == results["privacy/feature_eps"]


def test_refusals(make_cfg, monkeypatch):
    import vfl_lightning.run.train as run_train

    def never(*args, **kwargs):
        raise AssertionError("built before the refusal")

    monkeypatch.setattr(run_train, "build_in_data_dir", never)
    with pytest.raises(ConfigError, match=r"^audit=canary_message: mechanism Plain has no priv"):
        train(make_cfg("algo=npq", "audit=canary_message", *SHORT))
    with pytest.raises(ConfigError, match=r"^audit=canary_message: HybridVFL releases its"):
        train(make_cfg("algo=cascade", "audit=canary_message", *SHORT))
    with pytest.raises(ConfigError, match=r"^audit=canary_message: the FedVS family sends coded"):
        train(make_cfg("experiment=fedvs_digits", "audit=canary_message", *SHORT))
    monkeypatch.undo()
    with pytest.raises(Exception, match=r"at most the 1257 training samples: lower audit.canary_m"):
        train(make_cfg(*LDP[:3], "audit.canary_message.count=2000", *SHORT))
    with pytest.raises(Exception, match=r"audit.canary_message.guesses must be null \(planned\)"):
        train(make_cfg(*LDP, "audit.canary_message.guesses=0", *SHORT))


def test_resumed_audit_equals_the_uninterrupted_one(make_cfg):
    """Three epochs straight, or one and a resume to three: the same scores, guesses and bound
    (the audit's state is in the checkpoint)."""
    common = [*LDP, "trainer.limit_val_batches=1", "test=false"]
    straight, resumed, results = resume_against_straight(make_cfg, common, epochs=3, first=1)
    key = next(k for k in straight["callbacks"] if k.startswith("MessageCanaryAudit"))
    assert np.array_equal(straight["callbacks"][key]["sums"], resumed["callbacks"][key]["sums"])
    assert resumed["callbacks"][key]["counts"] == [3] * 600
    assert results["audit/canary_message/releases"] == 3


def test_resume_without_the_audit_state_is_refused(make_cfg):
    """A checkpoint without the audit's state (written by a version that kept it in memory) is
    refused in one line, not resumed into an audit of only the later releases; a checkpoint of a
    run without the audit at all is refused by the resume's configuration check."""
    from conftest import last_checkpoint

    head = make_cfg(*LDP, "trainer.max_epochs=1", *SHORT[:2])
    train(head)
    state = torch.load(last_checkpoint(head), weights_only=False)
    state["callbacks"] = {
        k: v for k, v in state["callbacks"].items() if not k.startswith("MessageCanaryAudit")
    }
    torch.save(state, last_checkpoint(head))
    resumed = make_cfg(*LDP, "trainer.max_epochs=2", f"ckpt_path={last_checkpoint(head)}", *SHORT)
    with pytest.raises(ConfigError, match=r"^audit=canary_message: the checkpoint holds no state"):
        train(resumed)
    plain = make_cfg("algo=ldp", "mechanism.sigma=8.0", "trainer.max_epochs=1", *SHORT[:2])
    train(plain)
    again = make_cfg(*LDP, "trainer.max_epochs=2", f"ckpt_path={last_checkpoint(plain)}", *SHORT)
    with pytest.raises(ConfigError, match=r"with a different configuration: data.canaries"):
        train(again)


@pytest.mark.slow
def test_ray_parties_place_their_own_canaries(make_cfg, ray_session):
    """Under runtime=ray party 0's actor draws the canary rows and coins from the run's seed and
    puts them into its releases: the same bound, guesses and model as runtime=local."""
    common = [*LDP, *RAY_TWO_PARTIES, "trainer.max_epochs=2", "audit.canary_message.count=300"]
    local = train(make_cfg(*common, "runtime=local"))
    remote = train(make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived"))
    assert remote["model_digest"] == local["model_digest"]
    for key in ("eps_lower", "eps_accountant", "guess_acc", "guesses", "correct", "releases"):
        assert remote[f"audit/canary_message/{key}"] == local[f"audit/canary_message/{key}"], key


@pytest.mark.slow
def test_audit_ldp_tight_is_one_point_of_the_frontier(make_cfg):
    """experiment=audit_ldp_tight: the accountant's ε is between 2 and 10 (4.75: μ = 1 over 4
    epochs), the bound stays below the canaries' true ε (4.38) and reaches half the accountant's
    (measured 3.18). The canaries' releases are ±C plus the party's Gaussian noise, whatever the
    models compute, so the bound is the same on every machine."""
    results = train(make_cfg("experiment=audit_ldp_tight", "test=false"))
    accountant = results["audit/canary_message/eps_accountant"]
    assert 2.0 <= accountant <= 10.0 and accountant == pytest.approx(4.7527, abs=1e-3)
    assert results["audit/canary_message/n"] == 9000
    truth = GaussianFamily().epsilon(1.0, 1e-5)
    assert 0.5 * accountant <= results["audit/canary_message/eps_lower"] <= truth


def test_runs_pool_into_one_multi_run_bound(make_cfg, tmp_path):
    """Two seeds of one setting: each run writes its canaries' scores and coins beside
    results.json; together they are one audit of twice the canaries (each coin in one run), still
    below the canaries' true ε. Runs of another setting are not pooled."""
    from pathlib import Path

    from vfl_lightning.privacy.analysis.message_audit import pooled_bound, read_scores

    cfgs = [make_cfg(*LDP, "trainer.max_epochs=2", f"seed={seed}", *SHORT) for seed in (0, 1)]
    runs = [train(cfg) for cfg in cfgs]
    paths = [Path(cfg.paths.output_dir) / "audit_canary_message.npz" for cfg in cfgs]
    setting, scores, coins = read_scores(paths[0])
    assert setting["accounting"] == "ldp" and setting["releases"] == 2 and len(scores) == 600
    assert setting["eps_accountant"] == runs[0]["audit/canary_message/eps_accountant"]
    pooled = pooled_bound(paths)
    assert pooled["runs"] == 2 and pooled["n"] == 1200
    exact = GaussianFamily().epsilon(2.0 * (16 * 2) ** 0.5 / 8.0, 1e-5)
    assert 0.0 < pooled["eps_lower"] <= exact
    other = make_cfg(*LDP, "trainer.max_epochs=1", *SHORT)
    train(other)
    with pytest.raises(ValueError, match=r"was audited with another setting \(releases\)"):
        pooled_bound([paths[0], Path(other.paths.output_dir) / "audit_canary_message.npz"])


@pytest.mark.slow
def test_a_multirun_pools_its_seeds(tmp_path):
    """``python train.py -m ... seed=0,1``: at the end of the sweep the two runs' canaries are one
    multi-run bound (audit_pooled.json in the sweep directory)."""
    import json

    from test_report import run_multirun

    sweep = tmp_path / "sweep"
    run_multirun([*LDP, "trainer.max_epochs=1", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"])
    (pooled,) = json.loads((sweep / "audit_pooled.json").read_text())
    assert pooled["audit"] == "canary_message" and pooled["runs"] == 2 and pooled["n"] == 1200
    assert 0.0 <= pooled["eps_lower"] <= pooled["eps_accountant"]


def test_parties_with_their_own_configuration_are_refused():
    """runtime=grpc parties take no setting from the server, so none would put the canaries into
    its releases: the audit refuses them rather than bound releases that carry no canary."""
    from types import SimpleNamespace

    from vfl_lightning.data.canaries import CanaryRecord
    from vfl_lightning.mechanisms import GaussianLDP
    from vfl_lightning.privacy.audit import MessageCanaryAudit
    from vfl_lightning.runtime.grpc_parties import GrpcParties

    assert GrpcParties.canaries_from_run is False
    record = CanaryRecord(torch.arange(20), torch.zeros(20, dtype=torch.int64), (0,), "message")
    trainer = SimpleNamespace(datamodule=SimpleNamespace(canary_records={"canary_message": record}))
    module = type("SyncRun", (SimpleNamespace,), {"RELEASE_CANARIES": True})(
        mechanism=GaussianLDP(num_parties=2, sigma=1.0),
        party_side=SimpleNamespace(canaries_from_run=False, name="grpc"),
    )
    with pytest.raises(ConfigError, match=r"^audit=canary_message: the grpc parties take no"):
        MessageCanaryAudit(count=20).setup(trainer, module, "fit")
