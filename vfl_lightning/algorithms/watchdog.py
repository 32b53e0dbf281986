"""The non-finite watchdog: each step's loss kept with its round (no host sync), checked every
``log_every_n_steps`` server updates and before every checkpoint; a NonFiniteLoss names the round."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L
import torch

from vfl_lightning.errors import NonFiniteLoss, PartyRefusal


class NonFiniteWatch(L.LightningModule):
    """Non-finite checks of :class:`~vfl_lightning.algorithms.base.VFLModule` (its state:
    ``wire`` and the unchecked losses, set in its ``__init__``)."""

    # ----------------------------------------------------------------- non-finite values
    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """Log the epoch metrics after the epoch's last batch; keep each step's loss with its
        round (no tensor operation, no host sync per step) and check them every
        ``log_every_n_steps`` server updates (and, with the parameters, before every
        checkpoint)."""
        trainer = self.trainer
        if trainer.is_last_batch:
            self.log_epoch_metrics()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._unchecked_losses.append((loss.detach(), self.wire.ledger.rounds - 1))
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self.check_finite(parameters=False)

    @contextmanager
    def answering_parties(self, loss: torch.Tensor) -> Iterator[None]:
        """The server sends the parties what it computed from ``loss``: a party's refusal of it
        after the server's own loss of this round went non-finite is the server's divergence,
        raised as :class:`NonFiniteLoss` naming the round (the refusal chained). The loss is
        looked at only when a party refused (no host sync otherwise)."""
        try:
            yield
        except PartyRefusal:
            if not bool(torch.isfinite(loss.detach()).all()):
                self._unchecked_losses.append((loss.detach(), self.wire.ledger.rounds))
                self.check_finite(parameters=False)
            raise

    def first_bad_round(self) -> int | None:
        """The first round whose training loss was non-finite (checking the losses kept since
        the last check, one host sync), or None."""
        if self._first_bad_round is None and self._unchecked_losses:
            values = torch.cat([loss.reshape(-1) for loss, _ in self._unchecked_losses])
            bad = ~torch.isfinite(values)
            if bool(bad.any()):
                ends = list(
                    itertools.accumulate(loss.numel() for loss, _ in self._unchecked_losses)
                )
                entry = bisect.bisect_right(ends, int(bad.nonzero()[0, 0]))
                self._first_bad_round = self._unchecked_losses[entry][1]
            self._unchecked_losses.clear()
        return self._first_bad_round

    def check_finite(self, parameters: bool = True) -> None:
        """Raise :class:`NonFiniteLoss` naming the round if a loss or (``parameters``) a model
        parameter is non-finite. The periodic check during training looks at the losses only (a
        non-finite parameter makes the next loss non-finite); checkpoints and the end of training
        check the parameters too."""
        bad_round = self.first_bad_round()
        what = "the training loss"
        if bad_round is None:
            if not parameters:
                return
            finite = torch.stack([torch.isfinite(p).all() for p in self.parameters()]).all()
            if bool(finite):
                return
            bad_round, what = self.wire.ledger.rounds - 1, "a model parameter"
        raise NonFiniteLoss(
            f"training stopped: {what} became non-finite at round {bad_round}; the likely cause "
            f"is a learning rate{self._learning_rates()} too large for this model; "
            f"{self._kept_checkpoint()}"
        )

    def _learning_rates(self) -> str:
        """The configured learning rates named by their keys: the parties' ``optimizer.lr`` and,
        where it differs, the server's ``algo.server_lr``."""
        party = getattr(getattr(self, "optimizer_factory", None), "keywords", {}).get("lr")
        server = getattr(getattr(self, "server_optimizer_factory", None), "keywords", {}).get("lr")
        named = [] if party is None else [f"optimizer.lr={party:g}"]
        if server is not None and server != party:
            named.append(f"algo.server_lr={server:g}")
        return f" ({', '.join(named)})" if named else ""

    def _kept_checkpoint(self) -> str:
        """What a failed run leaves to resume from: the last checkpoint written before the
        failure, the checkpoint the run resumed from, or none."""
        if self._trainer is None:
            return "no checkpoint was written"
        written = [c.last_model_path for c in self.trainer.checkpoint_callbacks]
        written = [path for path in written if path]
        if written:
            return f"the last checkpoint written before it is kept ({written[-1]})"
        if self.trainer.ckpt_path:
            return (
                f"no checkpoint was written since the one resumed from ({self.trainer.ckpt_path})"
            )
        return "no checkpoint was written before it"
