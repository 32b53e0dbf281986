"""Checkpoints survive a crash: last.ckpt after every epoch, atomic writes, and a run killed
mid-epoch (exception, or kill -9 of the process) resumes to the uninterrupted result."""

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CONF_DIR, assert_same_training_state, stop_at

from vfl_lightning.checkpoints import AtomicCheckpointIO, LastCheckpoint, atomic_torch_save
from vfl_lightning.files import TEMPORARY_NAME, remove_stale_temporaries
from vfl_lightning.train import train

ROOT = Path(CONF_DIR).parent
PROTOCOLS = {
    "pbm": ["algo=pbm"],
    "cascade": ["algo=cascade"],
    "fedvs": ["experiment=fedvs_digits"],
}
SHORT = ["trainer.limit_train_batches=4", "trainer.limit_val_batches=1", "test=false"]


def last(cfg) -> Path:
    return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"


def resume_equals_straight(make_cfg, common: list[str], crashed_dir: Path, epochs: int) -> dict:
    """Resume from the crashed run's last.ckpt to ``epochs`` and compare with a straight run."""
    straight = make_cfg(*common, f"trainer.max_epochs={epochs}")
    train(straight)
    resumed = make_cfg(
        *common,
        f"trainer.max_epochs={epochs}",
        f"ckpt_path={crashed_dir / 'checkpoints' / 'last.ckpt'}",
    )
    results = train(resumed)
    a = torch.load(last(straight), weights_only=False)
    b = torch.load(last(resumed), weights_only=False)
    assert_same_training_state(a, b)
    return results


def test_crash_mid_epoch_keeps_last_epoch_checkpoint_and_resume_equals_straight(make_cfg):
    common = ["algo=pbm", *SHORT]
    crashed = make_cfg(*common, "trainer.max_epochs=4", *stop_at(epoch=2, batch=1))
    with pytest.raises(RuntimeError, match="simulated crash at epoch 2, batch 1"):
        train(crashed)
    checkpoint = torch.load(last(crashed), weights_only=False)
    assert checkpoint["epoch"] == 1 and checkpoint["global_step"] == 8  # after 2 full epochs
    results = json.loads((Path(crashed.paths.output_dir) / "results.json").read_text())
    assert results["status"] == "failed" and "simulated crash" in results["error"]
    assert not [p for p in last(crashed).parent.iterdir() if p.name != "last.ckpt"]
    resumed = resume_equals_straight(make_cfg, common, Path(crashed.paths.output_dir), epochs=4)
    assert resumed["status"] == "finished" and resumed["comm/rounds"] == 16


def test_every_n_train_steps_also_writes_mid_epoch(make_cfg):
    cfg = make_cfg(
        "algo=npq",
        *SHORT,
        "trainer.max_epochs=2",
        "callbacks.checkpoint.every_n_train_steps=3",
        *stop_at(epoch=0, batch=3),
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg)
    assert torch.load(last(cfg), weights_only=False)["global_step"] == 3


@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_every_n_train_steps_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match=r"every_n_train_steps must be an integer >= 1 or null"):
        LastCheckpoint("unused", every_n_train_steps=value)


