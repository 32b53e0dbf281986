"""ECDH private set intersection on ristretto255, as byte messages any transport can carry.

Every id is hashed to the group (SHA-512, then libsodium's ``crypto_core_ristretto255_from_hash``)
and blinded by a secret scalar (``crypto_scalarmult_ristretto255``); the group arithmetic is
libsodium's, through the ``rbcl`` binding (the ``psi`` extra). Blinding commutes, so an id both
sides hold ends as the same doubly blinded element on both sides, and nothing else matches.

One session between the label holder (``LabelHolderSession``) and one party (``PsiParty``), three
request/reply exchanges, each side's scalar fresh for the session and never sent:

1. START (session id) -> HELLO: the party's ids blinded by its scalar b, in a fresh random order.
2. REPLY: those elements blinded again by the label holder's scalar a, in the same order, and the
   label holder's own ids blinded by a, in a fresh random order -> MATCH: the latter blinded by b.
   The party now knows which of its rows the label holder holds; the MATCH tells the label holder
   which of its rows the party holds, and where they are in the party's HELLO order.
3. ALIGN: per stage (train, val, test), the HELLO positions of the rows every party holds, in the
   label holder's order -> ALIGNED: the number of rows the party took per stage.

What each side learns, and what a label holder that crafts messages can learn, is written in
docs/threat_model.md ("Sample alignment").
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STAGES = ("train", "val", "test")
MAGIC = b"VFLPSI"
VERSION = 1
ELEMENT_BYTES = 32
SESSION_BYTES = 16
HEADER = struct.Struct("<6sBB16s")
COUNT = struct.Struct("<Q")
DOMAIN = b"vfl_lightning/psi/v1/ristretto255/sha512"

START, HELLO, REPLY, MATCH, ALIGN, ALIGNED = range(1, 7)
KIND_NAMES = {
    START: "START",
    HELLO: "HELLO",
    REPLY: "REPLY",
    MATCH: "MATCH",
    ALIGN: "ALIGN",
    ALIGNED: "ALIGNED",
}
INTEGER_IDS, TEXT_IDS = 0, 1
ID_KINDS = {INTEGER_IDS: "integers", TEXT_IDS: "strings"}


class PsiError(ValueError):
    """A refusal of the alignment: one line naming who refused, what and why."""


def group():
    """The rbcl binding of libsodium's ristretto255 functions, or one line saying how to get it."""
    try:
        import rbcl
    except ImportError as error:
        raise PsiError(
            "the sample alignment (PSI) needs the rbcl package (libsodium's ristretto255): "
            'pip install -c constraints.txt -e ".[psi]" (the dev install includes it)'
        ) from error
    return rbcl


# ----------------------------------------------------------------------------- ids
def id_kind(ids: np.ndarray) -> int:
    """:data:`INTEGER_IDS` for an integer column, :data:`TEXT_IDS` for a string column."""
    if ids.dtype.kind in "iu":
        return INTEGER_IDS
    if ids.dtype.kind == "U" or (ids.dtype.kind == "O" and all(isinstance(i, str) for i in ids)):
        return TEXT_IDS
    raise PsiError(f"sample ids must be integers or strings, got dtype {ids.dtype}")


def check_ids(ids, who: str) -> np.ndarray:
    """``ids`` as a 1-D array of distinct integers or strings; a repeated id is refused."""
    array = np.asarray(ids)
    if array.ndim != 1:
        raise PsiError(f"{who}'s sample ids must be one column, got shape {array.shape}")
    id_kind(array)
    values, counts = np.unique(array, return_counts=True)
    repeated = values[counts > 1]
    if len(repeated):
        raise PsiError(
            f"{who}'s sample ids repeat {len(repeated)} id(s) (e.g. {repeated[0]!r} appears "
            f"{int(counts[counts > 1][0])} times): every row needs its own id"
        )
    return array


def id_bytes(ids: np.ndarray) -> list[bytes]:
    """Each id as the bytes that are hashed: decimal digits for integers, UTF-8 for strings."""
    if id_kind(ids) == INTEGER_IDS:
        return [str(int(i)).encode() for i in ids.tolist()]
    return [str(i).encode("utf-8") for i in ids.tolist()]


def hash_to_group(ids: np.ndarray) -> list[bytes]:
    """H(id): SHA-512 of the domain, the id's kind and its bytes, mapped to ristretto255."""
    from_hash = group().crypto_core_ristretto255_from_hash
    prefix = DOMAIN + bytes([id_kind(ids)])
    return [from_hash(hashlib.sha512(prefix + raw).digest()) for raw in id_bytes(ids)]


