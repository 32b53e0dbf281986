"""A release without noise has ε = ∞, never 0: an evaluation without the mechanism
(``mechanism.apply_at_eval=false``, runtime=local; runtime=ray refuses it) reports an infinite
evaluation ε in the log, results.json (strict JSON: the string "inf") and the summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

from conftest import RAY_TWO_PARTIES

from vfl_lightning.mechanisms import PBM
from vfl_lightning.privacy.accountant import PrivacyAccountant
from vfl_lightning.run.summary import _privacy_line
from vfl_lightning.train import train

SHORT = [*RAY_TWO_PARTIES, "trainer.max_epochs=1", "trainer.limit_train_batches=2"]


def test_a_clean_evaluation_release_makes_the_evaluation_epsilon_infinite():
    accountant = PrivacyAccountant(
        PBM(num_parties=2, b=4, beta=0.1), embedding_dim=4, num_samples=100
    )
    accountant.record_evaluation("val", [0, 1], 10)
    noisy = accountant.spent()["eval_feature_eps"]
    assert 0 < noisy < math.inf
    accountant.record_evaluation("test", [3], 10, clean=True)
    spent = accountant.spent()
    assert spent["eval_feature_eps"] == spent["eval_sample_eps"] == math.inf
    restored = PrivacyAccountant(
        PBM(num_parties=2, b=4, beta=0.1), embedding_dim=4, num_samples=100
    )
    restored.load_state_dict(accountant.state_dict())
    assert restored.spent()["eval_feature_eps"] == math.inf


def test_a_run_evaluating_without_the_mechanism_reports_infinite_evaluation_epsilon(make_cfg):
    cfg = make_cfg("algo=pbm", *SHORT, "mechanism.apply_at_eval=false")
    results = train(cfg)
    assert results["privacy/eval_feature_eps"] == results["privacy/eval_sample_eps"] == "inf"
    assert 0 < results["privacy/feature_eps"] < math.inf  # training went through PBM's noise
    saved = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert float(saved["privacy/eval_feature_eps"]) == math.inf
    assert "evaluation feature ε ∞" in _privacy_line(saved)
    noisy = train(make_cfg("algo=pbm", *SHORT))
    assert 0 < noisy["privacy/eval_feature_eps"] < math.inf
