"""The training progress bar: Lightning's tqdm bar, updated a few times a second, drawn on the
terminal only.

Lightning's default rich bar reads every logged metric after every training batch, redraws from a
background thread, and waits for that thread's sleep when it stops (after fit and after test); at
the ~1 ms steps of small VFL models this is a large share of a run. This bar updates at most
``updates_per_second`` times a second (and on an epoch's last batch), without a thread, so it shows
the same values at most that late for a fraction of the cost.

Its frames go to a duplicate of the standard output's file descriptor rather than through
``sys.stdout``: W&B wraps ``sys.stdout.write`` to record the console in the run's
``output.log``, and passes every write through a terminal emulator, which cost milliseconds per
frame (more than the frame itself). The bar still appears where standard output goes; the run's
``output.log`` keeps every other line, without the progress frames.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time

from lightning.pytorch.callbacks import TQDMProgressBar


def terminal_stream() -> io.TextIOBase | None:
    """A line-buffered text stream on a duplicate of ``sys.stdout``'s file descriptor, or None
    when standard output has none (a notebook, a redirect to an in-memory stream)."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return open(  # noqa: SIM115  (closed in ProgressBar.teardown)
        os.dup(descriptor), "w", buffering=1, encoding=encoding, errors="replace"
    )


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` whose training bar updates at most ``updates_per_second`` times a
    second and always on an epoch's last batch (validation and test bars as Lightning's), and whose
    bars write to :func:`terminal_stream`."""

    def __init__(self, updates_per_second: float = 4.0, **kwargs) -> None:
        if isinstance(updates_per_second, bool) or not (
            isinstance(updates_per_second, int | float) and updates_per_second > 0
        ):
            raise ValueError(
                f"callbacks.progress_bar.updates_per_second must be a number > 0, got "
                f"{updates_per_second!r}"
            )
        super().__init__(refresh_rate=1, **kwargs)
        self.interval_s = 1.0 / float(updates_per_second)
        self._next_update = 0.0
        self._stream: io.TextIOBase | None = None

    @contextlib.contextmanager
    def _on_terminal(self):
        """Lightning builds its bars with ``file=sys.stdout``: point that at the terminal stream."""
        if self._stream is None or self._stream.closed:
            self._stream = terminal_stream()
        if self._stream is None:
            yield
            return
        with contextlib.redirect_stdout(self._stream):
            yield

    def init_sanity_tqdm(self):
        with self._on_terminal():
            return super().init_sanity_tqdm()

    def init_train_tqdm(self):
        with self._on_terminal():
            return super().init_train_tqdm()

    def init_validation_tqdm(self):
        with self._on_terminal():
            return super().init_validation_tqdm()

    def init_test_tqdm(self):
        with self._on_terminal():
            return super().init_test_tqdm()

    def init_predict_tqdm(self):
        with self._on_terminal():
            return super().init_predict_tqdm()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Close the bars a failure left open (the inner ones first, the training bar last, whose
        close ends its line): the ``error:`` and ``results (failed):`` lines printed after it
        start their own lines."""
        bars = (
            self._predict_progress_bar,
            self._test_progress_bar,
            self._val_progress_bar,
            self._train_progress_bar,
        )
        for bar in bars:
            if bar is not None and not bar.disable:
                bar.close()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._next_update = 0.0
        super().on_train_epoch_start(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.monotonic()
        if now < self._next_update and batch_idx + 1 < self.total_train_batches:
            return
        self._next_update = now + self.interval_s
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
