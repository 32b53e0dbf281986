"""curve.csv: one row per validation of a run (x axes + every ``val/*`` metric), rewritten after
each validation so a crashed run keeps its curve; reports read it without W&B."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import lightning as L

from vfl_lightning.files import atomic_write_bytes

AXES = ("epoch", "global_step", "comm/rounds", "comm/total_mb", "time/simulated_s")
EPS_AXIS = "privacy/feature_eps"


def read_curve(path: str | Path) -> list[dict[str, float]]:
    """The rows of a curve.csv as floats (an empty cell becomes NaN)."""
    with open(path, newline="") as f:
        return [
            {key: float(value) if value != "" else float("nan") for key, value in row.items()}
            for row in csv.DictReader(f)
        ]


class CurveWriter(L.Callback):
    """After every validation during fit, appends a row to ``path`` (curve.csv) and logs its x
    axes with the ``val/*`` metrics, so a logger gets them in the same row.

    Columns: ``epoch`` (training epochs done, fractional for a validation inside an epoch),
    ``global_step``, ``comm/rounds``, ``comm/total_mb`` (uplink + downlink + peer),
    ``time/simulated_s``, ``privacy/feature_eps`` (when a privacy accountant runs), then every
    ``val/*`` metric as logged. The file is rewritten whole and atomically after each validation;
    the rows are kept in checkpoints, so a resumed run writes its curve from the first epoch.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, float]] = []
        self._batches_done = 0
        self._pending: dict[str, float] = {}

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._batches_done = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches_done = batch_idx + 1

    def axes(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """The x-axis values at this moment of training."""
        comm = pl_module.communication_metrics()
        batches = trainer.num_training_batches
        fraction = self._batches_done / batches if batches and batches != float("inf") else 0.0
        values = {
            "epoch": round(trainer.current_epoch + fraction, 6),
            "global_step": float(trainer.global_step),
            "comm/rounds": comm["comm/rounds"],
            "comm/total_mb": comm["comm/total_mb"],
            "time/simulated_s": comm["time/simulated_s"],
        }
        accountant = next(
            (c.accountant for c in trainer.callbacks if getattr(c, "accountant", None)), None
        )
        if accountant is not None:
            values[EPS_AXIS] = float(accountant.spent()["feature_eps"])
        return values

    def _recording(self, trainer: L.Trainer) -> bool:
        return trainer.state.fn == "fit" and not trainer.sanity_checking

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not self._recording(trainer):
            return
        self._pending = self.axes(trainer, pl_module)
        logged = {k: v for k, v in self._pending.items() if k not in ("epoch", "global_step")}
        pl_module.log_dict(logged, on_step=False, on_epoch=True)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self._recording(trainer) or not trainer.is_global_zero:
            return
        metrics = {
            key: float(value)
            for key, value in sorted(trainer.callback_metrics.items())
            if key.startswith("val/")
        }
        self.rows.append({**self._pending, **metrics})
        self.write()

    def columns(self) -> list[str]:
        seen = {key for row in self.rows for key in row}
        fixed = [*AXES, EPS_AXIS] if EPS_AXIS in seen else list(AXES)
        return fixed + sorted(seen - set(fixed))

    def write(self) -> None:
        """Write every row to ``path`` atomically (:func:`~vfl_lightning.files.atomic_write_bytes`:
        a locked temporary file renamed into place, which a resume can tell from a live write),
        without waiting for the disk: the rows are also in every checkpoint (:meth:`state_dict`),
        the durable record a resume rewrites the curve from."""
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.columns(), restval="")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({k: repr(v) for k, v in row.items()})
        atomic_write_bytes(text.getvalue().encode(), self.path, durable=False)

    def state_dict(self) -> dict:
        return {"rows": [dict(row) for row in self.rows]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = [dict(row) for row in state_dict.get("rows", [])]
