"""The progress bar: updated a few times a second, on every epoch's last batch, and left out when
the trainer's progress bar is off."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vfl_lightning import cli
from vfl_lightning.progress import ProgressBar
from vfl_lightning.run.assemble import make_callbacks


@pytest.mark.parametrize("value", [0, -1.5, True, "fast"])
def test_updates_per_second_must_be_positive(value):
    with pytest.raises(ValueError, match=r"updates_per_second must be a number > 0, got"):
        ProgressBar(updates_per_second=value)


def test_bar_updates_at_most_at_its_rate_and_on_the_last_batch(monkeypatch):
    bar = ProgressBar(updates_per_second=2)
    updated = []
    monkeypatch.setattr(
        ProgressBar.__mro__[1], "on_train_batch_end", lambda self, *a: updated.append(a[-1])
    )
    monkeypatch.setattr(ProgressBar, "total_train_batches", property(lambda self: 5))
    clock = iter([0.0, 0.1, 0.2, 0.6, 0.7])
    monkeypatch.setattr("vfl_lightning.progress.time.monotonic", lambda: next(clock))
    for batch_idx in range(5):
        bar.on_train_batch_end(None, None, None, None, batch_idx)
    assert updated == [0, 3, 4]  # t=0, t=0.6 (0.5 s later), and the last batch


def test_progress_bar_follows_enable_progress_bar(make_cfg):
    on = make_callbacks(make_cfg("trainer.enable_progress_bar=true"))
    off = make_callbacks(make_cfg("trainer.enable_progress_bar=false"))
    assert sum(isinstance(c, ProgressBar) for c in on) == 1
    assert not any(isinstance(c, ProgressBar) for c in off)


class _Stdout:
    """A stand-in for ``sys.stdout`` (W&B's console capture patches its ``write``) that records
    the writes made through it; ``fileno`` from ``target`` when given."""

    encoding = "utf-8"

    def __init__(self, target=None) -> None:
        self.target = target
        self.written: list[str] = []

    def fileno(self) -> int:
        if self.target is None:
            raise OSError("no file descriptor")
        return self.target.fileno()

    def write(self, text: str) -> int:
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def _draw_one_bar() -> None:
    bar = ProgressBar()
    tqdm_bar = bar.init_train_tqdm()
    tqdm_bar.total = 3
    tqdm_bar.update(3)
    tqdm_bar.close()
    bar.teardown(None, None, "fit")


def test_bar_frames_reach_the_terminal_without_going_through_sys_stdout_write(
    tmp_path, monkeypatch
):
    with open(tmp_path / "terminal.txt", "w") as target:
        stdout = _Stdout(target)
        monkeypatch.setattr(sys, "stdout", stdout)
        _draw_one_bar()
    assert stdout.written == []
    assert "3/3" in (tmp_path / "terminal.txt").read_text()


def test_bar_falls_back_to_sys_stdout_without_a_file_descriptor(monkeypatch):
    stdout = _Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    _draw_one_bar()
    assert "3/3" in "".join(stdout.written)


@pytest.mark.parametrize(
    "checkpoint", ["null", "1"], ids=["no-checkpoint", "checkpoint-every-step"]
)
def test_error_and_results_lines_start_their_own_line_after_a_bar(
    make_cfg, tmp_path, monkeypatch, checkpoint
):
    """A run that fails mid-epoch with a bar on screen: the console (stdout, stderr and the bar's
    duplicate of stdout, one file) has ``error:`` and ``results (failed):`` at a line's start,
    and the error says whether a checkpoint was written before the failure."""
    cfg = make_cfg(
        "optimizer.lr=1e6",
        "trainer.log_every_n_steps=1",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=true",
        "callbacks.progress_bar.updates_per_second=1000",
        f"callbacks.checkpoint.every_n_train_steps={checkpoint}",
    )
    with open(tmp_path / "console.txt", "a", buffering=1) as console:
        monkeypatch.setattr(sys, "stdout", console)
        monkeypatch.setattr(sys, "stderr", console)
        with pytest.raises(SystemExit) as stop:
            cli.main(cfg)
    assert stop.value.code == 1
    lines = (tmp_path / "console.txt").read_text().split("\n")
    assert any("Epoch 0:" in line for line in lines), "the bar was drawn"
    errors = [line for line in lines if "error:" in line]
    failed = [line for line in lines if "results (failed):" in line]
    assert len(errors) == 1 and errors[0].startswith("error: training stopped:"), errors
    assert len(failed) == 1 and failed[0].startswith("results (failed): "), failed
    written = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    if checkpoint == "null":
        assert errors[0].endswith("; no checkpoint was written before it")
    else:
        assert errors[0].endswith(f"; the last checkpoint written before it is kept ({written})")
        assert written.is_file()
