"""SIGTERM ends a run as Ctrl-C does: results.json with ``status: interrupted``, one ``error:`` line
saying where it stopped and how to resume, exit code 143; in the local runtime and under Ray,
inside Lightning's loops and outside them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import stop_at

from vfl_lightning import cli
from vfl_lightning.errors import Terminated
from vfl_lightning.run import assemble
from vfl_lightning.train import train

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["trainer.limit_train_batches=3", "trainer.limit_val_batches=1", "test=false"]
STOPPED = (
    r"stopped by SIGTERM at epoch (\d+), training round (\d+): results.json has status interrupted"
)


def results_of(cfg) -> dict:
    return json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())


@pytest.fixture
def sigterm_restored():
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_sigterm_inside_fit_stops_at_the_next_batch(make_cfg, capsys, sigterm_restored):
    cfg = make_cfg("algo=npq", *SHORT, "trainer.max_epochs=3", *stop_at(1, 1, how="sigterm"))
    with pytest.raises(Terminated, match=STOPPED + "; resume with ckpt_path=") as stop:
        train(cfg)
    results = results_of(cfg)
    assert results["status"] == "interrupted" and results["error"] == str(stop.value)
    # 3 batches of epoch 0; in epoch 1 the batch under way when SIGTERM came (1) finishes
    assert (results["epochs"], results["global_step"]) == (1, 5)
    assert f"ckpt_path={cfg.paths.output_dir}/checkpoints/last.ckpt" in str(stop.value)
    assert "Received SIGTERM" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_sigterm_before_fit_stops_at_once(make_cfg, monkeypatch, sigterm_restored):
    """Outside Lightning's loops (here while the trainer is built) the run stops where it is."""
    make_trainer = assemble.make_trainer

    def sigterm_then_build(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return make_trainer(*args, **kwargs)

    monkeypatch.setattr("vfl_lightning.run.train.make_trainer", sigterm_then_build)
    cfg = make_cfg("algo=npq", *SHORT)
    with pytest.raises(Terminated, match=STOPPED + r" \(no checkpoint was written yet\)$"):
        train(cfg)
    assert results_of(cfg)["status"] == "interrupted"


@pytest.mark.slow
def test_sigterm_while_the_ray_parties_start(make_cfg, monkeypatch, sigterm_restored):
    """SIGTERM while the driver waits on the actors (Ray's ``get`` wraps what the handler raised
    in a SystemError): the run stops in one line, its results written, Ray shut down."""
    import ray

    from vfl_lightning.run import ray_session

    attach = ray_session.attach_ray_parties

    def attach_during_sigterm(cfg, module, datamodule=None):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return attach(cfg, module, datamodule)

    monkeypatch.setattr(ray_session, "attach_ray_parties", attach_during_sigterm)
    cfg = make_cfg("algo=npq", "runtime=ray", "runtime.num_cpus=2", *SHORT)
    with pytest.raises(Terminated, match=STOPPED + r" \(no checkpoint was written yet\)$"):
        train(cfg)
    assert results_of(cfg)["status"] == "interrupted"
    assert not ray.is_initialized()


def test_the_command_line_prints_one_line_and_exits_143(make_cfg, capsys, sigterm_restored):
    cfg = make_cfg("algo=npq", *SHORT, "trainer.max_epochs=3", *stop_at(1, 0, how="sigterm"))
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 143
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {results_of(cfg)['error']}"]


def test_ctrl_c_on_the_command_line_is_one_line_and_exits_130(make_cfg, capsys):
    """As SIGTERM: the line says where the run stopped and how to resume."""
    cfg = make_cfg("algo=npq", *SHORT, "trainer.max_epochs=3", *stop_at(1, 0, how="interrupt"))
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as stop:
            cli.main(cfg)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert stop.value.code == 130
    error = results_of(cfg)["error"]
    assert re.fullmatch(STOPPED.replace("SIGTERM", "Ctrl-C") + "; resume with ckpt_path=.*", error)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {error}"]


def test_ctrl_c_before_training_is_one_line(make_cfg, capsys, monkeypatch):
    """Ctrl-C while torch and Lightning are imported, before train() took over."""
    import vfl_lightning.run.train as run_train

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_train, "train", interrupted)
    cfg = make_cfg("algo=npq", *SHORT)
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 130
    line = "stopped by Ctrl-C before training started: results.json has status interrupted"
    assert capsys.readouterr().err.splitlines() == [f"error: {line}"]
    assert results_of(cfg)["status"] == "interrupted" and results_of(cfg)["error"] == line


def start_cli(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "logger=none",
            "trainer.enable_progress_bar=false",
            "trainer.max_epochs=1000",
            f"hydra.run.dir={tmp_path}",
            *overrides,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sigterm_after_first_checkpoint(process: subprocess.Popen, run_dir: Path) -> tuple[str, str]:
    """SIGTERM to ``process`` once its first checkpoint is on disk; its stdout and stderr."""
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 300
    while not checkpoint.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert checkpoint.is_file(), process.communicate(timeout=60)
    process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_sigterm_to_the_command_line(tmp_path, runtime):
    """``kill <pid>`` of ``python train.py``: one line, exit 143, results.json, and under Ray no
    party's dump (the actors are stopped with the run)."""
    extra = ["runtime=ray", "runtime.num_cpus=2"] if runtime == "ray" else []
    process = start_cli(tmp_path, "algo=npq", *extra)
    out, err = sigterm_after_first_checkpoint(process, tmp_path)
    assert process.returncode == 143, err[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "interrupted"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {results['error']}"]
    assert "Traceback" not in err and "SIGTERM" not in err.replace(errors[0], "")
    assert f"ckpt_path={tmp_path}/checkpoints/last.ckpt" in errors[0]
    assert f"results (interrupted): {tmp_path / 'results.json'}" in out
