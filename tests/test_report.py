"""The report command on a tiny multirun (2 algos x 2 seeds x 2 epochs, in-process): curve.csv per
job, figures, report.md numbers equal to results.json, the offline W&B Report spec, bad input."""

from __future__ import annotations

import csv
import json
import shutil
import socket
from pathlib import Path
from statistics import mean

import pytest
from conftest import QUIET, algo_report_config, run_train_py

from vfl_lightning.curve import AXES, read_curve
from vfl_lightning.report import ReportError, make_report
from vfl_lightning.report.__main__ import main as report_main
from vfl_lightning.report.publish import main as publish_main
from vfl_lightning.report.wandb_report import read_spec
from vfl_lightning.wandb_names import unique_group

SWEEP = [
    "algo=npq,pbm",
    "seed=0,1",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=5",
    "logger=[csv,wandb]",
    "callbacks.checkpoint=null",
]


def run_multirun(argv: list[str]) -> None:
    """``python train.py -m <argv>`` in this process, quiet (the test's logger choice kept)."""
    run_train_py(["-m", *[q for q in QUIET if not q.startswith("logger=")], *argv])


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sweeps") / "npq_pbm"
    with pytest.MonkeyPatch.context() as patch:  # W&B offline (the test session disables it)
        patch.setenv("WANDB_MODE", "offline")
        run_multirun([*SWEEP, f"hydra.sweep.dir={directory}"])
    return directory


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the report tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def results_of(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]


def test_every_job_has_its_curve(sweep):
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        results = json.loads((job / "results.json").read_text())
        with open(job / "curve.csv") as f:
            header = next(csv.reader(f))
        assert header[: len(AXES)] == list(AXES)
        assert ("privacy/feature_eps" in header) == (results["algo"] == "pbm")
        curve = read_curve(job / "curve.csv")
        (metrics,) = job.glob("csv/*/metrics.csv")
        with open(metrics) as f:
            logged = [row for row in csv.DictReader(f) if row.get("val/acc")]
        assert len(curve) == len(logged) == 2
        for row, log in zip(curve, logged):
            for key in [k for k in header if k.startswith("val/")] + ["comm/total_mb"]:
                assert row[key] == pytest.approx(float(log[key]), rel=1e-6)
        assert curve[-1]["val/acc"] == pytest.approx(results["val/acc"])
        assert curve[-1]["comm/total_mb"] == pytest.approx(results["comm/total_mb"])


def test_report_figures_and_numbers(sweep, tmp_path, no_network):
    out = tmp_path / "R"
    written = make_report([sweep], out, wandb="me/vfl_lightning", progress=False)
    assert {p.name for p in written} >= {"report.md", "wandb_report.json", "curves.png"}
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= 3
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = (out / "report.md").read_text()
    for png in pngs:
        assert f"]({png.name})" in text
    runs = results_of(sweep)
    for algo in ("npq", "pbm"):
        mine = [r for r in runs if r["algo"] == algo]
        assert len(mine) == 2
        for key in ("test/acc", "val/acc", "comm/total_mb"):
            assert f"{mean(r[key] for r in mine):.4f} ± " in text, (algo, key)
    pbm = [r for r in runs if r["algo"] == "pbm"]
    assert f"{mean(r['privacy/feature_eps'] for r in pbm):.1f} ± " in text
    assert f"{mean(r['test/acc_clean'] for r in pbm):.4f} ± " in text
    assert "algo=npq,pbm seed=0,1 trainer.max_epochs=2" in text
    assert not list(tmp_path.glob(".R-*")), "staging directory left behind"


