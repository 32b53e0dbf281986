"""FedVS shares sealed for one client: ChaCha20-Poly1305 under a key only that pair of clients
holds (HKDF of their authenticated X25519 agreement,
:func:`~vfl_lightning.mechanisms.keys.pair_channel_key`). Whoever carries a sealed share (Ray's
actor calls, or the server relaying it under ``runtime=grpc``) reads nothing, and a share that
the named sender did not seal for this receiver, this call and this exchange is refused."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

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


class ShareSeal:
    """Client ``party``'s sealing: its channel key with every other client, and the count that
    makes each nonce unique (a fresh key every run, from a fresh X25519 key)."""

    def __init__(self, party: int) -> None:
        self.party = int(party)
        self.channels: dict[int, ChaCha20Poly1305] = {}
        self.sealed = 0

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
        self.sealed += 1
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
        try:
            array = np.frombuffer(plain, dtype=np.dtype(sealed.dtype)).reshape(sealed.shape)
        except (TypeError, ValueError):
            raise refused from None
        return torch.from_numpy(array.copy())
