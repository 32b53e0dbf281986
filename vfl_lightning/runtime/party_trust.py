"""What a party actor trusts: where its stream seeds come from, its own directory (identity key,
pinned peers), and the authenticated key agreement it runs before deriving any pair seed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vfl_lightning.algorithms.parties import PARTY_SEEDS
from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms.identity import (
    IdentityConfigError,
    KeyAuthenticationError,
    SignedPublicKey,
    authenticated_pair_seeds,
    identity_public_bytes,
    known_parties_from_hex,
    load_or_create_identity,
    read_known_parties,
    sign_public_key,
    write_known_parties,
)
from vfl_lightning.mechanisms.keys import fresh_private_key, public_bytes
from vfl_lightning.runtime.party_state import party_folder

KNOWN_PARTIES_FILE = "known_parties.json"


@dataclass(frozen=True)
class PartyTrust:
    """A run's trust settings, the same for every party actor (picklable).

    ``party_seeds``: ``private`` or ``derived`` (see :data:`PARTY_SEEDS`). ``party_dir``: the
    root of the parties' directories (party m's is ``party_dir/party_<m>``; an absolute path).
    ``known_parties``: the pinned Ed25519 identities ``{party: 64 hex digits}`` given in the
    config, or None: each party pins the identities it sees first in its own
    ``known_parties.json`` (trust on first use) and holds every later run to them.
    """

    party_seeds: str = "private"
    party_dir: str | None = None
    known_parties: dict | None = None

    def __post_init__(self) -> None:
        if self.party_seeds not in PARTY_SEEDS:
            raise ConfigError(
                f"runtime.party_seeds must be one of {PARTY_SEEDS}, got {self.party_seeds!r}"
            )
        if self.party_dir is None:
            raise ConfigError("runtime.party_dir must be a directory path, got null")
        if self.known_parties is not None:
            try:
                known_parties_from_hex(self.known_parties)
            except IdentityConfigError as error:
                raise ConfigError(f"runtime.known_parties: {error}") from error

    def folder(self, party: int) -> Path:
        return party_folder(self.party_dir, party)


class PartyKeys:
    """Party ``party``'s keys in its actor: a fresh X25519 key for this run, and its long-term
    Ed25519 identity (made on first use in its folder) that signs it."""

    def __init__(self, trust: PartyTrust, party: int) -> None:
        self.trust, self.party = trust, int(party)
        self.key = fresh_private_key()
        self.identity = load_or_create_identity(trust.folder(party))

    def publish(self, run_id: str) -> tuple[bytes, SignedPublicKey]:
        """(its identity public key, its X25519 public key signed for ``run_id``), for the server
        to relay to the other parties."""
        signed = sign_public_key(
            self.identity, run_id=run_id, party=self.party, public_key=public_bytes(self.key)
        )
        return identity_public_bytes(self.identity), signed

    def pinned(self, relayed_identities: list[bytes]) -> dict[int, bytes]:
        """The identities this party trusts: the config's, else its known-parties file's, else
        (first use, no file yet) the relayed ones, which it then writes to that file."""
        if self.trust.known_parties is not None:
            known = known_parties_from_hex(self.trust.known_parties)
        else:
            path = self.trust.folder(self.party) / KNOWN_PARTIES_FILE
            if not path.exists():
                write_known_parties(path, dict(enumerate(relayed_identities)))
            known = read_known_parties(path)
        own = identity_public_bytes(self.identity)
        if known.get(self.party) != own:
            raise KeyAuthenticationError(
                f"party {self.party}'s own identity key is not the one pinned for it: its "
                "known parties belong to another identity (fix runtime.known_parties or the "
                "party's known_parties.json)"
            )
        return known

    def pair_seeds(
        self, run_id: str, identities: list[bytes], relayed: list[SignedPublicKey]
    ) -> dict[tuple[int, int], int]:
        """Its pair seeds, once every peer's relayed key verified against the pinned identity
        (:func:`~vfl_lightning.mechanisms.identity.authenticated_pair_seeds`)."""
        known = self.pinned(identities)
        return authenticated_pair_seeds(self.key, self.party, relayed, run_id=run_id, known=known)
