"""Pairwise mask seeds from X25519 key agreement: each party's key pair, and HKDF of a pair's
shared secret and the pair's ids into the 64-bit seed of its secure-aggregation mask stream."""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PAIR_SEED_INFO = b"vfl_lightning secure aggregation pair seed v1"
PAIR_CHANNEL_INFO = b"vfl_lightning pair channel key v1"


def seeded_private_key(seed: int, party: int) -> X25519PrivateKey:
    """Party ``party``'s X25519 key derived from the run's ``seed`` (the local runtime's keys: a
    simulation, whose keys anyone with the seed can recompute)."""
    material = hashlib.sha256(f"vfl_lightning x25519 {int(seed)} {int(party)}".encode()).digest()
    return X25519PrivateKey.from_private_bytes(material)


def fresh_private_key() -> X25519PrivateKey:
    """A party's X25519 key from the operating system's randomness (the Ray runtime's keys)."""
    return X25519PrivateKey.generate()


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32-byte raw public key a party publishes (relayed to the other parties by the server)."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _pair_secret(
    own: X25519PrivateKey, other_public: bytes, first: int, second: int, info: bytes, length: int
) -> bytes:
    """HKDF-SHA256 of the X25519 shared secret of pair (``first`` < ``second``), ``length``
    bytes, with ``info`` and the pair's ids in the info string."""
    if not 0 <= first < second:
        raise ValueError(f"a pair is two party ids 0 <= first < second, got ({first}, {second})")
    shared = own.exchange(X25519PublicKey.from_public_bytes(other_public))
    return HKDF(
        algorithm=hashes.SHA256(),
        length=length,
        salt=None,
        info=info + f" {first} {second}".encode(),
    ).derive(shared)


def pair_seed(own: X25519PrivateKey, other_public: bytes, first: int, second: int) -> int:
    """The 64-bit seed of pair (``first`` < ``second``): HKDF-SHA256 of the X25519 shared secret,
    with the pair's ids in the info string. Both members compute the same seed; the server, which
    saw only public keys, cannot."""
    derived = _pair_secret(own, other_public, first, second, PAIR_SEED_INFO, 8)
    return int.from_bytes(derived, "little")


def pair_channel_key(own: X25519PrivateKey, other_public: bytes, first: int, second: int) -> bytes:
    """The 32-byte key of pair (``first`` < ``second``)'s private channel (FedVS shares under
    ``runtime=ray``): the same key agreement as :func:`pair_seed`, another HKDF info string."""
    return _pair_secret(own, other_public, first, second, PAIR_CHANNEL_INFO, 32)


def party_pair_seeds(
    own: X25519PrivateKey, party: int, public_keys: list[bytes]
) -> dict[tuple[int, int], int]:
    """Every seed party ``party`` holds: one per other party, keyed by the pair (low id, high id)."""
    seeds = {}
    for other, public in enumerate(public_keys):
        if other != party:
            pair = (min(party, other), max(party, other))
            seeds[pair] = pair_seed(own, public, *pair)
    return seeds


def seeded_pair_seeds(num_parties: int, seed: int) -> dict[tuple[int, int], int]:
    """All pair seeds of a local run: the same key agreement, with keys from the run's ``seed``."""
    keys = [seeded_private_key(seed, m) for m in range(num_parties)]
    publics = [public_bytes(k) for k in keys]
    seeds: dict[tuple[int, int], int] = {}
    for m, key in enumerate(keys):
        for pair, value in party_pair_seeds(key, m, publics).items():
            if pair[0] == m:
                seeds[pair] = value
    return seeds