def blind(elements: Sequence[bytes], scalar: bytes, who: str) -> list[bytes]:
    """Every element times ``scalar``; an element that is no valid group element is refused."""
    multiply = group().crypto_scalarmult_ristretto255
    try:
        return [multiply(scalar, element) for element in elements]
    except RuntimeError as error:
        raise PsiError(f"{who} refuses a PSI message: it holds an invalid group element") from error


def random_order(size: int) -> np.ndarray:
    """A permutation from the operating system's entropy (never the run's seed)."""
    return np.random.default_rng(int.from_bytes(os.urandom(16), "little")).permutation(size)


# ----------------------------------------------------------------------------- messages
def encode(kind: int, session: bytes, *parts: bytes) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, session) + b"".join(parts)


def counted(elements: Sequence[bytes]) -> bytes:
    return COUNT.pack(len(elements)) + b"".join(elements)


def counted_array(values: np.ndarray) -> bytes:
    return COUNT.pack(len(values)) + np.ascontiguousarray(values, dtype="<i8").tobytes()


@dataclass
class Message:
    """A decoded message: its kind, session and body, read piece by piece."""

    kind: int
    session: bytes
    body: bytes
    at: int = 0

    def take(self, size: int, what: str) -> bytes:
        if self.at + size > len(self.body):
            raise PsiError(f"malformed PSI {KIND_NAMES[self.kind]} message: {what} is cut short")
        piece = self.body[self.at : self.at + size]
        self.at += size
        return piece

    def count(self, what: str) -> int:
        return COUNT.unpack(self.take(COUNT.size, what))[0]

    def elements(self, what: str) -> list[bytes]:
        size = self.count(what)
        raw = self.take(size * ELEMENT_BYTES, what)
        return [raw[i : i + ELEMENT_BYTES] for i in range(0, len(raw), ELEMENT_BYTES)]

    def integers(self, what: str) -> np.ndarray:
        size = self.count(what)
        return np.frombuffer(self.take(8 * size, what), dtype="<i8").astype(np.int64)

    def done(self) -> None:
        if self.at != len(self.body):
            raise PsiError(f"malformed PSI {KIND_NAMES[self.kind]} message: trailing bytes")


def decode(message: bytes, expected: int, who: str, session: bytes | None) -> Message:
    """``message`` parsed as kind ``expected`` of ``session`` (None: any session)."""
    if not isinstance(message, bytes | bytearray) or len(message) < HEADER.size:
        raise PsiError(f"{who} refuses a PSI message: not a message of this protocol")
    magic, version, kind, sent_session = HEADER.unpack_from(message)
    if magic != MAGIC or version != VERSION:
        raise PsiError(f"{who} refuses a PSI message: not version {VERSION} of this protocol")
    if kind != expected:
        name = KIND_NAMES.get(kind, str(kind))
        raise PsiError(
            f"{who} refuses a PSI {name} message: it expects {KIND_NAMES[expected]} now "
            "(a replayed or out-of-order message)"
        )
    if session is not None and sent_session != session:
        raise PsiError(
            f"{who} refuses a PSI {KIND_NAMES[kind]} message of another session "
            "(a replayed message)"
        )
    return Message(kind, sent_session, bytes(message[HEADER.size :]))


