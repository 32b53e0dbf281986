"""The training progress bar: Lightning's tqdm bar, updated a few times a second.

Lightning's default rich bar reads every logged metric after every training batch, redraws from a
background thread, and waits for that thread's sleep when it stops (after fit and after test); at
the ~1 ms steps of small VFL models this is a large share of a run. This bar updates at most
``updates_per_second`` times a second (and on an epoch's last batch), without a thread, so it shows
the same values at most that late for a fraction of the cost.
"""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import TQDMProgressBar


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` whose training bar updates at most ``updates_per_second`` times a
    second and always on an epoch's last batch (validation and test bars as Lightning's)."""

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

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._next_update = 0.0
        super().on_train_epoch_start(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.monotonic()
        if now < self._next_update and batch_idx + 1 < self.total_train_batches:
            return
        self._next_update = now + self.interval_s
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
