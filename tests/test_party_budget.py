"""Each party's own privacy budget: the policy it enforces (a config group locally, its own
policy.yaml under Ray, which the server's command can only tighten), the ε it counts from the
releases it made (equal to the server's accountant on an honest run), and the refusal, before it
is made, of a release past its budget: one line naming the party and its budget, a failed run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import RAY_TWO_PARTIES

from vfl_lightning.algorithms.party_budget import PartyBudget
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.errors import ConfigError, PartyRefusal
from vfl_lightning.mechanisms import PBM, GaussianLDP
from vfl_lightning.run.ray_session import party_trust
from vfl_lightning.runtime.ray_parties import SyncPartyActor
from vfl_lightning.train import train

WHOLE_EPOCHS = [
    "trainer.max_epochs=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
]
"""Honest runs whose every training row is released once an epoch (no batch limit)."""


def results_of(cfg) -> dict:
    return json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())


@pytest.mark.parametrize("algo", ["pbm", "ldp"])
def test_each_party_counts_the_epsilon_the_server_accounts_on_an_honest_run(make_cfg, algo):
    results = train(make_cfg(f"algo={algo}", *WHOLE_EPOCHS))
    assert 0 < results["privacy/feature_eps"] < math.inf
    for m in range(4):
        assert results[f"privacy/party_{m}/feature_eps"] == results["privacy/feature_eps"]
        assert results[f"privacy/party_{m}/eval_feature_eps"] == results["privacy/eval_feature_eps"]
        assert results[f"privacy/party_{m}/max_row_releases"] == 2


def test_a_plain_release_is_counted_as_infinite_epsilon(make_cfg):
    results = train(make_cfg("algo=npq", "trainer.max_epochs=1", "trainer.limit_train_batches=2"))
    assert results["privacy/party_0/feature_eps"] == "inf"
    assert "privacy/feature_eps" not in results  # the server accounts no plain protocol


def test_a_release_past_the_party_budget_stops_the_run_in_one_line(make_cfg):
    """The cap allows one release of a row: the first epoch trains, the first batch of the
    second is refused before any party releases it; results.json says failed, with the line."""
    ldp = GaussianLDP(num_parties=4, b=16, beta=0.15)
    budget = PartyBudget(0, PartyPolicy(max_feature_eps=1e9), ldp, embedding_dim=16)
    cap = (budget.epsilon(1) + budget.epsilon(2)) / 2
    cfg = make_cfg("algo=ldp", *WHOLE_EPOCHS, f"policy.max_feature_eps={cap}")
    with pytest.raises(PartyRefusal) as error:
        train(cfg)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"party 0 refused send: its budget policy.max_feature_eps={cap} at δ = 1e-05, which "
        "allows 1 release(s) of a row: this would be release 2 of row "
    )
    saved = results_of(cfg)
    assert saved["status"] == "failed" and saved["error"] == message
    assert saved["epochs"] == 1 and saved["privacy/party_0/max_row_releases"] == 1


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (["algo=npq", "policy.allow_clean=false"], "under its policy.allow_clean=False"),
        (["algo=npq", "policy.max_feature_eps=10"], "a release without noise has ε = ∞"),
        (
            ["algo=pbm", "mechanism.apply_at_eval=false", "policy.allow_clean=false"],
            "send: it releases nothing without noise",
        ),
        (["algo=ldp", "policy.min_noise=100"], r"its noise [0-9.]+ .* below its policy.min_noise"),
        (
            ["algo=pbm", "policy.max_releases_per_row=1", "trainer.max_epochs=2"],
            "its budget policy.max_releases_per_row=1: this would be release 2 of row",
        ),
    ],
    ids=["clean", "clean_capped", "clean_evaluation", "min_noise", "releases_per_row"],
)
def test_the_policy_refuses_before_the_release(make_cfg, overrides, refusal):
    cfg = make_cfg(*overrides, "trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=1")
    with pytest.raises(PartyRefusal, match=f"^party 0 refused .*{refusal}"):
        train(cfg)
    assert results_of(cfg)["status"] == "failed"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.max_feature_eps=-1", "^policy.max_feature_eps must be a number > 0 or null"),
        ("policy.delta=1", r"^policy.delta must be a number in \(0, 1\), got 1"),
        ("policy.max_releases_per_row=1.5", "^policy.max_releases_per_row must be an integer"),
        ("policy.large_gradient=ignore", r"^policy.large_gradient must be one of \('refuse'"),
    ],
)
def test_a_bad_policy_is_refused_before_anything_trains(make_cfg, override, message):
    from vfl_lightning.run.checks import check_runtime

    with pytest.raises(ConfigError, match=message) as error:
        check_runtime(make_cfg("algo=pbm", override))
    assert "\n" not in str(error.value)


def test_the_budget_counts_the_most_released_row_and_refuses_nothing_it_does_not_record():
    pbm = PBM(num_parties=2, b=4, beta=0.1)
    budget = PartyBudget(0, PartyPolicy(max_releases_per_row=2), pbm, embedding_dim=4)
    budget.admit("send", "train", np.array([0, 1]), pbm.noise_multiplier)
    budget.admit("send", "train", np.array([1, 2]), pbm.noise_multiplier)
    with pytest.raises(PartyRefusal, match="release 3 of row 1 of train"):
        budget.admit("send", "train", np.array([3, 1]), pbm.noise_multiplier)
    with pytest.raises(PartyRefusal, match="release 3 of row 5 of train"):
        budget.admit("send", "train", np.array([5, 5, 5]), pbm.noise_multiplier)  # repeats count
    assert budget.most_released(training=True) == 2  # the refused releases were not counted
    budget.admit("send", "val", None, pbm.noise_multiplier)  # rows it cannot name: every row
    assert budget.spent()["eval_max_row_releases"] == 1
    assert budget.spent()["feature_eps"] == budget.epsilon(2)
    restored = PartyBudget(0, budget.policy, pbm, embedding_dim=4)
    restored.load_state_dict(budget.state_dict())
    assert restored.spent() == budget.spent()


def counted_at_once(releases) -> np.ndarray:
    """Each release added to the counts as it is recorded: the array grows to the larger of the
    release's row count and twice its length when a row is past its end."""
    counts = None
    for rows in releases:
        top = int(rows.max()) + 1
        if counts is None or len(counts) < top:
            grown = np.zeros(max(top, 0 if counts is None else 2 * len(counts)), dtype=np.int64)
            if counts is not None:
                grown[: len(counts)] = counts
            counts = grown
        np.add.at(counts, rows, 1)
    return counts


