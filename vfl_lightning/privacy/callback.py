"""Lightning callback that runs the privacy accountant during training (algo=pbm, algo=ldp).

Logs privacy/feature_eps, privacy/sample_eps, the optimal α and the evaluation releases'
privacy/eval_feature_eps each epoch; saved in checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import lightning as L

from vfl_lightning.privacy.accountant import PrivacyAccountant
from vfl_lightning.privacy.analysis import DEFAULT_ORDERS

INFINITE_EPSILON = "inf"
"""How results.json writes an infinite ε (a clean release): strict JSON has no Infinity, and
``float("inf")`` reads it back."""


def json_epsilon(value: float) -> float | str:
    """``value`` for results.json: :data:`INFINITE_EPSILON` when it is infinite."""
    return INFINITE_EPSILON if value == math.inf else value


class PrivacyCallback(L.Callback):
    """Builds a :class:`PrivacyAccountant` for the module's mechanism at fit start, records every
    training batch as one release of its samples and every validation or test batch (sanity
    check included, when evaluation goes through the mechanism) as one evaluation release of its
    samples, and logs the spent ε at ``delta`` per epoch (evaluation ε apart, see
    :class:`PrivacyAccountant`).

    Its state travels in the checkpoint (Lightning stores callback ``state_dict``s), so a resumed
    run continues the count instead of restarting from zero; a checkpoint written for another
    mechanism, embedding width, dataset size, δ or order grid is refused.
    """

    def __init__(self, delta: float = 1e-5, orders: Sequence[float] | None = None) -> None:
        self.delta = float(delta)
        self.orders = tuple(orders) if orders is not None else DEFAULT_ORDERS
        self.accountant: PrivacyAccountant | None = None
        self._pending_state: dict | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.accountant is not None:
            return
        self.accountant = PrivacyAccountant(
            pl_module.mechanism,
            embedding_dim=pl_module.widths[0],
            num_samples=len(trainer.datamodule.splits["train"]),
            delta=self.delta,
            orders=self.orders,
        )
        if self._pending_state is not None:
            self.accountant.load_state_dict(self._pending_state)
            self._pending_state = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.accountant.record(int(batch[1].shape[0]))

    def _record_evaluation(self, trainer, pl_module, batch, split: str) -> None:
        if self.accountant is None:
            return
        indices = batch[2].detach().to("cpu").numpy()
        size = len(trainer.datamodule.splits[split])
        clean = not pl_module.mechanism.apply_at_eval
        self.accountant.record_evaluation(split, indices, size, clean=clean)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *_) -> None:
        self._record_evaluation(trainer, pl_module, batch, "val")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *_) -> None:
        self._record_evaluation(trainer, pl_module, batch, "test")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.accountant.end_epoch()
        spent = self.accountant.spent()
        pl_module.log_dict(
            {
                "privacy/feature_eps": spent["feature_eps"],
                "privacy/sample_eps": spent["sample_eps"],
                "privacy/alpha": spent["alpha"],
                "privacy/eval_feature_eps": spent["eval_feature_eps"],
            },
            on_step=False,
            on_epoch=True,
        )

    def results(self) -> dict:
        """Final privacy numbers for results.json."""
        if self.accountant is None:
            return {}
        spent = self.accountant.spent()
        return {
            "privacy/feature_eps": spent["feature_eps"],
            "privacy/sample_eps": spent["sample_eps"],
            "privacy/alpha": spent["alpha"],
            "privacy/sample_alpha": spent["sample_alpha"],
            "privacy/delta": self.delta,
            "privacy/uses_per_sample": self.accountant.uses,
            "privacy/eval_feature_eps": json_epsilon(spent["eval_feature_eps"]),
            "privacy/eval_sample_eps": json_epsilon(spent["eval_sample_eps"]),
            "privacy/eval_uses_per_sample": self.accountant.eval_uses,
        }

    def state_dict(self) -> dict:
        if self.accountant is None:
            return dict(self._pending_state or {})
        return self.accountant.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        if not state_dict:
            return
        if self.accountant is None:
            self._pending_state = dict(state_dict)
        else:
            self.accountant.load_state_dict(state_dict)
