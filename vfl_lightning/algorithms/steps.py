"""The protocol's optimizer steps: every party's cut-layer backward in one autograd pass, the
party optimizers' foreach steps, and the server's backward and step (Lightning's route, or the
plain one when nothing would observe the difference)."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch
from torch import nn

from vfl_lightning.algorithms.party_updates import PartyOptimization
from vfl_lightning.optim import step_together, zero_together


class ProtocolSteps(L.LightningModule):
    """Optimizers and steps of :class:`~vfl_lightning.algorithms.base.VFLModule` (its state:
    ``parties``, ``grouped_parties``, ``head``, ``server_party``, ``rows``, the optimizer
    factories, set in its ``__init__``).

    Conventions: manual optimization with one optimizer per party plus one for the server head;
    ``global_step`` counts *server updates*: only the server optimizer steps through Lightning's
    wrapper, party optimizers step the wrapped torch optimizer directly.
    """

    # ----------------------------------------------------------------- optimizers
    def configure_optimizers(self):
        party_opts = [self.optimizer_factory(p.parameters()) for p in self.parties]
        return [*party_opts, self.server_optimizer_factory(self.server_parameters())]

    def server_parameters(self) -> list[nn.Parameter]:
        """What the server optimizer steps: the head, and the server's own party model if any."""
        own = [] if self.server_party is None else list(self.server_party.parameters())
        return [*self.head.parameters(), *own]

    def split_optimizers(self):
        """(party optimizers, server optimizer), all as Lightning wrappers."""
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        return opts[:-1], opts[-1]

    def backward_parties(
        self, embeddings: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor | None]
    ) -> None:
        """Every party's cut-layer backward, ``h_m.backward(gradient=g_m)``, in one engine call.

        The surrogate sum_m <h_m, g_m> (g_m constant) has gradient J_m^T g_m for party m's
        parameters, exactly what M separate ``manual_backward(h_m, gradient=g_m)`` calls compute
        (d<h, g>/dh = g bit for bit), at the cost of one autograd pass instead of M. Parties whose
        gradient is ``None`` are skipped. The gradient g_m arrived over the wire as plain values,
        so this pass is plain autograd: no loss scaling applies to it (see ``check_precision``).
        Data-parallel ranks each hold their rows' part of the party gradients; they are summed
        across ranks here, before any party optimizer steps.
        """
        stacked, views = self._last_grouped
        if (
            len(embeddings) == len(views)
            and all(h is v for h, v in zip(embeddings, views, strict=True))
            and all(g is not None for g in gradients)
        ):
            # grouped parties: one backward from the stacked (M, B, P) output, the same
            # gradient stack(g_m) reaches it as through the M views
            self._last_grouped = (None, ())
            torch.autograd.backward(stacked, grad_tensors=torch.stack(list(gradients)))
            self._sum_party_gradients()
            return
        terms = [(h * g).sum() for h, g in zip(embeddings, gradients, strict=True) if g is not None]
        if terms:
            torch.autograd.backward(torch.stack(terms).sum())
            self._sum_party_gradients()

    def _sum_party_gradients(self) -> None:
        """Data-parallel: sum the party gradients across ranks (the grouped parties' stacked
        gradients handed to the parties first, see :class:`GroupedParties`)."""
        if not self.rows.parallel:
            return
        if self.grouped_parties is not None:
            self.grouped_parties.distribute_gradients()
        self.rows.sum_gradients(self.parties.parameters())

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

    def zero_party_gradients(self, optimizers) -> None:
        """``zero_grad()`` of the party ``optimizers`` (gradients set to None), and of the grouped
        parties' stacked gradients."""
        zero_together([opt.optimizer for opt in optimizers])
        if self.grouped_parties is not None:
            self.grouped_parties.zero_grad()

    @staticmethod
    def step_party(optimizer) -> None:
        """Step a party optimizer without advancing ``global_step`` (see module docstring); a
        plain SGD one as a foreach update (:func:`step_together`, the same values)."""
        if not step_together([optimizer.optimizer]):
            optimizer.optimizer.step()

    def party_optimization(self, optimizers) -> PartyOptimization:
        """How the local parties zero, back-propagate and step all at once (party updates,
        :mod:`~vfl_lightning.algorithms.party_updates`), with the Lightning-wrapped party
        ``optimizers``."""
        return PartyOptimization(
            zero=lambda: self.zero_party_gradients(optimizers),
            backward=self.backward_parties,
            step=lambda: self.step_parties(optimizers),
        )

    def step_parties(self, optimizers) -> None:
        """Step every party optimizer in ``optimizers`` (without advancing ``global_step``).
        Grouped parties with plain SGD optimizers of one set of hyperparameters: one foreach
        update of the stacked parameters (:meth:`GroupedParties.step`); otherwise the stacked
        gradients go to the parties, then one foreach update over every party's parameters
        (:func:`~vfl_lightning.optim.step_together`) or one step per party."""
        plain = [opt.optimizer for opt in optimizers]
        grouped = self.grouped_parties
        if grouped is not None:
            if grouped.step(plain):
                return
            grouped.distribute_gradients()
        if not step_together(plain):
            for opt in optimizers:
                self.step_party(opt)
