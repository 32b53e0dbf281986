"""The FedVS clients' share channel under ``runtime=ray``: every share a client sends another is
sealed with ChaCha20-Poly1305 under a key only that pair of clients holds (HKDF of their
authenticated X25519 agreement, :func:`~vfl_lightning.mechanisms.keys.pair_channel_key`). An actor
handle the server puts in a client's peer list reads nothing it is sent, and a share that the
named sender did not seal for this receiver, this call and this exchange is refused."""

from __future__ import annotations

import asyncio

import torch

from vfl_lightning.runtime.sealed_shares import SealedShare, ShareSeal
from vfl_lightning.runtime.transport import serialized_bytes

__all__ = ["Mailbox", "SealedShare"]


class Mailbox(ShareSeal):
    """A FedVS client's share traffic: its peers' actor handles, its channel key with every other
    client (:class:`~vfl_lightning.runtime.sealed_shares.ShareSeal`), and the condition its
    inboxes are kept under. An attribute of the actor, so none of this is a call the server can
    make."""

    def __init__(self, party: int) -> None:
        super().__init__(party)
        self.peers: list = []
        self._arrivals: asyncio.Condition | None = None

    def condition(self) -> asyncio.Condition:
        if self._arrivals is None:
            self._arrivals = asyncio.Condition()
        return self._arrivals

    def send(self, method: str, shares: torch.Tensor, *head) -> int:
        """Seal ``shares[n]`` for client n and send it, for every other n; returns the serialized
        bytes sent."""
        sent = 0
        for n, peer in enumerate(self.peers):
            if n == self.party:
                continue
            sealed = self.seal(method, head, n, shares[n])
            sent += serialized_bytes(sealed)
            getattr(peer, method).remote(*head, self.party, sealed)
        return sent

    async def receive(self, inbox: dict, method: str, head: tuple, sender: int, sealed) -> None:
        """Open a share that arrived and keep it in ``inbox``."""
        await self.keep(inbox, sender, self.open(method, head, sender, sealed))

    async def keep(self, inbox: dict, sender: int, share: torch.Tensor) -> None:
        async with self.condition():
            inbox[sender] = share
            self.condition().notify_all()

    async def wait_for(self, full) -> None:
        async with self.condition():
            await self.condition().wait_for(full)
