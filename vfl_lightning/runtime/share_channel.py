"""The FedVS clients' share channel under ``runtime=ray``: every share a client sends another is
sealed with ChaCha20-Poly1305 under a key only that pair of clients holds (HKDF of their
authenticated X25519 agreement, :func:`~vfl_lightning.mechanisms.keys.pair_channel_key`). An actor
handle the server puts in a client's peer list reads nothing it is sent, and a share that the
named sender did not seal for this receiver, this call and this exchange is refused."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from vfl_lightning.runtime.transport import serialized_bytes

SHARE_TAG = "vfl_lightning fedvs share v1"


@dataclass(frozen=True)
class SealedShare:
    """One share in transit: its shape and dtype (bound to the ciphertext), a nonce unique for
    the sender's key, and the ciphertext with its 16-byte tag."""

    shape: tuple[int, ...]
    dtype: str
    nonce: bytes
    ciphertext: bytes


def associated_data(method: str, head: tuple, sender: int, receiver: int, shape, dtype) -> bytes:
    """What a seal binds besides the share: the receiving call, its exchange (or stage), both
    clients and the share's shape and dtype."""
    return repr((SHARE_TAG, method, head, sender, receiver, tuple(shape), str(dtype))).encode()


class Mailbox:
    """A FedVS client's share traffic: its peers' actor handles, its channel key with every other
    client, and the condition its inboxes are kept under. An attribute of the actor, so none of
    this is a call the server can make."""

    def __init__(self, party: int) -> None:
        self.party = int(party)
        self.peers: list = []
        self.channels: dict[int, ChaCha20Poly1305] = {}
        self.sealed = 0
        self._arrivals: asyncio.Condition | None = None

    def set_channel_keys(self, keys: dict[int, bytes]) -> None:
        """The 32-byte channel key shared with each other client (from the key agreement)."""
        self.channels = {int(n): ChaCha20Poly1305(key) for n, key in keys.items()}

    def _channel(self, other: int, role: str) -> ChaCha20Poly1305:
        channel = self.channels.get(int(other))
        if channel is None:
            raise PermissionError(
                f"client {self.party} holds no channel key with client {other}: it {role} no "
                "share before the authenticated key agreement"
            )
        return channel

    def seal(self, method: str, head: tuple, receiver: int, share: torch.Tensor) -> SealedShare:
        channel = self._channel(receiver, "sends")
        self.sealed += 1  # a fresh key every actor (a fresh X25519 key): the count never repeats
        nonce = self.party.to_bytes(4, "big") + self.sealed.to_bytes(8, "big")
        array = share.detach().to("cpu").contiguous().numpy()
        aad = associated_data(method, head, self.party, receiver, array.shape, array.dtype)
        ciphertext = channel.encrypt(nonce, array.tobytes(), aad)
        return SealedShare(tuple(array.shape), str(array.dtype), nonce, ciphertext)

    def open(self, method: str, head: tuple, sender: int, sealed) -> torch.Tensor:
        """The share ``sender`` sealed for this client, this call and ``head``; anything else
        raises :class:`PermissionError` naming the claimed sender."""
        channel = self._channel(sender, "accepts")
        refused = PermissionError(
            f"client {self.party} refuses a share claimed from client {sender} ({method} "
            f"{head}): it was not sealed by that client for this client and exchange"
        )
        if not isinstance(sealed, SealedShare):
            raise refused
        aad = associated_data(method, head, sender, self.party, sealed.shape, sealed.dtype)
        try:
            plain = channel.decrypt(sealed.nonce, sealed.ciphertext, aad)
        except InvalidTag:
            raise refused from None
        array = np.frombuffer(plain, dtype=np.dtype(sealed.dtype)).reshape(sealed.shape)
        return torch.from_numpy(array.copy())

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
