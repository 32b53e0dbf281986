"""The canary audit in a training run: canaries in the data, the server's guesses from its view
alone, the bound beside the accountant's ε for exactly the canaries' releases, and refusals."""

from __future__ import annotations

import pytest
import torch
from conftest import RAY_TWO_PARTIES as TWO_PARTIES
from conftest import resume_against_straight

from vfl_lightning.data import VerticalDataModule
from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.analysis import DEFAULT_ORDERS, pbm_feature_rdp, rdp_to_dp
from vfl_lightning.privacy.attacks.views import ServerView
from vfl_lightning.privacy.audit import CanaryAudit, CanaryAuditor
from vfl_lightning.train import train

SHORT = [
    "trainer.max_epochs=1",
    "trainer.limit_val_batches=1",
    "test=false",
    "callbacks.checkpoint=null",
]


def test_canaries_in_the_training_data():
    specs = {
        "canary": {"level": "feature", "count": 30, "party": 1},
        "canary_sample": {"level": "sample", "count": 20},
    }
    plain = VerticalDataModule(name="digits", num_parties=4)
    data = VerticalDataModule(name="digits", num_parties=4, canaries=specs)
    again = VerticalDataModule(name="digits", num_parties=4, canaries=specs)
    feature, sample = data.canary_records["canary"], data.canary_records["canary_sample"]
    assert set(feature.rows.tolist()).isdisjoint(sample.rows.tolist())
    assert feature.parties == (1,) and sample.parties == (0, 1, 2, 3)
    assert torch.equal(feature.coins, again.canary_records["canary"].coins)
    train, clean = data.splits["train"], plain.splits["train"]
    assert torch.equal(train.y, clean.y)  # labels are not touched
    rows = feature.rows
    for m in range(4):
        flat, reference = train.xs[m].flatten(1), clean.xs[m].flatten(1)
        if m == 1:
            expected = torch.where(
                feature.coins[:, None].bool(), reference.amax(0), reference.amin(0)
            )
        else:
            expected = reference.mean(0, dtype=torch.float64).float().expand(len(rows), -1)
        assert torch.equal(flat[rows], expected), m
        untouched = torch.ones(len(flat), dtype=torch.bool)
        untouched[torch.cat([feature.rows, sample.rows])] = False
        assert torch.equal(flat[untouched], reference[untouched])


def test_npq_without_noise_gives_the_largest_bound(make_cfg):
    """Plain embeddings: the server tells every canary apart; the bound is the most 160 audited
    canaries can show, and the accountant's ε is infinite."""
    results = train(make_cfg("algo=npq", "audit=canary", *SHORT))
    assert results["audit/canary/n"] == 160
    assert results["audit/canary/guess_acc"] == 1.0
    assert results["audit/canary/eps_lower"] == results["audit/canary/eps_lower_max"] > 3.0
    assert results["audit/canary/eps_accountant"] == "inf"
    assert results["audit/canary/releases"] == 1


def test_pbm_bound_stays_below_the_accountant(make_cfg, monkeypatch):
    """One epoch of PBM: each canary is released once; the accountant's ε for that release is the
    run's own feature ε after one epoch (every sample released once), and the bound is below it.
    The auditor is handed what the server's view holds and nothing else."""
    views, seen = [], []
    observe, view_of = CanaryAuditor.observe, CanaryAudit.server_view

    def view_spy(self, idx, labels, num_parties):
        views.append(view_of(self, idx, labels, num_parties))
        return views[-1]

    def spy(self, idx, received):
        seen.append((idx, received))
        observe(self, idx, received)

    monkeypatch.setattr(CanaryAudit, "server_view", view_spy)
    monkeypatch.setattr(CanaryAuditor, "observe", spy)
    results = train(make_cfg("algo=pbm", "audit=[canary,canary_sample]", *SHORT))
    assert seen and all(isinstance(view, ServerView) for view in views)
    assert all(
        idx is view.idx and received is view.received
        for (idx, received), view in zip(seen, views, strict=True)
    )
    for name in ("canary", "canary_sample"):
        assert results[f"audit/{name}/releases"] == 1
        assert 0.0 <= results[f"audit/{name}/eps_lower"] <= results[f"audit/{name}/eps_accountant"]
    rdp = pbm_feature_rdp(
        orders=DEFAULT_ORDERS, b=16, beta=0.15, num_parties=4, embedding_dim=16, uses=1
    )
    assert (
        results["audit/canary/eps_accountant"]
        == rdp_to_dp(orders=DEFAULT_ORDERS, rdp=rdp, delta=1e-5)[0]
    )
    assert results["audit/canary/eps_accountant"] == results["privacy/feature_eps"]
    assert results["audit/canary_sample/eps_accountant"] == results["privacy/sample_eps"]


