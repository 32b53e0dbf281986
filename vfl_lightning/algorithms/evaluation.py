"""Evaluation of a protocol: every party's release of the stage's stream, the deployed logits'
loss and metrics, ``acc_clean`` when evaluation is perturbed, and generators restarted per epoch."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch

from vfl_lightning.mechanisms.base import fuse_tensors

EVAL_STAGES = ("val", "test")


class Evaluation(L.LightningModule):
    """Validation and test of :class:`~vfl_lightning.algorithms.base.VFLModule` (its state:
    ``mechanism``, ``party_side``, ``head``, the metrics and ``streams``, set in its ``__init__``)."""

    # ----------------------------------------------------------------- randomness
    def generator(self, stage: str) -> torch.Generator:
        """The server's seeded generator of ``stage`` on this module's device
        (:class:`~vfl_lightning.algorithms.parties.ServerStreams`: ``train`` continues across
        checkpoints, an evaluation stream starts afresh at every evaluation)."""
        return self.streams.get(stage, self.device)

    def _start_evaluation(self, stage: str) -> None:
        """Reset the stage's metrics; every generator of the stage (the module's, each party's)
        starts afresh for this evaluation's first release round."""
        self._eval_losses.clear()
        self._eval_clean = False
        for metrics in (getattr(self, f"{stage}_metrics"), self.clean_metrics[stage]):
            metrics.reset()
        stream = self.release_stream(stage)
        release = self.mechanism.begin_evaluation(stream, self.wire.ledger.rounds)
        self.streams.restart(stage, release)
        self.party_side.restart_stream(stage, release)

    def on_validation_epoch_start(self) -> None:
        self._start_evaluation("val")

    def on_test_epoch_start(self) -> None:
        self._start_evaluation("test")

    # ----------------------------------------------------------------- evaluation
    def release_stream(self, stage: str) -> str:
        """The mechanism's release stream of an evaluation ``stage``: the sanity check's
        validation batches get their own (``sanity``), so they never share masks with ``val``."""
        trainer = self._trainer
        if stage == "val" and trainer is not None and trainer.sanity_checking:
            return "sanity"
        return stage

    def server_input(
        self, xs: Sequence[torch.Tensor], stage: str, idx: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The head's input at evaluation: every party sends its release of the next round of
        the stage's stream (or its plain embedding without ``apply_at_eval``), the server fuses."""
        round = self.mechanism.next_release(self.release_stream(stage))
        messages = self.party_side.send(xs, idx, stage=stage, round=round)
        fused = self.mechanism.fuse_evaluation(messages, round)
        return self.server_fuse(fused, self.own_embedding(xs))

    def clean_server_input(self, xs: Sequence[torch.Tensor], stage: str) -> torch.Tensor | None:
        """The noise-free server input (the plain fusion of the clean embeddings, as the PBM
        authors' code evaluates) when evaluation is perturbed, else ``None``.

        Evaluation is perturbed when a noisy mechanism (PBM, LDP) applies at evaluation; its
        accuracy is then also logged as ``{stage}/acc_clean`` beside the deployed ``{stage}/acc``.
        No randomness is drawn, so the evaluation noise stream is unchanged. A server that holds
        no party model (``runtime=ray``: the parties hold theirs) never sees a clean embedding:
        ``None``, and ``acc_clean`` is not logged.
        """
        if not (self.mechanism.noisy and self.mechanism.apply_at_eval):
            return None
        clean = self.party_side.clean_embeddings(xs)
        if clean is None:
            return None
        fused = fuse_tensors(clean, self.mechanism.fusion)
        return self.server_fuse(fused, self.own_embedding(xs))

    def _eval_step(self, batch, stage: str) -> None:
        """One evaluation batch: the deployed logits' loss and metric updates (and the clean
        metrics' when evaluation is perturbed), kept for :meth:`log_evaluation`."""
        xs, y, idx = batch
        logits = self.head(self.server_input(xs, stage, idx))
        self._eval_losses.append((self.loss_fn(logits, y).detach(), int(y.shape[0])))
        getattr(self, f"{stage}_metrics").update(self.scores(logits), y)
        clean = self.clean_server_input(xs, stage)
        if clean is not None:
            self.clean_metrics[stage].update(self.scores(self.head(clean)), y)
            self._eval_clean = True

    def log_evaluation(self, stage: str) -> None:
        """Log the evaluation epoch once: ``{stage}/loss`` (the batch-size weighted mean of the
        batch losses, as ``self.log(..., on_epoch=True)`` of every batch would give), the
        ``{stage}/*`` metrics and, when evaluation was perturbed, ``{stage}/acc_clean``. One
        ``self.log`` per key per epoch rather than per batch (each costs a Lightning dispatch)."""
        if not self._eval_losses:
            return
        losses = torch.stack([loss.reshape(()) for loss, _ in self._eval_losses])
        sizes = torch.tensor([n for _, n in self._eval_losses], dtype=losses.dtype).to(losses)
        self._eval_losses.clear()
        val = stage == "val"
        self.log(f"{stage}/loss", (losses * sizes).sum() / sizes.sum(), prog_bar=val)
        metrics = getattr(self, f"{stage}_metrics")
        self.log_dict(metrics.compute(), prog_bar=val)
        metrics.reset()
        if self._eval_clean:
            self._eval_clean = False
            self.log_dict(self.clean_metrics[stage].compute())
            self.clean_metrics[stage].reset()

    def validation_step(self, batch, batch_idx) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self.log_evaluation("val")

    def test_step(self, batch, batch_idx) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self.log_evaluation("test")