def test_wandb_report_spec_offline(sweep, tmp_path, no_network):
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.reports.v2 import internal

    out = tmp_path / "R"
    make_report([sweep], out, wandb="me/vfl_lightning", progress=False)
    spec = json.loads((out / "wandb_report.json").read_text())
    assert spec["project"] == {"name": "vfl_lightning", "entityName": "me"}
    blocks = spec["spec"]["blocks"]
    headings = [b["children"][0]["text"] for b in blocks if b["type"] == "heading"]
    assert headings[0].startswith("VFL report: digits, 4 parties")
    assert "PBM-VFL: accuracy, privacy, communication" in headings and "Runs" in headings
    grids = [b for b in blocks if b["type"] == "panel-grid"]
    assert len(grids) == 2  # one per section: the pbm recipe and the runs overview
    for grid in grids:
        (runset,) = grid["metadata"]["runSets"]
        assert runset["project"] == {"name": "vfl_lightning", "entityName": "me"}
        (condition,) = runset["filters"]["filters"]
        assert condition["key"] == {"section": "run", "name": "group"}
        assert condition["op"] == "=" and condition["value"] == unique_group(sweep)
        assert runset["grouping"] == [{"section": "config", "name": "algo.value.name"}]
    pbm_panels = grids[0]["metadata"]["panelBankSectionConfig"]["panels"]
    axes = {
        p["config"].get("xAxis") for p in pbm_panels if p["viewType"] == "Run History Line Plot"
    }
    assert axes == {"epoch", "privacy/feature_eps"}
    assert any(p["viewType"] == "Bar Chart" for p in pbm_panels)
    markdown = [b["content"] for b in blocks if b["type"] == "markdown-block"]
    assert any("algo=npq,pbm seed=0,1" in m for m in markdown)
    assert any(m.startswith("| group | seeds |") for m in markdown)
    rebuilt = wr.Report._from_model(internal.ReportViewspec.model_validate(spec))
    assert read_spec(out / "wandb_report.json").title == rebuilt.title  # what publish reads
    assert rebuilt.project == "vfl_lightning" and rebuilt.entity == "me"
    grid = next(b for b in rebuilt.blocks if isinstance(b, wr.PanelGrid))
    assert grid.runsets[0].project == "vfl_lightning" and grid.runsets[0].entity == "me"