def test_bad_audit_settings_are_refused(make_cfg):
    with pytest.raises(ValueError, match=r"audit.canary.count must be an integer >= 2, got 1"):
        VerticalDataModule(name="digits", canaries={"canary": {"count": 1}})
    with pytest.raises(
        ValueError,
        match=r"must be at most half of the 1257 training samples: lower audit.canary.count$",
    ):
        VerticalDataModule(name="digits", canaries={"canary": {"count": 700}})
    with pytest.raises(ValueError, match=r"lower audit.canary.count or audit.canary_sample.count$"):
        VerticalDataModule(
            name="digits", canaries={"canary": {"count": 400}, "canary_sample": {"count": 400}}
        )
    with pytest.raises(ValueError, match=r"audit.canary.party must be in \[0, 3\].*got 4"):
        VerticalDataModule(name="digits", canaries={"canary": {"count": 20, "party": 4}})
    with pytest.raises(
        ValueError, match=r"audit.canary.known must be an integer in .* = \[2, 10\]"
    ):
        CanaryAudit(count=20, known=15)
    with pytest.raises(ConfigError, match=r"data=party_files reads exported party files"):
        train(make_cfg("data=party_files", "data.dir=/nonexistent", "audit=canary", *SHORT))


def test_fedvs_is_refused_before_anything_is_built(make_cfg, monkeypatch):
    """The refusal comes from the configuration alone: no data module, party, trainer (or
    Lightning's device lines) before it."""
    import vfl_lightning.run.train as run_train

    def never(*args, **kwargs):
        raise AssertionError("built before the refusal")

    monkeypatch.setattr(run_train, "build_in_data_dir", never)
    monkeypatch.setattr(run_train, "make_trainer", never)
    with pytest.raises(ConfigError, match=r"^audit=canary: the FedVS family sends coded"):
        train(make_cfg("experiment=fedvs_digits", "audit=canary", *SHORT))


def test_canaries_never_released_are_reported(make_cfg, caplog):
    """trainer.limit_train_batches=10 releases 320 of the 1257 training rows: the audit guesses
    only the audited canaries that reached the server, says how many did, and warns."""
    with caplog.at_level("WARNING", logger="vfl_lightning.privacy.audit.canary"):
        results = train(
            make_cfg("algo=npq", "audit=canary", "trainer.limit_train_batches=10", *SHORT)
        )
    released = results["audit/canary/released"]
    assert 0 < released < results["audit/canary/n"] == 160
    assert results["audit/canary/guesses"] <= released
    assert results["audit/canary/guess_acc"] == 1.0 and results["audit/canary/eps_lower"] > 0
    assert f"{released} of the 160 audited canaries were released" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="vfl_lightning.privacy.audit.canary"):
        few = train(make_cfg("algo=npq", "audit=canary", "trainer.limit_train_batches=3", *SHORT))
    # 96 rows: too few known canaries of both coins reached the server to fit a rule, so no guess
    assert few["audit/canary/guesses"] == 0 and few["audit/canary/guess_acc"] is None
    assert few["audit/canary/eps_lower"] == 0.0 and few["audit/canary/released"] < 20
    assert "audited canaries were released in training" in caplog.text


def test_resumed_audit_equals_the_uninterrupted_one(make_cfg):
    """Three epochs straight, or one and a resume to three: what the auditor observed (every
    canary's summed releases and their count) is in the checkpoint, so both audits are one."""
    common = [
        "algo=pbm",
        "audit=[canary,canary_sample]",
        "trainer.limit_val_batches=1",
        "test=false",
    ]
    straight, resumed, results = resume_against_straight(make_cfg, common, epochs=3, first=1)
    keys = [k for k in straight["callbacks"] if k.startswith("CanaryAudit")]
    assert len(keys) == 2  # one state per audit
    for key in keys:
        assert torch.equal(straight["callbacks"][key]["sums"], resumed["callbacks"][key]["sums"])
        assert torch.equal(
            straight["callbacks"][key]["counts"], resumed["callbacks"][key]["counts"]
        )
    assert results["audit/canary/releases"] == 3 and results["audit/canary/released"] == 160


@pytest.mark.slow
def test_ray_audit_reads_the_server_view_as_local(make_cfg, ray_session):
    """Under runtime=ray every party actor writes the canaries into its own columns and the
    auditor reads the wire in the server process, which holds no party column: the same guesses,
    bound and model as runtime=local (derived party seeds)."""
    common = [
        "algo=pbm",
        *TWO_PARTIES,
        "trainer.max_epochs=2",
        "audit=canary",
        "audit.canary.count=100",
    ]
    local = train(make_cfg(*common, "runtime=local"))
    remote = train(make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived"))
    assert remote["model_digest"] == local["model_digest"]
    for key in ("eps_lower", "eps_accountant", "guess_acc", "n", "guesses", "correct", "releases"):
        assert remote[f"audit/canary/{key}"] == local[f"audit/canary/{key}"], key