# ----------------------------------------------------------------------------- the party
class PsiParty:
    """One party's side of one session: its ids (own order), its scalar, what it learned.

    :meth:`respond` answers START, REPLY and ALIGN in that order and nothing else: a second
    START, a message of another session or one out of order is refused. After ALIGN,
    :attr:`rows` holds, per stage, the party's own row indices in the agreed order, and the
    scalar is dropped.
    """

    def __init__(self, ids, party: int) -> None:
        self.party = int(party)
        self.who = f"party {self.party}"
        self.ids = check_ids(ids, self.who)
        self.kind = id_kind(self.ids)
        self.expected = START
        self.session: bytes | None = None
        self.scalar: bytes | None = None
        self.order: np.ndarray | None = None
        self.matched: np.ndarray | None = None
        self.rows: dict[str, np.ndarray] | None = None
        self.intersection_size: int | None = None

    def respond(self, message: bytes) -> bytes:
        """The reply to the label holder's next message."""
        step = {START: self.hello, REPLY: self.match, ALIGN: self.aligned}.get(self.expected)
        if step is None:
            raise PsiError(f"{self.who} refuses a PSI message: its alignment is finished")
        return step(decode(message, self.expected, self.who, self.session))

    def hello(self, message: Message) -> bytes:
        self.session = message.session
        message.done()
        self.scalar = group().crypto_core_ristretto255_scalar_random()
        self.order = random_order(len(self.ids))
        blinded = blind(hash_to_group(self.ids[self.order]), self.scalar, self.who)
        self.expected = REPLY
        return encode(HELLO, self.session, bytes([self.kind]), counted(blinded))

    def match(self, message: Message) -> bytes:
        twice = message.elements("the doubly blinded ids")
        theirs = message.elements("the label holder's blinded ids")
        message.done()
        if len(twice) != len(self.ids):
            raise PsiError(
                f"{self.who} refuses a PSI REPLY: {len(twice)} doubly blinded ids for the "
                f"{len(self.ids)} it sent"
            )
        if len(set(theirs)) != len(theirs):
            raise PsiError(f"{self.who} refuses a PSI REPLY: the label holder's ids repeat")
        answer = blind(theirs, self.scalar, self.who)
        common = set(answer)
        self.matched = np.flatnonzero([element in common for element in twice])
        self.intersection_size = len(self.matched)
        self.expected = ALIGN
        return encode(MATCH, self.session, counted(answer))

    def aligned(self, message: Message) -> bytes:
        positions = {stage: message.integers(f"the {stage} rows") for stage in STAGES}
        message.done()
        chosen = np.concatenate(list(positions.values()))
        if len(np.unique(chosen)) != len(chosen):
            raise PsiError(f"{self.who} refuses a PSI ALIGN: it names one of its rows twice")
        outside = np.setdiff1d(chosen, self.matched)
        if len(outside):
            raise PsiError(
                f"{self.who} refuses a PSI ALIGN: it names {len(outside)} row(s) outside the "
                "intersection this party computed"
            )
        self.rows = {stage: self.order[positions[stage]] for stage in STAGES}
        self.scalar = None
        self.expected = None
        counts = np.array([len(positions[stage]) for stage in STAGES])
        return encode(ALIGNED, self.session, counted_array(counts))


# ----------------------------------------------------------------------------- the label holder
class LabelHolderSession:
    """The label holder's side of one session with party ``party``: its own ids hashed once for
    every session (``hashed``), a fresh scalar and a fresh order of its ids for this one."""

    def __init__(self, ids: np.ndarray, hashed: list[bytes], party: int) -> None:
        self.ids = ids
        self.hashed = hashed
        self.party = int(party)
        self.who = "the label holder"
        self.session = os.urandom(SESSION_BYTES)
        self.scalar = group().crypto_core_ristretto255_scalar_random()
        self.order = random_order(len(ids))
        self.hello_size = 0
        self.twice: list[bytes] = []

    def start(self) -> bytes:
        return encode(START, self.session)

    def reply(self, hello: bytes) -> bytes:
        message = decode(hello, HELLO, self.who, self.session)
        kind = message.take(1, "the id kind")[0]
        theirs = message.elements("the party's blinded ids")
        message.done()
        own_kind = id_kind(self.ids)
        if kind != own_kind:
            raise PsiError(
                f"party {self.party}'s sample ids are {ID_KINDS.get(kind, 'unknown')}, the "
                f"label holder's are {ID_KINDS[own_kind]}: give every holder the same id column"
            )
        if len(set(theirs)) != len(theirs):
            raise PsiError(f"{self.who} refuses party {self.party}'s HELLO: its ids repeat")
        self.hello_size = len(theirs)
        self.twice = blind(theirs, self.scalar, self.who)
        own = blind([self.hashed[i] for i in self.order], self.scalar, self.who)
        return encode(REPLY, self.session, counted(self.twice), counted(own))

    def matches(self, match: bytes) -> np.ndarray:
        """For each of the label holder's rows, the party's HELLO position holding the same id,
        or -1: from the MATCH and the doubly blinded HELLO it sent in the REPLY."""
        message = decode(match, MATCH, self.who, self.session)
        answer = message.elements("the doubly blinded ids")
        message.done()
        if len(answer) != len(self.ids):
            raise PsiError(
                f"{self.who} refuses party {self.party}'s MATCH: {len(answer)} ids for the "
                f"{len(self.ids)} it sent"
            )
        position = {element: j for j, element in enumerate(self.twice)}
        found = np.full(len(self.ids), -1, dtype=np.int64)
        found[self.order] = [position.get(element, -1) for element in answer]
        return found

    def align(self, positions: dict[str, np.ndarray]) -> bytes:
        return encode(ALIGN, self.session, *(counted_array(positions[s]) for s in STAGES))

    def check_aligned(self, aligned: bytes, positions: dict[str, np.ndarray]) -> None:
        message = decode(aligned, ALIGNED, self.who, self.session)
        counts = message.integers("the counts")
        message.done()
        expected = [len(positions[stage]) for stage in STAGES]
        if counts.tolist() != expected:
            raise PsiError(
                f"party {self.party} took {counts.tolist()} rows per stage, the label holder "
                f"sent {expected}"
            )
