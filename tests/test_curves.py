"""curve.csv per run, val/acc_clean beside the deployed val/acc, and the W&B logger's run
identity (group, tags, id across resumes)."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import CONF_DIR
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from vfl_lightning.curve import AXES, read_curve
from vfl_lightning.loggers import ID_FILE, WandbLogger, previous_run_id
from vfl_lightning.train import build, train
from vfl_lightning.wandb_names import unique_group

FAST = ["trainer.max_epochs=2", "trainer.limit_train_batches=6", "callbacks.checkpoint=null"]


def logged_rows(output_dir: Path) -> list[dict]:
    """The CSVLogger's metrics.csv rows that hold a val/acc (one per validation)."""
    (metrics,) = output_dir.glob("csv/*/metrics.csv")
    with open(metrics) as f:
        return [row for row in csv.DictReader(f) if row.get("val/acc")]


def test_curve_rows_equal_what_the_run_logged(make_cfg):
    cfg = make_cfg("algo=pbm", "logger=csv", *FAST)
    results = train(cfg)
    out = Path(cfg.paths.output_dir)
    curve = read_curve(out / "curve.csv")
    with open(out / "curve.csv") as f:
        header = next(csv.reader(f))
    assert header[: len(AXES) + 1] == [*AXES, "privacy/feature_eps"]
    assert {"val/acc", "val/acc_clean", "val/loss"} <= set(header)
    logged = logged_rows(out)
    assert len(curve) == len(logged) == 2
    for row, log in zip(curve, logged):
        for key in (
            "val/acc",
            "val/acc_clean",
            "comm/total_mb",
            "comm/rounds",
            "privacy/feature_eps",
        ):
            assert row[key] == pytest.approx(float(log[key]), rel=1e-6), key
        assert row["global_step"] == float(log["step"]) + 1
    assert [row["epoch"] for row in curve] == [1.0, 2.0]
    last = curve[-1]
    assert last["comm/rounds"] == results["comm/rounds"] == results["global_step"]
    total = results["comm/uplink_mb"] + results["comm/downlink_mb"] + results["comm/peer_mb"]
    assert last["comm/total_mb"] == pytest.approx(total) == results["comm/total_mb"]
    assert last["val/acc"] == pytest.approx(results["val/acc"])
    assert last["privacy/feature_eps"] == pytest.approx(results["privacy/feature_eps"])


