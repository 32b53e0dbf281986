"""The progress bar: updated a few times a second, on every epoch's last batch, and left out when
the trainer's progress bar is off."""

from __future__ import annotations

import sys

import pytest

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
