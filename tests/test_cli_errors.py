"""Every bad configuration ends in one line `error: ...` (exit 2) from the CLI, a stated run
failure in one line (exit 1), and HYDRA_FULL_ERROR=1 still shows the traceback."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONF_DIR

from vfl_lightning import cli
from vfl_lightning.run.outcome import error_summary, exit_code
from vfl_lightning.train import train

ROOT = Path(CONF_DIR).parent
FAST = ["trainer.max_steps=2", "trainer.limit_val_batches=1", "test=false"]
FEDVS = ["experiment=fedvs_digits"]

BATTERY = [
    (
        [*FEDVS, "party=mlp"],
        r"^algo=fedvs needs polynomial-network parties \(party=pn\), got MLPEncoder$",
    ),
    (
        ["attack=label_inference", "algo=pbm"],
        r"^mechanism=pbm has no option mechanism.fusion, which the chosen configs set "
        r"\(algo=pbm, attack=label_inference\)",
    ),
    (
        ["algo=pbm", "mechanism.b=1000000000000"],
        r"num_parties \* b = 4000000000000 is too large for the exact PBM accountant \(at most "
        r"4096.*lower mechanism.b to at most 1024$",
    ),
    (["algo=pbm", "mechanism.beta=0.3"], r"^beta must be in \(0, 0.25\] for PBM, got 0.3$"),
    (["algo=pbm", "mechanism.beta=0"], r"^beta must be in \(0, 0.25\] for PBM, got 0: beta = 0"),
    (["algo=pbm", "mechanism.b=0"], r"^b must be an integer >= 1, got 0$"),
    (["seed=-1"], r"^seed must be an integer in \[0, 2\^32 - 1\], got -1$"),
    (["seed=abc"], r"^seed must be an integer in \[0, 2\^32 - 1\], got 'abc'$"),
    (["seed=1.5"], r"^seed must be an integer in \[0, 2\^32 - 1\], got 1.5$"),
    (["torch_threads=-1"], r"^torch_threads must be an integer >= 1 or null, got -1$"),
    (["torch_threads=abc"], r"^torch_threads must be an integer >= 1 or null, got 'abc'$"),
    (["trainer.precision=16-mixed"], r"^trainer.precision must be one of .*got '16-mixed'"),
    ([*FEDVS, "algo.T=0"], r"^algo.T must be an integer >= 1, got 0: with T = 0"),
    # the FedVS wrap-around pre-check runs in on_train_start, inside Lightning's fit
    ([*FEDVS, "algo.l_x=20"], r"^FedVS decoded sums can reach \d+ .*lower algo.l_x from 20 to"),
    (["trainer.max_epochs=-5"], r"^`max_epochs` must be a non-negative integer or -1"),
    (["data.batch_size=0"], r"^batch_size must be >= 1, got 0$"),
    (["data.val_fraction=1.5"], r"^val_fraction must be in \[0, 1\), got 1.5$"),
    (["party.embedding_dim=0"], r"^embedding_dim must be >= 1, got 0$"),
    (["mechanism.fusion=prod"], r"^fusion must be one of \('sum', 'mean', 'concat'\), got 'prod'$"),
    (
        ["callbacks.checkpoint.every_n_train_steps=0"],
        r"^callbacks.checkpoint.every_n_train_steps must be an integer >= 1 or null, got 0$",
    ),
    (["data=mnist", "paths.data_dir=/etc/hostname/cache"], r"^paths.data_dir=/etc/hostname/cache"),
    (["ckpt_path=/nonexistent/last.ckpt"], r"^ckpt_path=/nonexistent/last.ckpt does not exist"),
]


@pytest.mark.parametrize(
    ("overrides", "message"), BATTERY, ids=[" ".join(case[0]) for case in BATTERY]
)
def test_bad_configuration_gives_one_clear_line(make_cfg, overrides, message):
    with pytest.raises(Exception) as error:
        train(make_cfg(*overrides, *FAST))
    line = error_summary(error.value)
    assert "\n" not in line
    assert exit_code(error.value) == 2, line
    assert re.search(message, line), line


def test_unwritable_output_dir_is_one_line(make_cfg):
    cfg = make_cfg(*FAST)
    cfg.paths.output_dir = "/etc/hostname/run"
    with pytest.raises(Exception) as error:
        train(cfg)
    assert exit_code(error.value) == 2
    assert error_summary(error.value).startswith("paths.output_dir=/etc/hostname/run cannot be")


def test_cli_prints_one_line_and_exits_2_and_hydra_full_error_raises(make_cfg, capsys, monkeypatch):
    cfg = make_cfg("algo=pbm", "mechanism.beta=0.3", *FAST)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: beta must be in (0, 0.25] for PBM, got 0.3"
    )
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match=r"beta must be in \(0, 0.25\]"):
        cli.main(cfg)


def test_cli_run_failure_exits_1_in_one_line(make_cfg, capsys):
    cfg = make_cfg("optimizer.lr=1e6", "trainer.log_every_n_steps=1", "trainer.max_epochs=1")
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 1
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("error: training stopped: the training loss became non-finite at round")
    )


def test_cli_subprocess_one_error_line_no_traceback_and_the_error_in_the_run_log(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "experiment=fedvs_digits",
            "party=mlp",
            "logger=none",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: algo=fedvs needs polynomial-network parties (party=pn), got MLPEncoder"
    ]
    assert proc.stderr.splitlines()[-1] == errors[0]
    assert "needs polynomial-network parties" in (tmp_path / "train.log").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == errors[0][len("error: ") :]
