"""The default logger (W&B offline) on a small multirun, read back from the offline run files:
unique groups, names from the varying overrides, tags, best-value summaries, axes on test rows,
the model artifact, and a report spec whose runsets select exactly these runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
import pytest
from conftest import CONF_DIR
from hydra.core.global_hydra import GlobalHydra
from test_report import no_network  # noqa: F401  (fixture)
from wandb_records import history, offline_run

from vfl_lightning.cli import main as cli_main
from vfl_lightning.loggers import RUN_FILE
from vfl_lightning.report import ReportError, make_report
from vfl_lightning.wandb_names import unique_group

SWEEP = [
    "experiment=fedbcd_breast_cancer",
    "algo.local_steps=1,5",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=4",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.num_sanity_val_steps=0",
]


def run_train_py(argv: list[str]) -> None:
    """``python train.py <argv>`` in this process (the root train.py's task function)."""
    main = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")(cli_main)
    GlobalHydra.instance().clear()
    saved = sys.argv
    sys.argv = ["train.py", *argv]
    try:
        main()
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def wandb_sweep(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("wandb") / "fedbcd"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.delenv("WANDB_API_KEY", raising=False)
        run_train_py(["-m", *SWEEP, f"hydra.sweep.dir={directory}"])
    return directory


def jobs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if (p / "results.json").is_file())


def test_groups_names_and_tags(wandb_sweep):
    logged = [offline_run(job)[0] for job in jobs(wandb_sweep)]
    assert len(logged) == 2
    assert {run.run_group for run in logged} == {unique_group(wandb_sweep)}
    assert unique_group(wandb_sweep).startswith(f"{wandb_sweep.parent.name}_fedbcd-")
    assert unique_group(wandb_sweep) != unique_group(wandb_sweep.parent / "other" / "fedbcd")
    names = sorted(run.display_name for run in logged)
    assert names == [
        "fedbcd-breast_cancer-local_steps=1-seed0",
        "fedbcd-breast_cancer-local_steps=5-seed0",
    ]
    for run in logged:
        assert run.project == "vfl_lightning"
        assert "experiment=fedbcd_breast_cancer" in run.tags and "algo=fedbcd" in run.tags
    for job in jobs(wandb_sweep):
        _, found = offline_run(job)
        config = {}
        for record in found:
            if record.WhichOneof("record_type") == "config":
                config |= {item.key: json.loads(item.value_json) for item in record.config.update}
        assert config["choices"]["experiment"] == "fedbcd_breast_cancer"
        written = json.loads((job / RUN_FILE).read_text())
        assert written["group"] == unique_group(wandb_sweep)
        assert written["project"] == "vfl_lightning" and written["mode"] == "offline"


def summary_of(found: list) -> dict:
    summary = {}
    for record in found:
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def test_best_summaries_test_axes_and_model_artifact(wandb_sweep):
    for job in jobs(wandb_sweep):
        _, found = offline_run(job)
        rows = history(found)
        accuracies = [row["val/acc"] for row in rows if "val/acc" in row]
        losses = [row["val/loss"] for row in rows if "val/loss" in row]
        assert len(accuracies) == 4 and len(set(accuracies)) > 1
        summary = summary_of(found)
        assert summary["val/acc"] == {"max": max(accuracies)}
        assert summary["val/loss"] == {"min": min(losses)}
        results = json.loads((job / "results.json").read_text())
        assert summary["comm/rounds"] == results["comm/rounds"]
        (test_row,) = [row for row in rows if "test/acc" in row]
        for axis in ("comm/total_mb", "time/simulated_s", "comm/rounds"):
            assert test_row[axis] == pytest.approx(results[axis]), axis
        artifacts = [r.artifact for r in found if r.WhichOneof("record_type") == "artifact"]
        models = [a for a in artifacts if a.type == "model"]
        assert len(models) == 1 and models[0].name.startswith("model-")
        assert [entry.path for entry in models[0].manifest.contents] == ["last.ckpt"]


def test_report_runsets_select_exactly_the_logged_runs(wandb_sweep, tmp_path, no_network):
    out = tmp_path / "R"
    make_report([wandb_sweep], out, wandb="me/vfl_lightning", progress=False)
    spec = json.loads((out / "wandb_report.json").read_text())
    runsets = [
        runset
        for block in spec["spec"]["blocks"]
        if block.get("type") == "panel-grid"
        for runset in block["metadata"]["runSets"]
    ]
    assert runsets
    logged = [offline_run(job)[0] for job in jobs(wandb_sweep)]
    for runset in runsets:
        assert runset["project"] == {"name": "vfl_lightning", "entityName": "me"}
        selected = [run for run in logged if selects(runset["filters"], run)]
        assert selected == logged
    with pytest.raises(ReportError, match="logged to W&B project vfl_lightning"):
        make_report([wandb_sweep], tmp_path / "S", wandb="me/vfl", progress=False)
    assert not (tmp_path / "S").exists()


def selects(filters: dict, run) -> bool:
    """Whether a runset's serialized filter (filterV2: a list of conditions, all must hold; here
    ``=`` on ``run.group``) selects the offline run ``run``."""
    assert filters["filterFormat"] == "filterV2"
    for condition in filters["filters"]:
        assert (condition["key"], condition["op"]) == ({"section": "run", "name": "group"}, "=")
        if condition.get("disabled") or condition["value"] != run.run_group:
            return False
    return True
