"""Synchronous first-order split training: algo=splitnn (concat) and algo=npq (sum), and every
protocol that only swaps the mechanism (pbm, ldp). Its exchange round is reused by FedBCD."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.mechanisms.pbm import PBM

PAPER_COST_ALGOS = ("pbm", "npq", "ldp")
"""PBM-VFL and its two baselines: their results also carry the paper's cost formula."""
PAPER_FLOAT_BITS = 32
"""PBM-VFL's F (bits of a float), also the width of this library's float32 embeddings."""


@dataclass
class ExchangeRound:
    """What one exchange left on each side: the server's ``fused`` input built from the messages
    that arrived (detached), and the ``gradients`` each party received; with the round's loss."""

    loss: torch.Tensor
    logits: torch.Tensor
    fused: torch.Tensor
    gradients: list[torch.Tensor]


class SyncVFL(VFLModule):
    """One communication round per batch.

    Parties compute h_m and send ``mechanism.encode(h_m)``; the server fuses what arrived (joined
    with its own fresh embedding when it is an active party), runs its head, back-propagates the
    loss to the fused input, and sends each party its gradient; each party finishes its backward
    with h_m.backward(gradient=g_m) (the local parties all in one autograd pass, see
    :meth:`~vfl_lightning.algorithms.local_parties.LocalParties.backward`); every optimizer steps.
    """

    SUPPORTS_ACTIVE_PARTY = True
    DATA_PARALLEL = True
    RUNTIMES = ("local", "ray", "grpc")
    RELEASE_CANARIES = True

    # ------------------------------------------------------------- the exchange, in pieces
    def send_embeddings(self, xs: Sequence[torch.Tensor], idx: torch.Tensor) -> list[torch.Tensor]:
        """Party side (``self.party_side``: wherever the parties run), then wire: the messages
        that arrived. Each party keeps its forward for :meth:`update_parties`."""
        messages = self.party_side.send(xs, idx, stage="train", round=self.wire.ledger.rounds)
        return self.wire.uplink(messages, bits_per_element=self.mechanism.bits_per_element)

    def server_loss(
        self, fused: torch.Tensor, xs: Sequence[torch.Tensor], y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Server side: (loss, logits) of the head on ``fused`` joined with its own embedding."""
        logits = self.head(self.server_fuse(fused, self.own_embedding(xs)))
        return self.loss_fn(logits, y), logits

    def send_gradients(self, fused_grad: torch.Tensor) -> list[torch.Tensor]:
        """Server, then wire: each party's gradient dL/dh_m (straight through the mechanism)."""
        return self.wire.downlink(self.mechanism.party_gradients(fused_grad, self.widths))

    def update_parties(self, gradients: Sequence[torch.Tensor]) -> None:
        """Party side: h_m.backward(gradient=g_m) for every party, then every party steps."""
        self.party_side.apply_gradients(gradients)

    def exchange_round(
        self, xs: Sequence[torch.Tensor], y: torch.Tensor, idx: torch.Tensor
    ) -> ExchangeRound:
        """One synchronous round: embeddings up, gradients down, every side steps once."""
        server_opt = self.server_optimizer()
        received = self.send_embeddings(xs, idx)
        fused = self.mechanism.fuse(received).requires_grad_()
        loss, logits = self.server_loss(fused, xs, y)
        self.zero_server(server_opt)
        self.server_backward(loss)
        gradients = self.send_gradients(fused.grad)
        with self.answering_parties(loss):
            self.update_parties(gradients)
        self.step_server(server_opt)
        self.wire.end_round()
        return ExchangeRound(loss, logits, fused.detach(), gradients)

    # ------------------------------------------------------------- the protocol
    def protocol_step(self, xs: Sequence[torch.Tensor], y: torch.Tensor, idx: torch.Tensor):
        """One round; returns (loss, logits). Separate from logging so benchmarks can time it."""
        exchanged = self.exchange_round(xs, y, idx)
        return exchanged.loss, exchanged.logits

    def training_step(self, batch, batch_idx):
        xs, y, idx = batch
        loss, logits = self.protocol_step(xs, y, idx)
        self.log_train_step(loss, logits, y)
        return loss

    # ------------------------------------------------------------- results
    def results(self) -> dict:
        out = super().results()
        if self.name in PAPER_COST_ALGOS:
            out["comm/paper_cost_bits"] = self.paper_cost_bits()
        return out

    def paper_cost_bits(self) -> float:
        """PBM-VFL's total cost T·B·M·P·(log(bM) + F) (§5, natural log, F = 32) of the messages
        this run sent: T·B·M·P is the number of embedding elements the ledger counted up; log(bM)
        is PBM's uplink width (b = ``mechanism.b``, M parties), F for the unquantized baselines
        (npq, ldp). The ledger itself counts ⌈log2(M·b+1)⌉ bits per PBM element."""
        mechanism = self.mechanism
        width = getattr(mechanism, "bits_per_element", None) or PAPER_FLOAT_BITS
        elements = self.wire.ledger.total_bits("up") / width
        if isinstance(mechanism, PBM):
            uplink = math.log(mechanism.b * mechanism.num_parties)
        else:
            uplink = PAPER_FLOAT_BITS
        return elements * (uplink + PAPER_FLOAT_BITS)