def test_clean_accuracy_is_the_noise_free_evaluation(make_cfg, tmp_path):
    """val/acc_clean equals val/acc of the same model evaluated with apply_at_eval=false."""
    import lightning as L

    cfg = make_cfg("algo=ldp", "mechanism.sigma=3.0", *FAST)
    datamodule, module = build(cfg)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=datamodule)
    (deployed,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    module.mechanism.apply_at_eval = False
    (clean,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    assert "val/acc_clean" not in clean
    assert deployed["val/acc_clean"] == clean["val/acc"]
    assert deployed["val/acc"] != clean["val/acc"]


def test_noise_free_protocols_have_no_clean_column(make_cfg):
    cfg = make_cfg("algo=npq", *FAST)
    results = train(cfg)
    with open(Path(cfg.paths.output_dir) / "curve.csv") as f:
        header = next(csv.reader(f))
    assert "val/acc_clean" not in header and "privacy/feature_eps" not in header
    assert "val/acc_clean" not in results and "test/acc_clean" not in results


def test_wait_dp_logs_clean_accuracy(make_cfg):
    cfg = make_cfg(
        "experiment=fedvs_digits",
        "algo=fedvs_wait_dp",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "callbacks.checkpoint=null",
    )
    results = train(cfg)
    assert 0.0 <= results["val/acc_clean"] <= 1.0 and "test/acc_clean" in results


def test_resumed_run_keeps_curve_and_run_id(make_cfg, tmp_path):
    first = make_cfg("algo=npq", "trainer.max_epochs=1", "trainer.limit_train_batches=4")
    train(first)
    first_dir = Path(first.paths.output_dir)
    (first_dir / ID_FILE).write_text("abc12345\n")
    ckpt = first_dir / "checkpoints" / "last.ckpt"
    resumed = make_cfg(
        "algo=npq", "trainer.max_epochs=2", "trainer.limit_train_batches=4", f"ckpt_path={ckpt}"
    )
    train(resumed)
    curve = read_curve(Path(resumed.paths.output_dir) / "curve.csv")
    assert [row["epoch"] for row in curve] == [1.0, 2.0]
    assert curve[0] == read_curve(first_dir / "curve.csv")[0]
    assert previous_run_id(ckpt) == "abc12345"
    assert previous_run_id(None) is None
    assert previous_run_id(tmp_path / "elsewhere" / "checkpoints" / "last.ckpt") is None


def test_wandb_logger_identity(tmp_path):
    """Group unique per sweep dir in a multirun (an explicit group kept), name from the swept
    overrides, tags from the choices, id reused on resume."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        cfg = compose(
            "train", overrides=["algo=pbm", "mechanism.b=4", "seed=3"], return_hydra_config=True
        )
    GlobalHydra.instance().clear()
    sweep = tmp_path / "sweeps" / "pbm_grid"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task: [algo=pbm, 'mechanism.b=2,4', 'seed=3']\n"
    )
    cfg.hydra.mode = RunMode.MULTIRUN
    cfg.hydra.sweep.dir = str(sweep)
    HydraConfig().set_config(cfg)
    previous = tmp_path / "run0"
    previous.mkdir()
    (previous / ID_FILE).write_text("run0id42\n")
    logger = WandbLogger(
        project="p",
        save_dir=str(tmp_path / "run1"),
        offline=True,
        job_type="pbm",
        run_prefix="pbm-digits",
        seed=3,
        ckpt_path=str(previous / "checkpoints" / "last.ckpt"),
    )
    init = logger._wandb_init
    assert init["group"] == unique_group(sweep) and init["job_type"] == "pbm"
    assert init["group"].startswith("sweeps_pbm_grid-")
    assert init["name"] == "pbm-digits-b=4-seed3"
    assert init["tags"] == ["algo=pbm", "mechanism=pbm", "data=digits", "runtime=local"]
    assert init["id"] == "run0id42" and init["resume"] == "allow"
    assert "anonymous" not in init
    assert (tmp_path / "run1" / ID_FILE).read_text().strip() == "run0id42"
    fresh = WandbLogger(project="p", save_dir=str(tmp_path / "run2"), offline=True, group="mine")
    assert len(fresh._wandb_init["id"]) == 8 and fresh._wandb_init["id"] != "run0id42"
    assert fresh._wandb_init["group"] == "mine"


def test_results_json_carries_total_mb(make_cfg):
    cfg = make_cfg("algo=npq", "trainer.max_epochs=1", "trainer.limit_train_batches=3")
    train(cfg)
    results = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert math.isclose(
        results["comm/total_mb"], results["comm/uplink_mb"] + results["comm/downlink_mb"]
    )


def test_a_crashed_run_keeps_its_curve(make_cfg):
    """curve.csv is rewritten after every validation: a run that dies later keeps its rows."""
    import lightning as L

    from vfl_lightning.curve import CurveWriter

    class Crash(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 2:
                raise RuntimeError("killed")

    cfg = make_cfg("algo=npq", "callbacks.checkpoint=null")
    path = Path(cfg.paths.output_dir) / "curve.csv"
    datamodule, module = build(cfg)
    trainer = L.Trainer(
        max_epochs=4,
        limit_train_batches=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        callbacks=[CurveWriter(path), Crash()],
    )
    with pytest.raises(RuntimeError, match="killed"):
        trainer.fit(module, datamodule=datamodule)
    assert [row["epoch"] for row in read_curve(path)] == [1.0, 2.0]
    assert [p.name for p in path.parent.glob(".curve.csv.*")] == []


def _canonical(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


def test_installed_packages_lists_every_distribution_with_its_version():
    import importlib.metadata

    from vfl_lightning.loggers import installed_packages

    listed = {_canonical(line) for line in installed_packages()}
    for dist in importlib.metadata.distributions():
        assert _canonical(f"{dist.metadata['Name']}=={dist.version}") in listed


def test_offline_wandb_run_has_our_requirements_file(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(project="p", save_dir=str(tmp_path), offline=True)
    assert logger._wandb_init["settings"]["x_save_requirements"] is False
    try:
        run = logger.experiment
        lines = (Path(run.dir) / "requirements.txt").read_text().splitlines()
    finally:
        wandb.finish()
    assert "torch==" + torch.__version__.split("+")[0] in {line.split("+")[0] for line in lines}
    assert any(line.startswith("vfl_lightning==") for line in lines)
