"""Optuna search (hydra/sweeper=vfl_optuna, experiment=pbm_search): the objective with its
privacy-budget penalty, and a study in which failing trials are recorded without ending it."""

from __future__ import annotations

import json

import pytest
import yaml
from omegaconf import OmegaConf
from test_report import run_multirun

from vfl_lightning.report import make_report
from vfl_lightning.search import objective


def cfg(**search):
    return OmegaConf.create({"optimized_metric": "val/acc", "search": search or None})


def test_objective_returns_the_metric_within_budget():
    results = {"val/acc": 0.8, "privacy/feature_eps": 12.0}
    assert objective(cfg(), results) == 0.8
    assert objective(cfg(max_feature_eps=12.0, penalty=-1.0), results) == 0.8
    assert objective(cfg(max_feature_eps=11.9, penalty=-1.0), results) == -1.0
    assert objective(OmegaConf.create({"optimized_metric": None}), results) is None
    assert objective(cfg(), {"val/loss": 1.0}) is None


def test_unaccounted_run_is_over_any_budget():
    assert objective(cfg(max_feature_eps=1e9, penalty=0.0), {"val/acc": 0.9}) == 0.0


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ({"max_feature_eps": 0.0, "penalty": 0.0}, "search.max_feature_eps must be > 0"),
        ({"max_feature_eps": 5.0, "penalty": None}, "search.penalty must be a finite number"),
        ({"max_feature_eps": 5.0, "penalty": float("nan")}, "search.penalty must be a finite"),
    ],
)
def test_bad_search_settings(search, message):
    with pytest.raises(ValueError, match=message):
        objective(cfg(**search), {"val/acc": 0.5, "privacy/feature_eps": 1.0})


def test_failing_trials_do_not_end_the_study(tmp_path):
    """beta = 0.3 is refused by PBM: those trials fail, the others complete, the study ends with
    the best completed trial (seeded TPE draws both betas within 4 trials)."""
    sweep = tmp_path / "study"
    run_multirun(
        [
            "experiment=pbm_search",
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=3",
            "callbacks.checkpoint=null",
            "hydra.sweeper.n_trials=4",
            "mechanism.beta=choice(0.1,0.3)",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4
    betas = {
        job.name: next(
            o.split("=")[1]
            for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
            if o.startswith("mechanism.beta=")
        )
        for job in jobs
    }
    failed = [job for job in jobs if betas[job.name] == "0.3"]
    completed = [job for job in jobs if betas[job.name] == "0.1"]
    assert failed and completed
    statuses = [json.loads((job / "results.json").read_text())["status"] for job in failed]
    assert statuses == ["failed"] * len(failed)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    accuracies = [json.loads((j / "results.json").read_text())["val/acc"] for j in completed]
    assert best["best_value"] == pytest.approx(max(accuracies))
    assert best["best_params"]["mechanism.beta"] == 0.1
    written = make_report([sweep], tmp_path / "R", progress=False)
    text = (tmp_path / "R" / "report.md").read_text()
    assert len(written) >= 3 and f"{len(completed)} runs" in text
