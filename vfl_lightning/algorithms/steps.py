"""The server's optimizer and steps (Lightning's route, or the plain one when nothing would observe
the difference); the party optimizers come from the party side, which steps them."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

from vfl_lightning.optim import step_together, zero_together


class ProtocolSteps(L.LightningModule):
    """The server's optimizer and steps of :class:`~vfl_lightning.algorithms.base.VFLModule`
    (its state: ``party_side``, ``head``, ``server_party``, ``rows``, the optimizer factories,
    set in its ``__init__``).

    Conventions: manual optimization with one optimizer per party plus one for the server head;
    ``global_step`` counts *server updates*: only the server optimizer steps through Lightning's
    wrapper, the party side steps the party optimizers' torch optimizers directly.
    """

    # ----------------------------------------------------------------- optimizers
    def configure_optimizers(self):
        """The party side's optimizers (the local parties'; none for parties that keep their
        own), then the server's: the trainer checkpoints them all."""
        party_opts = self.party_side.make_optimizers(self.optimizer_factory)
        return [*party_opts, self.server_optimizer_factory(self.server_parameters())]

    def server_parameters(self) -> list[nn.Parameter]:
        """What the server optimizer steps: the head, and the server's own party model if any."""
        own = [] if self.server_party is None else list(self.server_party.parameters())
        return [*self.head.parameters(), *own]

    def server_optimizer(self):
        """The server's optimizer, as Lightning's wrapper (the last one configured)."""
        opts = self.optimizers()
        return opts[-1] if isinstance(opts, list) else opts

    SERVER_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
    """The Lightning hooks that run around the server's backward and optimizer step."""

    def plain_server_steps(self) -> bool:
        """Whether the server's backward and step can skip Lightning's dispatch (decided once per
        fit, in :meth:`on_fit_start`).

        ``manual_backward`` and ``LightningOptimizer.step`` route through the strategy and the
        precision plugin and dispatch the hooks of :attr:`SERVER_HOOKS` to every callback, about
        0.25 ms per server update, as much as a small model's whole step. On one device with
        32-bit precision, no profiler, and no callback or module overriding those hooks, that
        route does exactly ``loss.backward()`` and ``optimizer.step()``, so
        :meth:`server_backward` and :meth:`step_server` do just that (``global_step`` counted as
        Lightning counts it). Anything else takes Lightning's route.
        """
        from lightning.pytorch.plugins.precision import Precision
        from lightning.pytorch.profilers import PassThroughProfiler
        from lightning.pytorch.strategies import SingleDeviceStrategy
        from lightning.pytorch.utilities.model_helpers import is_overridden

        trainer = self.trainer
        module_hooks = any(
            getattr(type(self), hook) is not getattr(ProtocolSteps, hook)
            for hook in self.SERVER_HOOKS
        )
        callback_hooks = any(
            is_overridden(hook, callback, parent=L.Callback)
            for callback in trainer.callbacks
            for hook in self.SERVER_HOOKS
        )
        return (
            type(trainer.strategy) is SingleDeviceStrategy
            and type(trainer.precision_plugin) is Precision
            and isinstance(trainer.profiler, PassThroughProfiler)
            and not self.rows.parallel
            and not module_hooks
            and not callback_hooks
        )

    def on_fit_start(self) -> None:
        self._plain_server_steps = self.plain_server_steps()

    def server_backward(self, loss: torch.Tensor) -> None:
        """The server's backward of ``loss``: ``manual_backward`` (see :meth:`plain_server_steps`)."""
        if self._plain_server_steps:
            loss.backward()
        else:
            self.manual_backward(loss)

    def zero_server(self, optimizer) -> None:
        """``zero_grad()`` of the Lightning-wrapped server ``optimizer`` (gradients set to None,
        as torch does by default), without the optimizer's dispatch on the plain route (see
        :meth:`plain_server_steps`)."""
        if self._plain_server_steps:
            zero_together([optimizer.optimizer])
        else:
            optimizer.zero_grad()

    def step_server(self, optimizer) -> None:
        """One server update with the Lightning-wrapped ``optimizer``; advances ``global_step``
        (see :meth:`plain_server_steps`). On the plain route a plain SGD optimizer steps as one
        foreach update (:func:`~vfl_lightning.optim.step_together`, the same
        values as its own ``step``)."""
        if not self._plain_server_steps:
            optimizer.step()
            return
        # the progress counting Lightning's manual-optimization loop injects around every step
        optimizer._on_before_step()
        if not step_together([optimizer.optimizer]):
            optimizer.optimizer.step()
        optimizer._on_after_step()

    def on_before_optimizer_step(self, optimizer) -> None:
        """Only the server optimizer steps through Lightning (module docstring), so this runs
        before every server update: data-parallel ranks take rank 0's server gradient."""
        if self.rows.parallel:
            self.rows.broadcast_gradients(self.server_parameters())
