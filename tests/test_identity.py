"""Authenticated key agreement: identity keys made once with mode 0600, signed X25519 keys verified
against pinned identities; substituted, foreign-signed, replayed and unknown keys refused by name."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from vfl_lightning.mechanisms.identity import (
    IDENTITY_FILE,
    IdentityConfigError,
    KeyAuthenticationError,
    authenticated_pair_seeds,
    identity_public_bytes,
    known_parties_from_hex,
    load_or_create_identity,
    read_known_parties,
    sign_public_key,
    verify_public_key,
    write_known_parties,
)
from vfl_lightning.mechanisms.keys import fresh_private_key, party_pair_seeds, public_bytes

RUN = "run-7f3a"
PARTIES = 3


@pytest.fixture
def federation(tmp_path):
    """Three parties with identity keys in their own dirs, fresh X25519 keys, signed publics, and
    the known-parties file every party reads."""
    identities = [load_or_create_identity(tmp_path / f"party_{m}") for m in range(PARTIES)]
    keys = [fresh_private_key() for _ in range(PARTIES)]
    signed = [
        sign_public_key(identities[m], run_id=RUN, party=m, public_key=public_bytes(keys[m]))
        for m in range(PARTIES)
    ]
    write_known_parties(
        tmp_path / "known_parties.json",
        {m: identity_public_bytes(identities[m]) for m in range(PARTIES)},
    )
    known = read_known_parties(tmp_path / "known_parties.json")
    return identities, keys, signed, known


def refused(call, *words: str) -> str:
    with pytest.raises(KeyAuthenticationError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def test_identity_is_made_once_with_owner_only_permissions(tmp_path):
    first = load_or_create_identity(tmp_path / "party_0")
    path = tmp_path / "party_0" / IDENTITY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_identity(tmp_path / "party_0")
    assert identity_public_bytes(again) == identity_public_bytes(first)
    other = load_or_create_identity(tmp_path / "party_1")
    assert identity_public_bytes(other) != identity_public_bytes(first)
    assert sorted(p.name for p in (tmp_path / "party_0").iterdir()) == [IDENTITY_FILE]


def test_a_readable_or_garbled_identity_file_is_refused(tmp_path):
    load_or_create_identity(tmp_path)
    path = tmp_path / IDENTITY_FILE
    os.chmod(path, 0o644)
    with pytest.raises(IdentityConfigError, match=r"mode 0644.*owner only.*chmod 600"):
        load_or_create_identity(tmp_path)
    os.chmod(path, 0o600)
    path.write_bytes(b"not a key")
    with pytest.raises(IdentityConfigError, match="is not a PEM private key"):
        load_or_create_identity(tmp_path)


def test_verified_keys_give_the_unauthenticated_pair_seeds(federation):
    _, keys, signed, known = federation
    publics = [public_bytes(k) for k in keys]
    for m in range(PARTIES):
        seeds = authenticated_pair_seeds(keys[m], m, signed, run_id=RUN, known=known)
        assert seeds == party_pair_seeds(keys[m], m, publics)
    for m in range(PARTIES):
        assert verify_public_key(signed[m], run_id=RUN, party=m, known=known) == publics[m]
    pair = authenticated_pair_seeds(keys[0], 0, signed, run_id=RUN, known=known)[(0, 2)]
    assert pair == authenticated_pair_seeds(keys[2], 2, signed, run_id=RUN, known=known)[(0, 2)]


def test_a_substituted_key_is_refused_naming_the_party(federation):
    _, keys, signed, known = federation
    server_key = public_bytes(fresh_private_key())
    relayed = list(signed)
    relayed[2] = dataclasses.replace(signed[2], public_key=server_key)
    refused(
        lambda: authenticated_pair_seeds(keys[0], 0, relayed, run_id=RUN, known=known),
        "party 2's public key fails its identity signature",
    )
    relayed = [dataclasses.replace(signed[0], public_key=server_key), signed[1], signed[2]]
    refused(
        lambda: authenticated_pair_seeds(keys[0], 0, relayed, run_id=RUN, known=known),
        "relayed as party 0's own",
    )


def test_a_key_signed_by_another_identity_is_refused(federation):
    identities, keys, signed, known = federation
    server_identity = Ed25519PrivateKey.generate()
    server_key = public_bytes(fresh_private_key())
    forged = sign_public_key(server_identity, run_id=RUN, party=1, public_key=server_key)
    refused(lambda: verify_public_key(forged, run_id=RUN, party=1, known=known), "party 1's")
    by_party_0 = sign_public_key(identities[0], run_id=RUN, party=1, public_key=server_key)
    relayed = [signed[0], by_party_0, signed[2]]
    refused(
        lambda: authenticated_pair_seeds(keys[2], 2, relayed, run_id=RUN, known=known),
        "party 1's public key fails",
    )


def test_a_replay_under_another_party_or_run_is_refused(federation):
    identities, _, signed, known = federation
    refused(
        lambda: verify_public_key(signed[1], run_id=RUN, party=2, known=known),
        "relayed as party 2's is signed for party 1",
    )
    relabelled = dataclasses.replace(signed[1], party=2)
    refused(lambda: verify_public_key(relabelled, run_id=RUN, party=2, known=known), "party 2's")
    # the index is inside the signed bytes: party 1's identity pinned for party 2 still refuses
    same_identity = {**known, 2: known[1]}
    refused(
        lambda: verify_public_key(relabelled, run_id=RUN, party=2, known=same_identity),
        "party 2's",
    )
    refused(
        lambda: verify_public_key(signed[1], run_id="another-run", party=1, known=known),
        "party 1's",
        "'another-run'",
    )


def test_an_unknown_party_is_refused(federation):
    identities, keys, signed, known = federation
    newcomer = Ed25519PrivateKey.generate()
    extra = sign_public_key(
        newcomer, run_id=RUN, party=3, public_key=public_bytes(fresh_private_key())
    )
    refused(
        lambda: authenticated_pair_seeds(keys[0], 0, [*signed, extra], run_id=RUN, known=known),
        "party 3 has no pinned identity key",
        "[0, 1, 2]",
    )


def test_pinned_identities_in_config_and_bad_entries(tmp_path, federation):
    identities, _, _, known = federation
    from_config = known_parties_from_hex({str(m): known[m].hex() for m in known})
    assert from_config == known
    for entries, words in (
        ({"0": "zz"}, "known party '0'"),
        ({"0": "ab" * 31}, "got 62 digits"),
        ({"-1": "ab" * 32}, "known party '-1'"),
        ({"x": "ab" * 32}, "known party 'x'"),
    ):
        with pytest.raises(IdentityConfigError, match=words):
            known_parties_from_hex(entries)
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(IdentityConfigError, match="not a known-parties file"):
        read_known_parties(tmp_path / "bad.json")
    with pytest.raises(IdentityConfigError, match="cannot be read"):
        read_known_parties(tmp_path / "missing.json")
