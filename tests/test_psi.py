"""The ECDH-PSI (data/psi.py, data/alignment.py): exact intersections, refusals, and what crosses.

Every message is recorded as it crosses; the checks look for each id's bytes, its SHA-512 input
and its unblinded group element H(id) in every message, and for the server's transcript holding
only valid group elements that no unblinded id maps to.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from vfl_lightning.data.alignment import (
    PartyTable,
    align_tables,
    align_with_parties,
    local_exchange,
    simulate_holdings,
)
from vfl_lightning.data.psi import (
    DOMAIN,
    ELEMENT_BYTES,
    HEADER,
    STAGES,
    PsiError,
    PsiParty,
    hash_to_group,
    id_bytes,
    id_kind,
)

rbcl = pytest.importorskip("rbcl")


def split_stages(ids: np.ndarray) -> dict[str, np.ndarray]:
    third = len(ids) // 3
    return {"train": ids[:third], "val": ids[third : 2 * third], "test": ids[2 * third :]}


def random_ids(rng: np.random.Generator, universe: int, size: int) -> np.ndarray:
    return rng.choice(universe, size=size, replace=False).astype(np.int64)


class Recorder:
    """An exchange that keeps every message in both directions (what the server's wire saw)."""

    def __init__(self, parties: list[PsiParty]) -> None:
        self.inner = local_exchange(parties)
        self.down: list[bytes] = []
        self.up: list[bytes] = []

    def __call__(self, messages: list[bytes]) -> list[bytes]:
        replies = self.inner(messages)
        self.down += messages
        self.up += replies
        return replies


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_intersection_is_exact_against_set_computation(share: float) -> None:
    rng = np.random.default_rng(int(share * 100))
    holder = random_ids(rng, 10**9, 300)
    parties = []
    for _ in range(3):
        kept = holder[rng.random(len(holder)) < share] if share < 1 else holder
        extra = random_ids(rng, 10**9, 40) + 10**9  # ids the label holder does not hold
        own = np.concatenate([kept, extra])
        parties.append(own[rng.permutation(len(own))])
    expected = set(holder.tolist()).intersection(*(set(p.tolist()) for p in parties))
    stages = split_stages(holder)
    tables = [PartyTable(p, p.astype(np.float64)[:, None]) for p in parties]
    if not expected or not expected & set(stages["train"].tolist()):
        with pytest.raises(PsiError) as refused:
            align_tables(stages, tables)
        assert "\n" not in str(refused.value)
        return
    report, columns = align_tables(stages, tables)
    for stage in STAGES:
        aligned = stages[stage][report.aligned[stage]]
        assert set(aligned.tolist()) == expected & set(stages[stage].tolist())
        assert np.all(np.diff(report.aligned[stage]) > 0)  # the label holder's order
        for m in range(len(parties)):
            # each party's rows, in the agreed order, carry the same ids as the label holder's
            assert np.array_equal(columns[m][stage][:, 0], aligned.astype(np.float64))
    holder_set = set(holder.tolist())
    assert report.intersections == [len(holder_set & set(p.tolist())) for p in parties]
    assert report.aligned_rows == len(expected)


def test_each_party_learns_only_its_own_intersection() -> None:
    rng = np.random.default_rng(7)
    holder = random_ids(rng, 10**6, 200)
    ids = [np.concatenate([holder[:150], random_ids(rng, 10**6, 30) + 10**6]), holder[50:]]
    parties = [PsiParty(own, m) for m, own in enumerate(ids)]
    align_with_parties(split_stages(holder), local_exchange(parties), 2)
    for party, own in zip(parties, ids, strict=True):
        learned = set(own[party.order[party.matched]].tolist())
        assert learned == set(own.tolist()) & set(holder.tolist())
        assert party.intersection_size == len(learned)
        assert party.scalar is None  # dropped once aligned


def test_text_ids_align_and_mixed_id_columns_are_refused() -> None:
    holder = np.array([f"patient-{i}" for i in range(30)])
    party = np.array([f"patient-{i}" for i in range(5, 35)])
    report, columns = align_tables(
        split_stages(holder), [PartyTable(party, np.arange(30, dtype=np.float32)[:, None])]
    )
    assert report.aligned_rows == 25
    assert columns[0]["train"][:, 0].tolist() == [0, 1, 2, 3, 4]  # patient-5 .. patient-9
    with pytest.raises(PsiError, match="party 0's sample ids are integers, the label holder's are"):
        align_tables(split_stages(holder), [PartyTable(np.arange(30), np.zeros((30, 1)))])


def test_duplicate_ids_are_refused_in_one_line() -> None:
    with pytest.raises(PsiError, match="party 3's sample ids repeat 1 id") as refused:
        PsiParty(np.array([1, 2, 2, 4]), 3)
    assert "\n" not in str(refused.value)
    stages = {"train": np.array([1, 2]), "val": np.array([3]), "test": np.array([2])}
    with pytest.raises(PsiError, match="the label holder's sample ids repeat"):
        align_tables(stages, [PartyTable(np.arange(5), np.zeros((5, 1)))])


def test_empty_intersection_is_refused_in_one_line() -> None:
    stages = split_stages(np.arange(30))
    with pytest.raises(PsiError, match="found no sample id") as refused:
        align_tables(stages, [PartyTable(np.arange(100, 130), np.zeros((30, 1)))])
    assert "\n" not in str(refused.value)


def unblinded_forms(ids: np.ndarray) -> list[bytes]:
    """Everything an unblinded id could look like on the wire: its bytes, the hash input and
    digest, and its group element H(id)."""
    prefix = DOMAIN + bytes([id_kind(ids)])
    raw = id_bytes(ids)
    digests = [hashlib.sha512(prefix + r).digest() for r in raw]
    return raw + [prefix + r for r in raw] + digests + hash_to_group(ids)


def elements_of(message: bytes) -> list[bytes]:
    """The 32-byte group elements of a HELLO, REPLY or MATCH (after their counts)."""
    body, found = message[HEADER.size :], []
    at = 1 if message[7] == 2 else 0  # a HELLO starts with its id kind
    while at < len(body):
        count = int.from_bytes(body[at : at + 8], "little")
        at += 8
        found += [body[at + i : at + i + ELEMENT_BYTES] for i in range(0, count * 32, 32)]
        at += count * ELEMENT_BYTES
    return found


def test_no_id_crosses_unblinded_and_the_transcript_holds_only_blinded_elements() -> None:
    rng = np.random.default_rng(11)
    # 16-digit ids: their bytes cannot turn up by chance inside random group elements
    holder = random_ids(rng, 10**15, 120) + 10**15
    party_ids = [
        np.concatenate([holder[:80], random_ids(rng, 10**15, 20) + 3 * 10**15]) for _ in (0, 1)
    ]
    parties = [PsiParty(own, m) for m, own in enumerate(party_ids)]
    recorder = Recorder(parties)
    align_with_parties(split_stages(holder), recorder, len(parties))
    assert len(recorder.down) == len(recorder.up) == 3 * len(parties)
    secrets_ = unblinded_forms(holder) + [f for own in party_ids for f in unblinded_forms(own)]
    for message in recorder.down + recorder.up:
        for form in secrets_:
            assert form not in message
    unblinded = set(hash_to_group(holder)) | {h for own in party_ids for h in hash_to_group(own)}
    transcript = [
        e for message in recorder.up if message[7] in (2, 4) for e in elements_of(message)
    ]
    assert len(transcript) == sum(len(p) for p in party_ids) + len(parties) * len(holder)
    for element in transcript:
        assert rbcl.crypto_core_ristretto255_is_valid_point(element)
        assert element not in unblinded
    # the parties received the label holder's ids only blinded, too
    received = [e for message in recorder.down if message[7] == 3 for e in elements_of(message)]
    assert received and not set(received) & unblinded


def run_until_align(holder: np.ndarray, own: np.ndarray):
    """A party and the messages of one session, stopped before the ALIGN."""
    from vfl_lightning.data.psi import LabelHolderSession

    party = PsiParty(own, 0)
    session = LabelHolderSession(holder, hash_to_group(holder), 0)
    reply = session.reply(party.respond(session.start()))
    session.matches(party.respond(reply))
    return party, session, reply


def test_a_server_that_replays_or_crafts_messages_is_refused() -> None:
    holder, own = np.arange(40), np.arange(20, 60)
    party, session, reply = run_until_align(holder, own)
    with pytest.raises(PsiError, match="expects ALIGN now"):
        party.respond(reply)  # a replayed REPLY
    outside = np.flatnonzero(~np.isin(np.arange(len(own)), party.matched))[:1]
    crafted = {"train": outside, "val": outside[:0], "test": outside[:0]}
    with pytest.raises(PsiError, match="outside the intersection this party computed"):
        party.respond(session.align(crafted))
    twice = {"train": party.matched[:2].repeat(2), "val": outside[:0], "test": outside[:0]}
    with pytest.raises(PsiError, match="names one of its rows twice"):
        party.respond(session.align(twice))
    # another session's messages are refused, and a finished party answers nothing
    other, other_session, _ = run_until_align(holder, own)
    with pytest.raises(PsiError, match="another session"):
        other.respond(session.align({s: party.matched[:0] for s in STAGES}))
    other.respond(other_session.align({s: other.matched[:0] for s in STAGES}))
    with pytest.raises(PsiError, match="alignment is finished"):
        other.respond(other_session.start())
    # a fresh party refuses anything but a START, and an invalid group element
    fresh = PsiParty(own, 0)
    with pytest.raises(PsiError, match="expects START now"):
        fresh.respond(reply)
    from vfl_lightning.data.psi import REPLY, counted, encode

    fresh = PsiParty(own, 0)
    fresh_session = session.__class__(holder, hash_to_group(holder), 0)
    hello = fresh.respond(fresh_session.start())
    assert hello
    bogus = encode(
        REPLY, fresh_session.session, counted([b"\x00" * 32] * len(own)), counted([b"\xff" * 32])
    )
    with pytest.raises(PsiError, match="invalid group element"):
        fresh.respond(bogus)


def test_simulated_holdings_share_exactly_the_overlap() -> None:
    for overlap, parties in ((0.3, 3), (1.0, 2), (0.5, 1)):
        holdings = simulate_holdings(500, overlap, parties, seed=4)
        common = set(range(500)).intersection(*(set(h.tolist()) for h in holdings))
        assert len(common) == round(overlap * 500)
        for own in holdings:
            assert len(np.unique(own)) == len(own)
            assert not np.all(np.diff(own) > 0)  # each party's own shuffled order
        again = simulate_holdings(500, overlap, parties, seed=4)
        assert all(np.array_equal(a, b) for a, b in zip(holdings, again, strict=True))
    with pytest.raises(ValueError, match=r"data.overlap must be a number in \(0, 1\]"):
        simulate_holdings(10, 1.5, 2, seed=0)
    with pytest.raises(ValueError, match="leaves no row that every party holds"):
        simulate_holdings(10, 0.01, 2, seed=0)
