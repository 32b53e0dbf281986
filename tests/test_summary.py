"""The end-of-run summary: the values of results.json a user looks for first, printed once."""

from __future__ import annotations

import json
from pathlib import Path

from vfl_lightning.run.summary import run_summary
from vfl_lightning.train import train


def test_a_finished_run_prints_its_summary_once(make_cfg, capsys):
    cfg = make_cfg("algo=pbm", "trainer.max_epochs=1", "trainer.limit_train_batches=3")
    results = train(cfg)
    out = capsys.readouterr().out
    stored = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert out.count("results: ") == 1 and out.count("model_digest") == 1
    assert f"results: {cfg.paths.output_dir}/results.json" in out
    assert f"model_digest (local): {results['model_digest']}" in out
    assert f"acc {stored['val/acc']:.4f}" in out and f"acc {stored['test/acc']:.4f}" in out
    assert f"feature ε {stored['privacy/feature_eps']:.4g}" in out
    assert f"evaluation feature ε {stored['privacy/eval_feature_eps']:.4g}" in out
    assert f"{stored['comm/total_mb']:.4g} MB" in out
    assert f"{stored['comm/rounds']:.9g} rounds" in out
    assert "s wall" in out and "s simulated" in out


def test_summary_lines():
    results = {
        "status": "finished",
        "algo": "fedbcd",
        "data": "breast_cancer",
        "num_parties": 2,
        "seed": 1,
        "epochs": 3,
        "comm/rounds": 21.0,
        "val/acc": 0.93,
        "val/auroc": 0.981,
        "comm/total_mb": 0.05,
        "time/wall_s": 1.5,
        "time/simulated_s": 0.002,
        "target_metric": "val/auroc",
        "target_value": 0.97,
        "epoch_to_target": 2,
        "rounds_to_target": 14,
        "mb_to_target": 0.03,
        "runtime": "local",
        "model_digest": "ab",
    }
    text = run_summary(results, "/tmp/run")
    lines = text.splitlines()
    assert (
        lines[0] == "run finished: fedbcd on breast_cancer (2 parties), seed 1, 3 epochs, 21 rounds"
    )
    assert "  val   acc 0.9300, auroc 0.9810" in lines
    assert not any(line.startswith("  test") or "privacy" in line for line in lines)
    assert "  target: val/auroc ≥ 0.97 reached at epoch 2, round 14, 0.03 MB" in lines
    assert lines[-2:] == ["results: /tmp/run/results.json", "model_digest (local): ab"]
    never = run_summary({**results, "epoch_to_target": None}, "/tmp/run")
    assert "  target: val/auroc ≥ 0.97 not reached" in never.splitlines()


def test_every_attack_and_audit_headline_is_printed(make_cfg, capsys):
    """Each attack's and audit's declared headline metric, the audit's beside the accountant's
    ε, in the summary."""
    results = train(
        make_cfg(
            "algo=ldp",
            "mechanism.sigma=8.0",
            "attack=feature_reconstruction",
            "audit=canary_message",
            "audit.canary_message.count=200",
            "trainer.max_epochs=1",
            "callbacks.checkpoint=null",
        )
    )
    out = capsys.readouterr().out.splitlines()
    rel_mse = results["attack/feature_reconstruction/rel_mse"]
    assert f"  attack feature_reconstruction: rel_mse {rel_mse:.4g}" in out
    bound, accountant = (
        results[f"audit/canary_message/{k}"] for k in ("eps_lower", "eps_accountant")
    )
    assert (
        f"  audit canary_message: eps_lower {bound:.4g} (beside eps_accountant {accountant:.4g})"
        in out
    )
