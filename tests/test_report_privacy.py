"""The privacy report recipe on two tiny sweeps (protocols, and one defended protocol): figures,
one table per attack whose numbers equal results.json, the DCS against the undefended protocol."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import pytest
from test_report import run_multirun

from vfl_lightning.privacy.analysis.dcs import defense_capability_score
from vfl_lightning.report import ReportError, make_report

SHORT = [
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=10",
    "logger=csv",
    "callbacks.checkpoint=null",
    "attack=feature_reconstruction",
]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("privacy_sweeps")
    run_multirun(["algo=splitnn,pbm", "seed=0,1", *SHORT, f"hydra.sweep.dir={root / 'plain'}"])
    run_multirun(
        [
            "algo=splitnn",
            "defense=gradient_noise",
            "defense.scale=0.1",
            "seed=0,1",
            *SHORT,
            f"hydra.sweep.dir={root / 'defended'}",
        ]
    )
    return [root / "plain", root / "defended"]


def results(directory: Path, algo: str) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(directory.glob("*/results.json"))]
    return [r for r in found if r["algo"] == algo]


def test_privacy_report_tables_and_figures(sweeps, tmp_path):
    out = tmp_path / "report"
    files = {
        p.name for p in make_report(sweeps, out, recipe="privacy", name="privacy", progress=False)
    }
    assert {
        "privacy.md",
        "privacy_frontier_feature_reconstruction.png",
        "privacy_reconstruction_vs_eps.png",
    } <= files
    page = (out / "privacy.md").read_text()
    rows = {
        line.split(" | ")[0].strip("| ") + " / " + line.split(" | ")[1]: line.split(" | ")
        for line in page.splitlines()
        if line.startswith("| splitnn") or line.startswith("| pbm")
    }
    plain = results(sweeps[0], "splitnn")
    defended = results(sweeps[1], "splitnn")
    rel_mse = mean(r["attack/feature_reconstruction/rel_mse"] for r in plain)
    assert rows["splitnn / none"][4].startswith(f"{rel_mse:.3f} ±")
    defended_dcs = defense_capability_score(
        attack_performance=mean(r["attack/feature_reconstruction/performance"] for r in defended),
        attack_baseline=0.0,
        main_performance=mean(r["test/acc"] for r in defended),
        main_reference=mean(r["test/acc"] for r in plain),
    )
    assert rows["splitnn / gradient_noise scale=0.1"][-1].strip(" |") == f"{defended_dcs:.3f}"
    eps = mean(r["privacy/feature_eps"] for r in results(sweeps[0], "pbm"))
    assert rows["pbm / none"][6].startswith(f"{eps:.1f} ±")


def test_privacy_recipe_needs_an_attack(tmp_path):
    sweep = tmp_path / "plain"
    run_multirun(
        [
            "algo=npq",
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=2",
            "logger=csv",
            "callbacks.checkpoint=null",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    with pytest.raises(ReportError, match=r"--recipe privacy needs runs with an attack"):
        make_report([sweep], tmp_path / "out", recipe="privacy", progress=False)
