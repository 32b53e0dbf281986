"""Synchronous first-order split training: algo=splitnn (concat) and algo=npq (sum), and every
protocol that only swaps the mechanism (pbm, ldp)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vfl_lightning.algorithms.base import VFLModule


class SyncVFL(VFLModule):
    """One communication round per batch.

    Parties compute h_m and send ``mechanism.encode(h_m)``; the server fuses what arrived, runs
    its head, back-propagates the loss to the fused input, and sends each party its gradient;
    each party finishes its backward with h_m.backward(gradient=g_m) (all parties in one autograd
    pass, see :meth:`VFLModule.backward_parties`); every optimizer steps.
    """

    def protocol_step(self, xs: Sequence[torch.Tensor], y: torch.Tensor):
        """One round; returns (loss, logits). Separate from logging so benchmarks can time it."""
        party_opts, server_opt = self.split_optimizers()
        embeddings = self.embed(xs)
        messages = self.mechanism.encode(
            [h.detach() for h in embeddings],
            generator=self.generator("train"),
            round=self.wire.ledger.rounds,
        )
        received = self.wire.uplink(messages, bits_per_element=self.mechanism.bits_per_element)
        fused = self.mechanism.fuse(received).requires_grad_()
        logits = self.head(fused)
        loss = self.loss_fn(logits, y)
        server_opt.zero_grad()
        self.manual_backward(loss)
        gradients = self.wire.downlink(self.mechanism.party_gradients(fused.grad, self.widths))
        for opt in party_opts:
            opt.zero_grad()
        self.backward_parties(embeddings, gradients)
        for opt in party_opts:
            self.step_party(opt)
        server_opt.step()
        self.wire.end_round()
        return loss, logits

    def training_step(self, batch, batch_idx):
        xs, y, _ = batch
        loss, logits = self.protocol_step(xs, y)
        self.log_train_step(loss, logits, y)
        return loss
