"""The default logger (W&B offline) on a small multirun, read back from the offline run files:
unique groups, names from the varying overrides, tags, best-value summaries, axes on test rows,
the model artifact, and a report spec whose runsets select exactly these runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CONF_DIR, run_train_py
from test_report import no_network  # noqa: F401  (fixture)
from wandb_records import history, offline_run

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


@pytest.mark.usefixtures("no_network")
def test_report_runsets_select_exactly_the_logged_runs(wandb_sweep, tmp_path):
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


def agent_command(sweep_file: Path, args: dict) -> list[str]:
    """The command `wandb agent` runs for one set of sweep parameters (its expansion of the
    sweep file's ``command``, wandb_agent.Agent._command_run)."""
    import yaml
    from wandb.sdk.launch.sweeps import utils as sweep_utils

    config = yaml.safe_load(sweep_file.read_text())
    variables = sweep_utils.create_sweep_command_args({"args": args})
    variables |= {
        "env": ["/usr/bin/env"],
        "interpreter": ["python"],
        "program": [config["program"]],
    }
    command = []
    for item in sweep_utils.create_sweep_command(config["command"]):
        item = str(item)
        macro = item[2:-1] if item.startswith("${") and item.endswith("}") else None
        command += variables.get(macro) or [] if macro else [item]
    return command


def test_wandb_sweep_agent_command_joins_the_agents_run(tmp_path, monkeypatch):
    """conf/wandb_sweeps/pbm.yaml: the command the agent would run, run offline with the
    agent's environment: the run is the agent's (its run id, sweep id, a sweep group)."""
    import yaml
    from wandb.sdk.lib import config_util

    sweep_file = Path(CONF_DIR) / "wandb_sweeps" / "pbm.yaml"
    parameters = yaml.safe_load(sweep_file.read_text())["parameters"]
    args = {key: {"value": spec["values"][0]} for key, spec in parameters.items()}
    command = agent_command(sweep_file, args)
    assert command[:3] == ["/usr/bin/env", "python", "train.py"]
    assert command[-3:] == ["mechanism.b=2", "mechanism.beta=0.05", "seed=0"]
    param_file = tmp_path / "sweep-abc123" / "config-agentrun1.yaml"
    param_file.parent.mkdir()
    config_util.save_config_file_from_dict(str(param_file), args)
    for key, value in {
        "WANDB_SWEEP_ID": "abc123",
        "WANDB_RUN_ID": "agentrun1",
        "WANDB_SWEEP_PARAM_PATH": str(param_file),
        "WANDB_PROJECT": "vfl_lightning",  # `wandb agent ENTITY/PROJECT/SWEEP_ID` sets these
        "WANDB_ENTITY": "me",
        "WANDB_MODE": "offline",  # the agent's run is online; this test stays offline
    }.items():
        monkeypatch.setenv(key, value)
    import wandb

    wandb.teardown()  # the agent starts a fresh process: W&B reads the environment anew
    run_dir = tmp_path / "run"
    small = ["trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.accelerator=cpu"]
    try:
        run_train_py([*command[3:], *small, f"hydra.run.dir={run_dir}"])
        run, found = offline_run(run_dir)
    finally:
        wandb.teardown()
    assert run.run_id == "agentrun1" and run.sweep_id == "abc123"
    assert run.run_group == "sweep-abc123" and run.project == "vfl_lightning"
    assert run.display_name == "pbm-digits-b=2-beta=0.05-seed0"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "finished" and results["algo"] == "pbm"
    composed = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert composed["mechanism"]["b"] == 2 and composed["mechanism"]["beta"] == 0.05
    assert json.loads((run_dir / RUN_FILE).read_text())["sweep_id"] == "abc123"


def test_online_without_a_key_is_one_error_line(tmp_path, monkeypatch, capsys):
    """`logger.wandb.offline=false` with no W&B key: exit 2 and one line saying how to log in
    or stay offline (not W&B's UsageError traceback)."""
    import wandb

    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SWEEP_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    wandb.teardown()

    def no_trainer(*args, **kwargs):
        raise AssertionError("the trainer was built before the missing key was refused")

    monkeypatch.setattr("vfl_lightning.run.train.make_trainer", no_trainer)
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_train_py(
                ["logger.wandb.offline=false", "trainer.max_epochs=1", f"hydra.run.dir={tmp_path}"]
            )
    finally:
        wandb.teardown()
    assert exit_info.value.code == 2
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: logger.wandb.offline=false: W&B cannot log in")
    assert "`wandb login`" in line and "WANDB_API_KEY" in line
    assert "logger.wandb.offline=true" in line


def test_report_groups_wandb_runs_by_the_varying_experiment_choice():
    from vfl_lightning.report.build import wandb_group_by
    from vfl_lightning.report.runs import Run

    runs = [
        Run(Path("."), {"algo": "pbm"}, [], {"experiment": e, "mechanism.b": b})
        for e, b in (("pbm_digits", "2"), ("pbm_search", "2"), ("pbm_digits", "16"))
    ]
    assert wandb_group_by(runs) == ["choices.experiment", "mechanism.b"]


def test_swept_keys_and_run_names(tmp_path):
    from vfl_lightning.wandb_names import run_name, swept_keys

    assert swept_keys(tmp_path) is None
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task: ['algo=fedbcd,fedbcd_s', 'algo.local_steps=1,5', "
        "'seed=range(3)', experiment=fedbcd_breast_cancer]\n"
        "  sweeper:\n    params:\n      optimizer.lr: interval(0.01, 0.1)\n"
    )
    varying = swept_keys(tmp_path)
    assert varying == {"algo", "algo.local_steps", "seed", "optimizer.lr"}
    job = ["algo=fedbcd_s", "algo.local_steps=5", "seed=2", "experiment=fedbcd_breast_cancer"]
    job += ["optimizer.lr=0.05", "hydra.sweep.dir=x", "logger=csv"]
    assert run_name("fedbcd_s-breast_cancer", 2, job, varying) == (
        "fedbcd_s-breast_cancer-local_steps=5-lr=0.05-seed2"
    )
    assert run_name("pbm-digits", 0, ["mechanism.b=4", "paths.output_dir=y"], None) == (
        "pbm-digits-b=4-seed0"
    )
