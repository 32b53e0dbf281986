"""Callbacks shared by every protocol: cost-to-target (rounds, MB, epoch at which a metric first
reaches its target)."""

from __future__ import annotations

import lightning as L


class TargetTracker(L.Callback):
    """Records the first epoch, communication round and cumulative MB (uplink + downlink) at which
    ``metric`` reaches ``value`` (``mode='max'``: >=, ``'min'``: <=), as the papers' cost tables.

    Checked after every validation run (``val/*`` metrics; validate more often with
    ``trainer.val_check_interval`` for a finer round count) and at every training epoch end.
    ``results()`` gives ``rounds_to_target``, ``mb_to_target``, ``epoch_to_target`` (None if never).
    ``stop=True`` ends training once the target is reached.
    """

    def __init__(
        self,
        metric: str = "val/acc",
        value: float | None = None,
        mode: str = "max",
        stop: bool = False,
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"target mode must be 'max' or 'min', got {mode!r}")
        self.metric = metric
        self.value = value
        self.mode = mode
        self.stop = bool(stop)
        self.reached: dict | None = None

    def _check(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.value is None or self.reached is not None or trainer.sanity_checking:
            return
        current = trainer.callback_metrics.get(self.metric)
        if current is None:
            return
        current = float(current)
        hit = current >= self.value if self.mode == "max" else current <= self.value
        if hit:
            ledger = module.wire.ledger
            self.reached = {
                "epoch": int(trainer.current_epoch),
                "rounds": int(ledger.rounds),
                "mb": ledger.megabytes("up") + ledger.megabytes("down") + ledger.megabytes("peer"),
                "simulated_s": float(module.wire.clock.now),
                "value": current,
            }
            if self.stop:
                trainer.should_stop = True

    def on_validation_end(self, trainer, pl_module) -> None:
        self._check(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._check(trainer, pl_module)

    def results(self) -> dict:
        reached = self.reached or {}
        return {
            "target_metric": self.metric,
            "target_value": self.value,
            "epoch_to_target": reached.get("epoch"),
            "rounds_to_target": reached.get("rounds"),
            "mb_to_target": reached.get("mb"),
            "simulated_s_to_target": reached.get("simulated_s"),
        }

    def state_dict(self) -> dict:
        return {"reached": self.reached}

    def load_state_dict(self, state_dict: dict) -> None:
        self.reached = state_dict.get("reached")
