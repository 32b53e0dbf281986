"""Training metrics of a protocol: ``train/*`` accuracy and loss, mechanism statistics and
communication totals, recorded per step without a host sync and logged once per epoch."""

from __future__ import annotations

import lightning as L
import torch
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    BinaryAccuracy,
    BinaryAUROC,
    BinaryAveragePrecision,
    MulticlassAccuracy,
)


def make_metrics(num_classes: int, stage: str) -> MetricCollection:
    """Accuracy for every task; AUROC and AUPRC (average precision) too for binary eval stages.

    Not synchronized across processes: with ``trainer=ddp`` every rank scores the whole global
    batch (see :class:`~vfl_lightning.parallel.RowShares`), so its metrics are already complete.
    """
    local = {"sync_on_compute": False}
    if num_classes == 2:
        metrics = {"acc": BinaryAccuracy(**local)}
        if stage != "train":
            metrics |= {"auroc": BinaryAUROC(**local), "auprc": BinaryAveragePrecision(**local)}
    else:
        metrics = {"acc": MulticlassAccuracy(num_classes=num_classes, average="micro", **local)}
    return MetricCollection(metrics, prefix=f"{stage}/")


def make_clean_accuracy(num_classes: int, stage: str) -> MetricCollection:
    """``{stage}/acc_clean``: accuracy of the noise-free server input (see ``clean_server_input``)."""
    accuracy = (
        BinaryAccuracy()
        if num_classes == 2
        else MulticlassAccuracy(num_classes=num_classes, average="micro")
    )
    return MetricCollection({"acc_clean": accuracy}, prefix=f"{stage}/")


class EpochMetrics(L.LightningModule):
    """Step logging and epoch aggregates of :class:`~vfl_lightning.algorithms.base.VFLModule`
    (its state: ``train_metrics``, ``mechanism``, ``wire`` and the epoch buffers, set in its
    ``__init__``)."""

    # ----------------------------------------------------------------- logging
    def is_log_step(self) -> bool:
        """Whether this training batch is one whose step metrics Lightning writes to the loggers:
        every ``trainer.log_every_n_steps`` batches (``global_step`` counts them once the server
        has stepped; the last batch of a stopping run too)."""
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step % every == 0 or self.trainer.should_stop)

    def accumulate_epoch(self, name: str, value, weight: float = 1.0, reduce: str = "mean") -> None:
        """Record ``value`` (a 0-dim tensor or a number) for the epoch aggregate ``name``, the
        ``weight``-ed ``mean`` or the ``max`` of the epoch's values. A step only appends (no
        tensor operation, no host sync); :meth:`log_epoch_metrics` reduces and logs each
        aggregate once."""
        if reduce not in ("mean", "max"):
            raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}")
        entry = self._epoch_aggregates.get(name)
        if entry is None:
            entry = self._epoch_aggregates[name] = ([], [], reduce)
        elif entry[2] != reduce:
            raise ValueError(f"epoch aggregate {name!r} is a {entry[2]}, not a {reduce}")
        entry[0].append(value.detach() if isinstance(value, torch.Tensor) else value)
        entry[1].append(float(weight))

    def epoch_aggregate(self, name: str) -> torch.Tensor:
        """The current value of the epoch aggregate ``name`` (weighted mean or max), 0-dim."""
        values, weights, reduce = self._epoch_aggregates[name]
        if all(isinstance(v, torch.Tensor) for v in values):
            stacked = torch.stack([v.reshape(()) for v in values]).to(self.device, torch.float32)
        else:
            stacked = torch.tensor([float(v) for v in values], device=self.device)
        if reduce == "max":
            return stacked.max()
        weight = torch.tensor(weights, dtype=torch.float32, device=self.device)
        return (stacked * weight).sum() / weight.sum()

    def log_train_step(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """``train/loss`` on logging steps only; the epoch means (``train/loss_epoch``,
        ``train/*`` metrics, mechanism stats) are recorded as they are and logged once per
        epoch, so a step costs no ``self.log`` call, no metric update and no host sync between
        logging steps."""
        loss = loss.detach()
        if self.is_log_step():
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        batch_size = int(y.shape[0])
        self.accumulate_epoch("train/loss_epoch", loss, batch_size)
        self._epoch_predictions.append((logits.detach(), y))
        for key, value in self.mechanism.stats.items():
            self.accumulate_epoch(key, value, batch_size)

    def communication_metrics(self) -> dict[str, float]:
        ledger = self.wire.ledger
        up, down, peer = (ledger.megabytes(d) for d in ("up", "down", "peer"))
        return {
            "comm/uplink_mb": up,
            "comm/downlink_mb": down,
            "comm/total_mb": up + down + peer,
            "comm/rounds": float(ledger.rounds),
            "comm/serialized_mb": ledger.serialized_bytes / 1e6,
            "time/simulated_s": float(self.wire.clock.now),
        }

    def on_train_epoch_start(self) -> None:
        self._epoch_aggregates.clear()
        self._epoch_predictions.clear()
        self._epoch_metrics_logged = False

    def on_train_epoch_end(self) -> None:
        if not self._epoch_metrics_logged:  # an epoch cut short (e.g. by max_steps)
            self.log_epoch_metrics()

    def log_epoch_metrics(self) -> None:
        """Every epoch metric, logged once: communication, the step aggregates, ``train/*``.

        Called from the epoch's last batch, so callbacks' ``on_train_epoch_end`` (which Lightning
        runs before the module's, e.g. the cost-to-target tracker) see this epoch's values."""
        self._epoch_metrics_logged = True
        self.log_dict(self.communication_metrics(), on_step=False, on_epoch=True)
        for name in self._epoch_aggregates:
            self.log(name, self.epoch_aggregate(name), on_step=False, on_epoch=True)
        self._epoch_aggregates.clear()
        if self._epoch_predictions:
            logits, y = (torch.cat(part) for part in zip(*self._epoch_predictions, strict=True))
            self._epoch_predictions.clear()
            self.train_metrics.update(self.scores(logits), y)
            self.log_dict(self.train_metrics.compute(), on_step=False, on_epoch=True, prog_bar=True)
        self.train_metrics.reset()

    def results(self) -> dict:
        """Protocol totals for results.json (extended by subclasses)."""
        out = self.communication_metrics()
        out["comm/peer_mb"] = self.wire.ledger.megabytes("peer")
        if self.wire.ledger.socket_bytes is not None:
            out["comm/socket_mb"] = self.wire.ledger.socket_bytes / 1e6
        out["comm/psi_mb"] = self.wire.ledger.psi_bytes / 1e6
        return out | self.party_privacy()
