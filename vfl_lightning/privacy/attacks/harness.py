"""The Lightning side of every wire attack: it records the wire during training, hands the
attack's role its view of each batch, scores the attack after training and writes its results."""

from __future__ import annotations

from abc import ABC, abstractmethod

import lightning as L
import torch

from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.analysis.dcs import defense_capability_score
from vfl_lightning.privacy.attacks.views import ROLES, BatchRecorder
from vfl_lightning.seeding import derive_seed


class WireAttack(L.Callback, ABC):
    """Base of the attack callbacks (``attack=<name>``).

    The harness is the trusted evaluator: it attaches a :class:`BatchRecorder` to the module's
    wire, keeps the true training labels (taken at setup, before a label defense perturbs the
    training labels) and the declared auxiliary knowledge. The adversary only ever receives its
    role's view (:mod:`~vfl_lightning.privacy.attacks.views`) and that auxiliary knowledge.
    Results: ``attack/<name>/<metric>``, ``attack/<name>/config`` (role and assumptions),
    ``attack/<name>/headline`` (the metric that sums it up, :attr:`headline`, and its label),
    ``attack/<name>/baseline`` (AP*) and ``attack/<name>/dcs`` (see :meth:`dcs`). Subclasses set ``name``, ``role``, ``assumptions``,
    ``attack_baseline`` (AP*, the no-information value of ``performance``) and implement
    :meth:`check`, :meth:`observe_batch` and :meth:`evaluate`.
    """

    name = ""
    role = ""
    assumptions = ""
    headline = "performance"
    """The metric that sums the attack up (a key of :meth:`evaluate`'s result): what reports draw
    and the run's summary prints, ``attack/<name>/headline`` in results.json."""
    headline_label = ""
    """How a figure names the headline (its axis label); default: ``<name> <headline>``."""

    def __init__(self, seed: int = 0, reference_metric: float | None = None) -> None:
        if self.role not in ROLES:
            raise ValueError(f"attack role must be one of {ROLES}, got {self.role!r}")
        self.seed = int(seed)
        self.reference_metric = None if reference_metric is None else float(reference_metric)
        self.recorder = BatchRecorder()
        self.true_labels: torch.Tensor | None = None
        self.metrics: dict = {}
        self._trainer: L.Trainer | None = None
        self._defended = False

    def generator(self) -> torch.Generator:
        """The attack's own randomness (auxiliary rows, known samples): never the global RNG."""
        return torch.Generator().manual_seed(
            derive_seed(self.seed, "adversary", "attack", index=len(self.name) * 104_729)
        )

    def refuse(self, reason: str) -> None:
        """One configuration error line: this attack cannot run on this protocol, and why."""
        raise ConfigError(f"attack={self.name} ({self.role} role): {reason}")

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = getattr(trainer, "datamodule", None)
        splits = getattr(datamodule, "splits", {})
        if "train" not in splits:
            self.refuse("needs a VerticalDataModule with preloaded splits")
        self._trainer = trainer
        self.true_labels = splits["train"].y.clone()
        self._defended = any(getattr(c, "is_defense", False) for c in trainer.callbacks)
        self.check(pl_module, datamodule)
        if self.recorder not in pl_module.wire.listeners:
            pl_module.wire.listeners.append(self.recorder)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.recorder.clear()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        idx = batch[2]
        self.observe_batch(pl_module, idx, self.true_labels[idx.cpu()].to(idx.device))
        self.recorder.clear()

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.wire.listeners.remove(self.recorder)
        self.metrics = self.evaluate(pl_module, trainer.datamodule)

    # ------------------------------------------------------------------ subclass interface
    def check(self, pl_module, datamodule) -> None:
        """Refuse (:meth:`refuse`) a protocol on which this role observes nothing of the kind."""

    @abstractmethod
    def observe_batch(self, pl_module, idx: torch.Tensor, labels: torch.Tensor) -> None:
        """Build the role's view of the batch from ``self.recorder`` and give it the adversary."""

    @abstractmethod
    def evaluate(self, pl_module, datamodule) -> dict:
        """The attack's metrics after training (``performance`` among them)."""

    @abstractmethod
    def attack_baseline(self, num_classes: int) -> float:
        """AP*: the value of ``performance`` for an attacker that learns nothing."""

    def config(self) -> dict:
        """Role, assumptions and parameters, for ``attack/<name>/config``."""
        return {"role": self.role, "assumptions": self.assumptions}

    # ------------------------------------------------------------------ results
    def main_metric(self) -> float | None:
        """The run's main-task accuracy: ``test/acc``, else ``val/acc``."""
        metrics = self._trainer.callback_metrics if self._trainer is not None else {}
        for key in ("test/acc", "val/acc"):
            if key in metrics:
                return float(metrics[key])
        return None

    def dcs(self, num_classes: int) -> float | None:
        """VFLAIR's DCS (β = 0.5) of this run: MP* is ``reference_metric`` when given (the same
        protocol's accuracy without defense), else this run's own accuracy when it deploys no
        defense; None when neither is known (the privacy report fills it in across runs)."""
        performance = self.metrics.get("performance")
        main = self.main_metric()
        reference = self.reference_metric
        if reference is None and not self._defended:
            reference = main
        if performance is None or main is None or reference is None:
            return None
        return defense_capability_score(
            attack_performance=performance,
            attack_baseline=self.attack_baseline(num_classes),
            main_performance=main,
            main_reference=reference,
        )

    def results(self) -> dict:
        prefix = f"attack/{self.name}"
        num_classes = int(self.metrics.get("num_classes", 2))
        out = {
            f"{prefix}/{key}": value for key, value in self.metrics.items() if key != "num_classes"
        }
        out[f"{prefix}/config"] = self.config()
        out[f"{prefix}/headline"] = {
            "metric": self.headline,
            "label": self.headline_label or f"{self.name} {self.headline}",
        }
        out[f"{prefix}/baseline"] = self.attack_baseline(num_classes)
        out[f"{prefix}/dcs"] = self.dcs(num_classes)
        return out
