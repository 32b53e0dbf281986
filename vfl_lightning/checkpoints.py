"""Checkpoints that survive a crash: ``last.ckpt`` after every epoch (and optionally every n server
updates), written atomically next to its target so a kill mid-write never leaves a corrupt file;
the file is written and flushed to disk by a background thread, so training does not wait for it."""

from __future__ import annotations

import io
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from vfl_lightning.files import atomic_write_bytes, remove_stale_temporaries

log = logging.getLogger(__name__)


def serialize(obj: Any) -> bytes:
    """``torch.save`` of ``obj`` into memory: a snapshot of its tensors at this moment."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` of ``obj`` to ``path`` through :func:`atomic_write_bytes`."""
    atomic_write_bytes(serialize(obj), path)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO for local paths, written atomically in the background.

    ``save_checkpoint`` serializes the checkpoint in the calling (training) thread, so the file
    holds the state of that moment, and hands the bytes to one writer thread that runs
    :func:`atomic_write_bytes` (write, fsync, rename, fsync of the directory) while training goes
    on. One write is in flight at a time: the next save, a load, and ``teardown`` (the end of every
    ``fit``/``test``, also after an error) wait for it and raise its error if it failed. A process
    killed during a write keeps the previous file (Lightning's own writer stages the file in the
    system temp dir and copies it over, which is not atomic).
    """

    def __init__(self) -> None:
        super().__init__()
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO.save_checkpoint takes no storage_options")
        data = serialize(checkpoint)
        self.wait()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending = self._writer.submit(atomic_write_bytes, data, path)

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk; raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict:
        self.wait()
        return super().load_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.wait()
        super().remove_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None


class LastCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt`` at the end of every training epoch (after its validation),
    every ``every_n_train_steps`` server updates if set, and when training ends.

    Each write replaces the previous file atomically (with :class:`AtomicCheckpointIO` as the
    trainer's checkpoint IO, which ``train()`` installs). Nothing is written during the sanity
    check or a ``fast_dev_run``. ``last_model_path`` is the file written (empty before the first).
    The module's ``check_finite`` runs before each write: a run whose loss or parameters turned
    non-finite stops there, and its last good checkpoint stays in place.

    At the start of ``fit`` (rank 0) it removes the temporary files that killed writes left in its
    directory and in the resumed checkpoint's (:func:`remove_stale_temporaries`). Each checkpoint
    keeps the validation and training metrics of its moment, so resuming a run that had already
    finished (nothing left to train) reports them and that checkpoint (:meth:`results`).
    """

    FILENAME = "last.ckpt"
    RECOMPUTED_METRICS = ("test/", "comm/", "time/", "privacy/", "attack/")
    """Logged metrics a checkpoint does not keep: a resumed run computes them again (the test
    split) or exactly from the restored protocol state (ledger, clock, accountant, attacks)."""

    def __init__(self, dirpath: str, every_n_train_steps: int | None = None) -> None:
        if every_n_train_steps is not None and (
            isinstance(every_n_train_steps, bool)
            or not isinstance(every_n_train_steps, int)
            or every_n_train_steps < 1
        ):
            raise ValueError(
                "callbacks.checkpoint.every_n_train_steps must be an integer >= 1 or null, "
                f"got {every_n_train_steps!r}"
            )
        self.dirpath = Path(dirpath)
        self.every_n_train_steps = every_n_train_steps
        self.last_model_path = ""
        self._saved_at: tuple[int, int] | None = None
        self._step_before_batch = 0
        self._metrics: dict[str, float] = {}
        self._restored_metrics: dict[str, float] = {}
        self._trained = False
        self._finished_before = False

    @property
    def path(self) -> Path:
        return self.dirpath / self.FILENAME

    def _save(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.fast_dev_run or trainer.sanity_checking:
            return
        check_finite = getattr(module, "check_finite", None)
        if check_finite is not None:
            check_finite()
        position = (int(trainer.current_epoch), int(trainer.global_step))
        if position == self._saved_at:
            return
        self.last_model_path = str(self.path)
        self._metrics = {
            key: float(value)
            for key, value in trainer.callback_metrics.items()
            if not key.startswith(self.RECOMPUTED_METRICS) and value.numel() == 1
        }
        trainer.save_checkpoint(self.path, weights_only=False)
        self._saved_at = position

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        # the checkpoint folders and the run directories above them (curve.csv, results.json),
        # this run's and the resumed run's
        folders = {self.dirpath, self.dirpath.parent}
        if trainer.ckpt_path is not None:
            folders |= {Path(trainer.ckpt_path).parent, Path(trainer.ckpt_path).parent.parent}
        for folder in sorted(folders):
            for path in remove_stale_temporaries(folder):
                log.info("removed %s, left by a write that was killed", path)

    def on_train_start(self, trainer, pl_module) -> None:
        self._trained = True

    def on_fit_end(self, trainer, pl_module) -> None:
        """A resumed run with nothing left to train: its model is the resumed checkpoint."""
        if self._trained or trainer.ckpt_path is None or trainer.fast_dev_run:
            return
        self._finished_before = True
        self.last_model_path = str(trainer.ckpt_path)
        log.info(
            "ckpt_path=%s holds a finished run (epoch %d, step %d): nothing left to train, "
            "reporting its metrics",
            trainer.ckpt_path,
            trainer.current_epoch,
            trainer.global_step,
        )

    def results(self) -> dict:
        """The resumed checkpoint's validation and training metrics when this fit had nothing
        left to train (a run resumed after it finished); otherwise nothing."""
        return dict(self._restored_metrics) if self._finished_before else {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_before_batch = int(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Save when this batch's server updates crossed a multiple of ``every_n_train_steps``
        (a FedBCD batch makes Q updates, so the step may jump over the multiple itself)."""
        n = self.every_n_train_steps
        if n is not None and trainer.global_step // n > self._step_before_batch // n:
            self._save(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module)

    def state_dict(self) -> dict:
        return {"last_model_path": self.last_model_path, "metrics": dict(self._metrics)}

    def load_state_dict(self, state_dict: dict) -> None:
        self._restored_metrics = dict(state_dict.get("metrics") or {})


def resumable_checkpoint(trainer: L.Trainer | None) -> str | None:
    """The checkpoint a run stopped now resumes from: the last one its :class:`LastCheckpoint`
    wrote (a write still in flight is finished before the process ends), else the file it was
    resumed from (``ckpt_path``, still intact); None before a trainer exists or when neither is
    there."""
    if trainer is None:
        return None
    for callback in trainer.callbacks:
        if isinstance(callback, LastCheckpoint) and callback.last_model_path:
            return callback.last_model_path
    resumed = trainer.ckpt_path
    return str(resumed) if resumed is not None and Path(resumed).is_file() else None
