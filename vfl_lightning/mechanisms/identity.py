"""Authenticated key agreement: each party's long-term Ed25519 identity signs its X25519 public key
for one run and party index; peers verify against pinned identities before deriving pair seeds.

A party's identity key lives in its own directory (``identity_ed25519.pem``, mode 0600, made on
first use). The identities every party trusts are pinned out of band: a known-parties file
(:func:`write_known_parties`) or the run's config (:func:`known_parties_from_hex`). The server
relays :class:`SignedPublicKey` records; it cannot substitute a key without a party's identity key.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from vfl_lightning.errors import RunFailure
from vfl_lightning.mechanisms.keys import party_pair_seeds

IDENTITY_FILE = "identity_ed25519.pem"
KNOWN_PARTIES_FORMAT = "vfl_lightning known parties"
SIGNED_KEY_TAG = b"vfl_lightning x25519 public key v1\x00"


class KeyAuthenticationError(RunFailure):
    """A relayed public key failed authentication: the message names the party (the run stops,
    exit 1)."""


class IdentityConfigError(ValueError):
    """An identity key file or a pinned-identities list that cannot be used (names the file or
    the entry and what is allowed)."""


@dataclass(frozen=True)
class SignedPublicKey:
    """What a party publishes for one run: its index, its X25519 public key (32 bytes) and its
    Ed25519 signature over :func:`signed_message` (64 bytes). Picklable; the server relays it."""

    party: int
    public_key: bytes
    signature: bytes


# ----------------------------------------------------------------------------- identity keys
def identity_public_bytes(identity: Ed25519PrivateKey) -> bytes:
    """The 32-byte raw Ed25519 public key that peers pin."""
    return identity.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def load_or_create_identity(party_dir: str | Path) -> Ed25519PrivateKey:
    """The identity key in ``party_dir``; made on first use (os.urandom via ``cryptography``),
    written with mode 0600. An existing file readable by group or others is refused."""
    party_dir = Path(party_dir)
    path = party_dir / IDENTITY_FILE
    if not path.exists():
        party_dir.mkdir(parents=True, exist_ok=True)
        _create_identity_file(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise IdentityConfigError(
            f"{path} has mode {mode:04o}; an identity key must be readable by its owner only "
            f"(chmod 600 {path})"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as error:
        raise IdentityConfigError(f"{path} is not a PEM private key: {error}") from error
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityConfigError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def _create_identity_file(path: Path) -> None:
    """Write a new key to a 0600 temporary file, then link it into place: a concurrent first use
    finds either no file or a complete one, and the first writer's key wins."""
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".identity-")
    try:
        with os.fdopen(handle, "wb") as stream:
            os.fchmod(stream.fileno(), 0o600)
            stream.write(pem)
            stream.flush()
            os.fsync(stream.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.unlink(temporary)


# ----------------------------------------------------------------------------- pinned identities
def known_parties_from_hex(entries: dict) -> dict[int, bytes]:
    """``{party index: 64 hex digits}`` (a config's or a known-parties file's) as raw keys."""
    pinned: dict[int, bytes] = {}
    for party, value in dict(entries).items():
        try:
            index = int(party)
            key = bytes.fromhex(str(value))
        except ValueError as error:
            raise IdentityConfigError(
                f"known party {party!r}: needs an integer index >= 0 and 64 hex digits, "
                f"got {value!r}"
            ) from error
        if index < 0 or len(key) != 32:
            raise IdentityConfigError(
                f"known party {party!r}: needs an integer index >= 0 and 64 hex digits "
                f"(a raw Ed25519 public key), got {len(key) * 2} digits"
            )
        pinned[index] = key
    return pinned


def write_known_parties(path: str | Path, identities: dict[int, bytes]) -> None:
    """Pin ``identities`` (party index -> raw Ed25519 public key) in a JSON file."""
    entries = {str(m): identities[m].hex() for m in sorted(identities)}
    document = {"format": KNOWN_PARTIES_FORMAT, "version": 1, "parties": entries}
    Path(path).write_text(json.dumps(document, indent=2) + "\n")


def read_known_parties(path: str | Path) -> dict[int, bytes]:
    """The identities pinned in ``path`` (written by :func:`write_known_parties`)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise IdentityConfigError(f"known-parties file {path} cannot be read: {error}") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise IdentityConfigError(f"known-parties file {path} is not JSON: {error}") from error
    if not isinstance(document, dict) or document.get("format") != KNOWN_PARTIES_FORMAT:
        raise IdentityConfigError(
            f"{path} is not a known-parties file (format is not {KNOWN_PARTIES_FORMAT!r})"
        )
    if document.get("version") != 1 or not isinstance(document.get("parties"), dict):
        raise IdentityConfigError(f"{path}: needs version 1 and a 'parties' mapping")
    return known_parties_from_hex(document["parties"])


# ----------------------------------------------------------------------------- signing
def signed_message(run_id: str, party: int, public_key: bytes) -> bytes:
    """The bytes a party signs: a domain tag, the run id (length-prefixed), the party index and
    the X25519 public key. A signature is valid for that run and that index only."""
    run = run_id.encode()
    return (
        SIGNED_KEY_TAG + struct.pack(">I", len(run)) + run + struct.pack(">I", party) + public_key
    )


def sign_public_key(
    identity: Ed25519PrivateKey, *, run_id: str, party: int, public_key: bytes
) -> SignedPublicKey:
    """Party ``party``'s signed X25519 public key for run ``run_id``."""
    if len(public_key) != 32:
        raise ValueError(f"an X25519 public key has 32 bytes, got {len(public_key)}")
    signature = identity.sign(signed_message(run_id, party, public_key))
    return SignedPublicKey(party=int(party), public_key=bytes(public_key), signature=signature)


def verify_public_key(
    signed: SignedPublicKey, *, run_id: str, party: int, known: dict[int, bytes]
) -> bytes:
    """The X25519 public key of party ``party``, after its signature verified against the
    identity pinned for ``party``; otherwise one :class:`KeyAuthenticationError` naming it."""
    if party not in known:
        raise KeyAuthenticationError(
            f"party {party} has no pinned identity key (known parties: {sorted(known)}); "
            "its public key is refused"
        )
    if signed.party != party:
        raise KeyAuthenticationError(
            f"the public key relayed as party {party}'s is signed for party {signed.party}: refused"
        )
    try:
        identity = Ed25519PublicKey.from_public_bytes(known[party])
        identity.verify(signed.signature, signed_message(run_id, party, signed.public_key))
    except (InvalidSignature, ValueError) as error:
        raise KeyAuthenticationError(
            f"party {party}'s public key fails its identity signature for run {run_id!r}: it was "
            "substituted, replayed or signed by another key; the run stops"
        ) from error
    return signed.public_key


def authenticated_pair_seeds(
    own: X25519PrivateKey,
    party: int,
    relayed: list[SignedPublicKey],
    *,
    run_id: str,
    known: dict[int, bytes],
) -> dict[tuple[int, int], int]:
    """Party ``party``'s pair seeds (:func:`~vfl_lightning.mechanisms.keys.party_pair_seeds`), from
    ``relayed`` (entry m: party m's signed key, as the server passed them on) once every peer's
    signature verified. Its own entry must carry its own key."""
    publics = []
    for index, signed in enumerate(relayed):
        if index == party:
            own_public = own.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
            if signed.public_key != own_public:
                raise KeyAuthenticationError(
                    f"the key relayed as party {party}'s own is not the one it published: refused"
                )
            publics.append(own_public)
        else:
            publics.append(verify_public_key(signed, run_id=run_id, party=index, known=known))
    return party_pair_seeds(own, party, publics)
