"""Runs group by their settings, not by how an override was typed: a single run given
``trainer.enable_progress_bar=false optimizer.lr=1e-3`` and a multirun job that Hydra wrote as
``False`` and ``0.001`` are the same setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vfl_lightning.report.runs import canonical, group_runs, load_runs


def job(folder: Path, overrides: list[str], seed: int) -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(
        "".join(f"- {item}\n" for item in [*overrides, f"seed={seed}"])
    )
    (folder / ".hydra" / "config.yaml").write_text(f"seed: {seed}\n")
    results = {"algo": "fedbcd", "data": "mnist_small", "status": "finished", "val/acc": 0.5}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "curve.csv").write_text("epoch,val/acc\n0,0.5\n")


@pytest.mark.parametrize(
    ("typed", "written"),
    [("false", "False"), ("TRUE", "True"), ("1e-3", "0.001"), ("05", "5"), ("abc", "abc")],
)
def test_an_override_value_reads_as_a_multirun_writes_it(typed, written):
    assert canonical(typed) == written == canonical(written)


def test_a_single_run_and_a_sweep_job_with_the_same_setting_are_one_group(tmp_path):
    job(
        tmp_path / "a" / "0",
        ["algo=fedbcd", "trainer.enable_progress_bar=False", "optimizer.lr=0.001"],
        0,
    )
    job(
        tmp_path / "a" / "1",
        ["algo=fedbcd", "trainer.enable_progress_bar=false", "optimizer.lr=1e-3"],
        1,
    )
    job(
        tmp_path / "a" / "2",
        ["algo=fedbcd", "trainer.enable_progress_bar=false", "optimizer.lr=0.01"],
        2,
    )
    groups = group_runs(load_runs([tmp_path / "a"], progress=False))
    assert sorted((g.label, len(g.runs)) for g in groups) == [
        ("fedbcd lr=0.001", 2),
        ("fedbcd lr=0.01", 1),
    ]