def test_the_counts_hold_every_recorded_release_whenever_they_are_read():
    """Releases are added to the counts when the counts are read: every reading (the counts,
    the most-released row, the state) equals counting each release as it was recorded, also
    after a release names a row from the end (a negative index), and a row cap sees them."""
    rng = np.random.default_rng(0)
    pbm = PBM(num_parties=2, b=4, beta=0.1)
    budget = PartyBudget(0, PartyPolicy(), pbm, embedding_dim=4)
    releases = [rng.integers(0, top, size=8) for top in (3, 5, 40, 41, 12, 200, 7)]
    releases.insert(4, np.array([-1, 2, -3]))
    for step, rows in enumerate(releases):
        held = rows.copy()
        budget.admit("send", "train", held, pbm.noise_multiplier)
        held[:] = 0  # the budget keeps what it was given, not the caller's array
        if step in (1, 6):
            assert np.array_equal(budget.counts["train"], counted_at_once(releases[: step + 1]))
    expected = counted_at_once(releases)
    assert np.array_equal(budget.counts["train"], expected)
    budget.admit("send", "train", np.array([1, 1]), pbm.noise_multiplier)
    expected[1] += 2
    assert budget.most_released(training=True) == int(expected.max())
    assert np.array_equal(budget.state_dict()["counts"]["train"].numpy(), expected)
    budget.admit("send", "train", np.array([0]), pbm.noise_multiplier)
    restored = PartyBudget(0, budget.policy, pbm, embedding_dim=4)
    restored.admit("send", "train", np.array([7]), pbm.noise_multiplier)  # replaced by the load
    restored.load_state_dict(budget.state_dict())
    assert np.array_equal(restored.counts["train"], budget.counts["train"])
    capped = PartyBudget(0, PartyPolicy(max_releases_per_row=2), pbm, embedding_dim=4)
    capped.load_state_dict(budget.state_dict())
    capped.counts = {}  # a fresh count: two releases of row 4 are recorded, a third is refused
    for _ in range(2):
        capped.record("train", np.array([4]), pbm.noise_multiplier)
    with pytest.raises(PartyRefusal, match="release 3 of row 4 of train"):
        capped.check("send", "train", np.array([4]), pbm.noise_multiplier)


# ----------------------------------------------------------------- the party's own policy (Ray)
def actor(make_cfg, party_dir: Path, *overrides) -> SyncPartyActor:
    cfg = make_cfg(*RAY_TWO_PARTIES, "runtime=ray", f"runtime.party_dir={party_dir}", *overrides)
    from vfl_lightning.run.runtimes import party_policy

    factory, trust = PartyFactory.from_config(cfg), party_trust(cfg)
    return SyncPartyActor(factory, 0, 1, trust, policy=party_policy(cfg))


def test_a_ray_party_keeps_its_own_policy_which_the_command_only_tightens(make_cfg, tmp_path):
    (tmp_path / "party_0").mkdir()
    (tmp_path / "party_0" / "policy.yaml").write_text(
        "max_feature_eps: 50\nmax_releases_per_row: 3\n"
    )
    looser = actor(make_cfg, tmp_path, "algo=ldp", "policy.max_feature_eps=1000")
    policy = looser.own.guard.policy
    assert (policy.max_feature_eps, policy.max_releases_per_row) == (50, 3)
    tighter = actor(make_cfg, tmp_path, "algo=ldp", "policy.max_releases_per_row=1")
    assert tighter.own.guard.policy.max_releases_per_row == 1
    rows = torch.arange(4)
    tighter.send(rows, "train", 0)
    with pytest.raises(PartyRefusal, match="party_0/policy.yaml: max_releases_per_row=1: this"):
        tighter.send(rows, "train", 1)
    assert tighter.privacy_spent()["max_row_releases"] == 1


def test_a_ray_party_with_an_unusable_policy_file_says_so_at_the_first_call(make_cfg, tmp_path):
    (tmp_path / "party_0").mkdir()
    (tmp_path / "party_0" / "policy.yaml").write_text("max_epsilon: 5\n")
    party = actor(make_cfg, tmp_path, "algo=ldp")
    with pytest.raises(ConfigError, match=r"policy.yaml has unknown policy setting\(s\)"):
        party.publish_key("run")


@pytest.mark.parametrize("algo", ["pbm", pytest.param("ldp", marks=pytest.mark.slow)])
def test_ray_parties_count_the_epsilon_the_server_accounts(make_cfg, ray_session, algo):
    results = train(
        make_cfg(f"algo={algo}", *RAY_TWO_PARTIES, "runtime=ray", "trainer.max_epochs=2")
    )
    assert results["status"] == "finished" and 0 < results["privacy/feature_eps"] < math.inf
    for m in range(2):
        assert results[f"privacy/party_{m}/feature_eps"] == results["privacy/feature_eps"]
        assert results[f"privacy/party_{m}/eval_feature_eps"] == results["privacy/eval_feature_eps"]
