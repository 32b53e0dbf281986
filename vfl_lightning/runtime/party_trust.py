"""What a party actor trusts: where its stream seeds come from, its own directory (identity key,
pinned peers), and the authenticated key agreement it runs before deriving any pair seed."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
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
from vfl_lightning.mechanisms.keys import fresh_private_key, pair_channel_key, public_bytes
from vfl_lightning.runtime.party_state import default_party_root, party_folder

KNOWN_PARTIES_FILE = "known_parties.json"


@dataclass(frozen=True)
class PartyTrust:
    """A run's trust settings, the same for every party actor (picklable).

    ``party_seeds``: ``private`` or ``derived`` (see :data:`PARTY_SEEDS`). ``party_dir``: the
    root of the parties' directories (party m's is ``<root>/party_<m>``; an absolute path), or
    None: each party's own machine names it (:func:`default_party_root`, read in the party's
    process). ``known_parties``: the pinned Ed25519 identities ``{party: 64 hex digits}`` given in
    the config, or None: each party pins every identity it sees first for an index in its own
    ``known_parties.json`` (trust on first use) and holds every later run to it. ``run``: the
    run's key, the folder of its state files in each party's directory (fresh for every run; a
    resumed run takes its checkpoint's).
    """

    party_seeds: str = "private"
    party_dir: str | None = None
    known_parties: dict | None = None
    run: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        if self.party_seeds not in PARTY_SEEDS:
            raise ConfigError(
                f"runtime.party_seeds must be one of {PARTY_SEEDS}, got {self.party_seeds!r}"
            )
        if self.known_parties is not None:
            try:
                known_parties_from_hex(self.known_parties)
            except IdentityConfigError as error:
                raise ConfigError(f"runtime.known_parties: {error}") from error

    def root(self) -> Path:
        """The parties' root, as the calling process sees it (call it in the party's actor)."""
        return Path(self.party_dir) if self.party_dir is not None else default_party_root()

    def folder(self, party: int) -> Path:
        return party_folder(self.root(), party)


def check_agreement(guard, agreed: bool, relayed: list, num_parties: int) -> None:
    """Refuse, in the guard's one line, a key agreement its session already ran, or relayed keys
    that are not one per party of the run. Pair masks and channel keys are fixed for a session
    once agreed: a server cannot re-key a party mid-run (a new run or proposal is a new session,
    with a fresh key)."""
    if agreed:
        raise guard.refusal(
            "agree",
            "the key agreement runs once per session and this one has run: a second one would "
            "re-key its pair masks and channel keys mid-run (a new run starts a new session)",
        )
    if len(relayed) != num_parties:
        raise guard.refusal(
            "agree",
            f"the relayed keys are one per party of the run ({num_parties}), got {len(relayed)}",
        )


class PartyKeys:
    """Party ``party``'s keys in its actor: a fresh X25519 key for this run, and its long-term
    Ed25519 identity (made on first use in its folder) that signs it."""

    def __init__(self, trust: PartyTrust, party: int) -> None:
        self.trust, self.party = trust, int(party)
        self.key = fresh_private_key()
        self.identity = load_or_create_identity(trust.folder(party))
        self.channel_keys: dict[int, bytes] = {}
        """Its 32-byte channel key with each peer, once the key agreement verified them."""

    def publish(self, run_id: str) -> tuple[bytes, SignedPublicKey]:
        """(its identity public key, its X25519 public key signed for ``run_id``), for the server
        to relay to the other parties."""
        signed = sign_public_key(
            self.identity, run_id=run_id, party=self.party, public_key=public_bytes(self.key)
        )
        return identity_public_bytes(self.identity), signed

    def pinned(self, relayed_identities: list[bytes]) -> dict[int, bytes]:
        """The identities this party trusts: the config's, else its known-parties file's, to
        which it adds (trust on first use) the relayed identity of every index not pinned yet;
        an index already pinned keeps its identity."""
        if self.trust.known_parties is not None:
            known = known_parties_from_hex(self.trust.known_parties)
        else:
            path = self.trust.folder(self.party) / KNOWN_PARTIES_FILE
            known = read_known_parties(path) if path.exists() else {}
            first_seen = {m: key for m, key in enumerate(relayed_identities) if m not in known}
            if first_seen:
                write_known_parties(path, known | first_seen)
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
        (:func:`~vfl_lightning.mechanisms.identity.authenticated_pair_seeds`); its channel key
        with every peer goes to :attr:`channel_keys` (from the same verified keys)."""
        known = self.pinned(identities)
        seeds = authenticated_pair_seeds(self.key, self.party, relayed, run_id=run_id, known=known)
        self.channel_keys = {
            m: pair_channel_key(self.key, signed.public_key, *sorted((self.party, m)))
            for m, signed in enumerate(relayed)
            if m != self.party
        }
        return seeds