def test_cli_bad_inputs_write_nothing(sweep, tmp_path, capsys, no_network):
    def fails(args: list[str], message: str) -> None:
        assert report_main([*args, "--out", str(tmp_path / "R"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, err
        assert err.count("\n") == 1, err  # one line
        assert not (tmp_path / "R").exists()
        assert not list(tmp_path.glob(".R-*"))

    empty = tmp_path / "empty"
    empty.mkdir()
    fails([str(empty)], "no runs under")
    old = tmp_path / "old"
    shutil.copytree(sweep / "0", old / "0")
    (old / "0" / "curve.csv").unlink()
    fails([str(old)], "no curve.csv")
    other = tmp_path / "other"
    shutil.copytree(sweep / "1", other / "1")
    results = json.loads((other / "1" / "results.json").read_text())
    (other / "1" / "results.json").write_text(json.dumps({**results, "data": "breast_cancer"}))
    fails([str(sweep), str(other)], "runs mix datasets: digits")
    fails([str(sweep), "--wandb", "me"], "--wandb must be ENTITY/PROJECT")
    fails([str(sweep), "--y", "val/nothing"], "'val/nothing' is in no run's curve.csv")
    only_npq = tmp_path / "npq"
    shutil.copytree(sweep / "0", only_npq / "0")
    fails([str(only_npq), "--x", "eps"], "'privacy/feature_eps' is in no run's curve.csv")
    crashed = tmp_path / "crashed"
    (crashed / "0").mkdir(parents=True)
    (crashed / "0" / "results.json").write_text(json.dumps({"status": "failed", "algo": "pbm"}))
    fails([str(crashed)], "no finished runs under")
    fails([str(sweep), "--x", "banana"], "argument --x: invalid choice: 'banana'")
    fails(
        [str(sweep), "--recipe", "fedvs"],
        "--recipe fedvs needs runs of an algo whose config lists it in report.recipes",
    )
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    assert report_main([str(sweep), "--out", str(a_file), "--no-progress"]) == 2
    assert (
        capsys.readouterr().err
        == f"error: --out {a_file} is a file: give a directory (new or existing)\n"
    )
    assert a_file.read_text() == "mine" and not list(tmp_path.glob(".taken-*"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "a/b"], "--name must be a file name of letters, digits, '_', '-' and '.' "),
        (["--name", "../../x"], "(it names <name>.md and the figures in --out), got '../../x'"),
        (["--name", ""], "--name must be a file name"),
        (["--times", "-5"], "--times must be finite numbers >= 0, got -5"),
        (["--times", "10", "nan"], "--times must be finite numbers >= 0, got nan"),
        (["--rounds", "inf"], "--rounds must be finite numbers >= 0, got inf"),
    ],
)
def test_a_bad_name_or_time_is_one_line_and_writes_nothing(sweep, tmp_path, capsys, args, message):
    assert report_main([str(sweep), "--out", str(tmp_path / "R"), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_out_that_cannot_be_made_is_one_line(sweep, tmp_path, capsys):
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    for out, problem in (
        (a_file / "R", "Not a directory"),
        (Path("/proc/R"), "No such file or directory"),
    ):
        assert report_main([str(sweep), "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out {out} cannot be used: ") and problem in err, err
        assert err.endswith("; give a directory you can write\n") and err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


def test_unfinished_runs_are_left_out(sweep, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    shutil.copytree(sweep, mixed)
    (mixed / "9").mkdir()
    (mixed / "9" / "results.json").write_text(
        json.dumps({"status": "failed", "algo": "pbm", "error": "the loss became non-finite"})
    )
    (mixed / "9" / ".hydra").mkdir()
    (mixed / "9" / ".hydra" / "overrides.yaml").write_text("- algo=pbm\n- mechanism.b=2\n")
    make_report([mixed], tmp_path / "R", progress=False)
    assert "leaving out 1 run(s) that did not finish" in capsys.readouterr().err
    page = (tmp_path / "R" / "report.md").read_text()
    assert "4 runs, finished" in page
    # the page names the run it left out, with its overrides and its error
    assert "- `algo=pbm mechanism.b=2` (failed): the loss became non-finite" in page


def test_error_keeps_an_existing_out_untouched(sweep, tmp_path):
    out = tmp_path / "R"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(ReportError, match="no runs under"):
        make_report([tmp_path / "R"], out, progress=False)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


@pytest.mark.parametrize(
    ("algos", "recipe"),
    [
        ({"npq", "pbm"}, "pbm"),
        ({"npq", "ldp"}, "pbm"),
        ({"splitnn", "cascade", "vafl"}, "cascade"),
        ({"fedsgd", "fedbcd"}, "fedbcd"),
        ({"fedvs", "fedvs_wait", "vafl"}, "fedvs"),
        ({"npq", "splitnn"}, None),
    ],
)
def test_recipe_chosen_from_the_algos(algos, recipe):
    from vfl_lightning.report.recipes import choose_recipe
    from vfl_lightning.report.runs import Run

    runs = [Run(Path("."), {"algo": algo}, [], config=algo_report_config(algo)) for algo in algos]
    assert choose_recipe(runs) == recipe


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        (
            "vfl_lightning.report.publish",
            ["--bogus"],
            "error: the following arguments are required: spec",
        ),
        (
            "vfl_lightning.data.export",
            ["data=digits"],
            "error: the following arguments are required: --out",
        ),
    ],
)
def test_the_other_commands_give_one_usage_line(module, argv, message, capsys):
    """publish and export refuse a bad command line as the report does: one line, status 2."""
    import importlib

    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"{message} (see --help)\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1,2", "cannot be read as JSON (Expecting ',' delimiter"),
        ("{}", "is not a W&B Report specification ("),
        ("\x00\xff", "cannot be read as JSON ("),
    ],
)
def test_publish_refuses_a_file_that_is_no_specification_before_any_key_or_network(
    tmp_path, capsys, monkeypatch, no_network, content, message
):
    """With a key set, a file that is not the report command's specification is one line and
    status 2."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    spec = tmp_path / "wandb_report.json"
    spec.write_bytes(content.encode("latin-1"))
    assert publish_main([str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec} ") and message in err and err.count("\n") == 1, err
    assert err.endswith(": give the wandb_report.json the report command wrote with --wandb\n")