def test_interrupted_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    atomic_torch_save({"epoch": 1}, target)

    def broken_fsync(fd):  # the new bytes are written, the flush to disk fails
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"epoch": 2}, target)
    monkeypatch.undo()
    assert torch.load(target)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_background_write_holds_the_state_of_the_save_call_and_reports_its_error(
    tmp_path, monkeypatch
):
    io_plugin = AtomicCheckpointIO()
    weight = torch.zeros(3)
    io_plugin.save_checkpoint({"w": weight}, tmp_path / "a.ckpt")
    weight.add_(1.0)  # training goes on while the file is written
    io_plugin.wait()
    assert torch.equal(torch.load(tmp_path / "a.ckpt")["w"], torch.zeros(3))

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    io_plugin.save_checkpoint({"w": weight}, tmp_path / "a.ckpt")
    with pytest.raises(OSError, match="disk full"):
        io_plugin.teardown()
    monkeypatch.undo()
    assert torch.equal(torch.load(tmp_path / "a.ckpt")["w"], torch.zeros(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt"]


def test_temporary_file_is_written_next_to_the_target(tmp_path, monkeypatch):
    seen = []
    original = os.replace

    def spy(source, destination):
        seen.append((Path(source).parent, Path(destination)))
        return original(source, destination)

    monkeypatch.setattr(os, "replace", spy)
    atomic_torch_save({"x": 1}, tmp_path / "sub" / "last.ckpt")
    assert seen == [(tmp_path / "sub", tmp_path / "sub" / "last.ckpt")]


def run_until_killed(overrides: list[str], run_dir: Path) -> None:
    """``python train.py <overrides>`` in a subprocess (tests/ on its path for the callbacks) that
    must end by SIGKILL, its outputs in ``run_dir``."""
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    command = [sys.executable, str(ROOT / "train.py"), *overrides, "logger=none"]
    command += ["trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(
        command, cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_kill_minus_9_mid_epoch_then_resume_equals_uninterrupted(make_cfg, tmp_path, protocol):
    common = [*PROTOCOLS[protocol], *SHORT]
    killed_dir = tmp_path / "killed"
    run_until_killed(
        [*common, "trainer.max_epochs=3", *stop_at(epoch=2, batch=2, how="kill")], killed_dir
    )
    assert torch.load(killed_dir / "checkpoints" / "last.ckpt", weights_only=False)["epoch"] == 1
    resume_equals_straight(make_cfg, [*common, "trainer.max_epochs=3"], killed_dir, epochs=3)


@pytest.mark.parametrize("protocol", ["pbm", "fedvs"])
def test_mid_epoch_checkpoint_resumes_with_the_next_batch(make_cfg, protocol):
    common = [*PROTOCOLS[protocol], *SHORT, "callbacks.checkpoint.every_n_train_steps=2"]
    crashed = make_cfg(*common, "trainer.max_epochs=3", *stop_at(epoch=1, batch=3))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(crashed)
    assert torch.load(last(crashed), weights_only=False)["global_step"] == 6  # mid epoch 1
    resume_equals_straight(make_cfg, common, Path(crashed.paths.output_dir), epochs=3)


def test_every_n_train_steps_counts_server_updates_of_fedbcd(make_cfg):
    # FedBCD with Q = 3 makes 3 server updates per batch: steps 3, 6, 9, 12 cross multiples of 4
    # at batches 2 (step 6), 3 (9) and 4 (12); a crash before batch 3 leaves step 6.
    cfg = make_cfg(
        "algo=fedbcd",
        "algo.local_steps=3",
        *SHORT,
        "trainer.max_epochs=1",
        "callbacks.checkpoint.every_n_train_steps=4",
        *stop_at(epoch=0, batch=2),
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg)
    assert torch.load(last(cfg), weights_only=False)["global_step"] == 6


class KillInCheckpointRename(L.Callback):
    """From epoch ``epoch`` on, SIGKILLs this process when a checkpoint write renames its finished
    temporary file (``kill -9`` between the write and the rename: the file stays behind). Added
    as ``+callbacks.kill._target_=test_checkpoints.KillInCheckpointRename``."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != self.epoch:
            return
        trainer.strategy.checkpoint_io.wait()  # the previous epoch's write is renamed
        rename = os.replace

        def killing_rename(source, destination):
            name = Path(source).name
            if TEMPORARY_NAME.fullmatch(name) and name.startswith(".last.ckpt."):
                os.kill(os.getpid(), signal.SIGKILL)
            return rename(source, destination)

        os.replace = killing_rename


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMPORARY_NAME.fullmatch(p.name))


def test_a_kill_during_a_checkpoint_write_leaves_no_file_after_the_resume(make_cfg, tmp_path):
    common = ["algo=pbm", *SHORT, "trainer.max_epochs=2"]
    killed_dir = tmp_path / "killed"
    kill = ["_target_=test_checkpoints.KillInCheckpointRename", "epoch=1"]
    run_until_killed([*common, *[f"+callbacks.kill.{k}" for k in kill]], killed_dir)
    checkpoints = killed_dir / "checkpoints"
    (left,) = temporaries(checkpoints)  # the write of epoch 1's checkpoint, complete, not renamed
    assert left.startswith(".last.ckpt.") and (checkpoints / left).stat().st_size > 10_000
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["epoch"] == 0
    # a curve.csv write killed before its rename leaves the same kind of file in the run dir
    (killed_dir / ".curve.csv.k1lled00.partial").write_bytes(b"epoch\n")
    assert temporaries(killed_dir) == [".curve.csv.k1lled00.partial"]
    resumed = make_cfg(*common, f"ckpt_path={checkpoints / 'last.ckpt'}")
    assert train(resumed)["status"] == "finished"
    assert temporaries(checkpoints) == [] and temporaries(killed_dir) == []
    assert sorted(p.name for p in last(resumed).parent.iterdir()) == ["last.ckpt"]


def test_only_unlocked_files_named_like_our_temporaries_are_removed(tmp_path):
    names = [".last.ckpt.ab12cd_9.partial", ".last.ckpt.ab12cd_9", "notes.partial", "last.ckpt"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".x.ckpt.zzzzzzzz.partial").mkdir()
    writing = tmp_path / ".results.json.0123abcd.partial"
    writing.write_bytes(b"x")
    with open(writing, "rb") as handle:  # a live writer holds the lock until its rename
        fcntl.flock(handle, fcntl.LOCK_EX)
        assert remove_stale_temporaries(tmp_path) == [tmp_path / names[0]]
        assert writing.exists()
    assert remove_stale_temporaries(tmp_path) == [writing]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*names[1:], ".x.ckpt.zzzzzzzz.partial"]
    )


def test_a_write_holds_its_lock_until_the_rename(tmp_path, monkeypatch):
    seen = []
    rename = os.replace

    def look_before_rename(source, destination):
        seen.append(remove_stale_temporaries(tmp_path))
        return rename(source, destination)

    monkeypatch.setattr(os, "replace", look_before_rename)
    atomic_torch_save({"x": 1}, tmp_path / "last.ckpt")
    assert seen == [[]] and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_resuming_a_finished_run_reports_its_results_and_checkpoint(make_cfg):
    common = ["algo=pbm", *SHORT, "trainer.max_epochs=2"]
    finished = make_cfg(*common)
    first = train(finished)
    again = train(make_cfg(*common, f"ckpt_path={last(finished)}"))
    assert again["checkpoint"] == str(last(finished)) and again["val/acc"] is not None
    first.pop("time/wall_s"), again.pop("time/wall_s")
    assert again == first | {"checkpoint": str(last(finished))}
    written = json.loads((Path(finished.paths.output_dir) / "results.json").read_text())
    assert written["val/acc"] == first["val/acc"]


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        (
            {"max_epochs": 1},
            "ckpt_path=c.ckpt is at epoch 2, beyond trainer.max_epochs=1: set it to 2 or more",
        ),
        (
            {"max_epochs": 30, "fast_dev_run": True},
            "ckpt_path=c.ckpt is at epoch 2, beyond trainer.fast_dev_run=True (1 epoch): drop "
            "debug=fdr / trainer.fast_dev_run",
        ),
    ],
)
def test_a_resume_beyond_max_epochs_names_both_keys(trainer, message):
    """Before: Lightning's 'You restored a checkpoint with current_epoch=2, but you have set
    Trainer(max_epochs=1).', which names neither key nor the fix."""
    from omegaconf import OmegaConf

    from vfl_lightning.errors import ConfigError
    from vfl_lightning.run.resume import check_resume_epochs

    with pytest.raises(ConfigError) as refused:
        check_resume_epochs(2, OmegaConf.create(trainer), "c.ckpt")
    assert str(refused.value) == message
    for fine in ({"max_epochs": 2}, {"max_epochs": -1, "max_steps": 10}, {"max_epochs": 5}):
        check_resume_epochs(2, OmegaConf.create(fine), "c.ckpt")
