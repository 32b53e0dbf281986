"""Sample alignment before training: which rows each party holds (simulated partial overlap, or
its own file), and the label holder's side of the PSI (:mod:`vfl_lightning.data.psi`) with every
party, over any transport that carries bytes, with its traffic and work counted.

The label holder's split decides the stages: a row is aligned when every party holds its id, and
each stage keeps its aligned rows in the label holder's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vfl_lightning.data.psi import (
    STAGES,
    LabelHolderSession,
    PsiError,
    PsiParty,
    check_ids,
    hash_to_group,
)
from vfl_lightning.seeding import derive_seed

Exchange = Callable[[list[bytes]], list[bytes]]
"""Sends message m to party m (all parties at once) and returns their replies in party order."""


@dataclass(frozen=True)
class PartyTable:
    """The rows one party holds: its sample ids and its feature columns, in its own order."""

    ids: np.ndarray
    features: np.ndarray

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.features):
            raise ValueError(f"{len(self.ids)} sample ids for {len(self.features)} feature rows")


@dataclass(frozen=True)
class LabelHolderRows:
    """The label holder's rows before alignment, per stage of its split: sample ids, labels and,
    when it holds features too, its own slice (None otherwise)."""

    ids: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    own: dict[str, np.ndarray] | None = None


def check_overlap(overlap) -> float:
    """``data.overlap`` as a float in (0, 1], or one line saying what it takes."""
    if (
        isinstance(overlap, bool)
        or not isinstance(overlap, int | float)
        or not 0.0 < float(overlap) <= 1.0
    ):
        raise ValueError(
            f"data.overlap must be a number in (0, 1] (the share of the label holder's rows that "
            f"every party also holds), got {overlap!r}"
        )
    return float(overlap)


def simulate_holdings(
    num_rows: int, overlap: float, num_parties: int, seed: int
) -> list[np.ndarray]:
    """Which of the label holder's ``num_rows`` rows each party holds, each party's in its own
    shuffled order: a share ``overlap`` of the rows (drawn at random) is held by every party; each
    other row is missing at one party drawn at random and held by each remaining party with
    probability 1/2, so no other row is held by all. Seeded by ``seed``."""
    overlap = check_overlap(overlap)
    shared = int(round(overlap * num_rows))
    if shared < 1:
        raise ValueError(
            f"data.overlap={overlap:g} of {num_rows} rows leaves no row that every party holds: "
            f"raise data.overlap to at least {1 / num_rows:.2g}"
        )
    rng = np.random.default_rng(derive_seed(seed, "simulation", "overlap"))
    order = rng.permutation(num_rows)
    held = np.zeros((num_parties, num_rows), dtype=bool)
    held[:, order[:shared]] = True
    rest = order[shared:]
    if num_parties > 1 and len(rest):
        held[:, rest] = rng.random((num_parties, len(rest))) < 0.5
        held[rng.integers(num_parties, size=len(rest)), rest] = False
    holdings = []
    for m in range(num_parties):
        own = np.flatnonzero(held[m])
        party_rng = np.random.default_rng(derive_seed(seed, "simulation", "overlap", index=m + 1))
        holdings.append(own[party_rng.permutation(len(own))])
    return holdings


@dataclass
class AlignmentReport:
    """What the label holder learned and what the alignment cost.

    ``aligned[stage]``: the positions, within the label holder's stage, of the rows every party
    holds (increasing). ``intersections[m]``: rows the label holder shares with party m.
    ``traffic``: per exchange, the bytes sent down to and up from every party; ``work``: per
    exchange, group operations (hashes to the group and scalar multiplications) of the label
    holder and of every party.
    """

    aligned: dict[str, np.ndarray]
    label_holder_rows: int
    party_rows: list[int]
    intersections: list[int]
    traffic: list[tuple[list[int], list[int]]] = field(default_factory=list)
    work: list[tuple[int, list[int]]] = field(default_factory=list)

    @property
    def aligned_rows(self) -> int:
        return int(sum(len(rows) for rows in self.aligned.values()))

    @property
    def total_bytes(self) -> int:
        return int(sum(sum(down) + sum(up) for down, up in self.traffic))

    def seconds(self, network) -> float:
        """Simulated time on ``network`` (``link_seconds`` per message, ``group_ops_per_second``
        per side): per exchange, the label holder's work, then the slowest party's download,
        work and upload."""
        rate = float(network.group_ops_per_second)
        total = 0.0
        for (down, up), (holder_ops, party_ops) in zip(self.traffic, self.work, strict=True):
            parties = (
                network.link_seconds(8 * d) + ops / rate + network.link_seconds(8 * u)
                for d, u, ops in zip(down, up, party_ops, strict=True)
            )
            total += holder_ops / rate + max(parties, default=0.0)
        return total


def align_with_parties(
    stage_ids: dict[str, np.ndarray], exchange: Exchange, num_parties: int
) -> AlignmentReport:
    """Run the PSI of the label holder's ids ``stage_ids`` (per stage) with ``num_parties``
    parties through ``exchange``; refuse, in one line, repeated ids or no row held by all."""
    ids = check_ids(np.concatenate([np.asarray(stage_ids[s]) for s in STAGES]), "the label holder")
    bounds = np.cumsum([0, *(len(stage_ids[s]) for s in STAGES)])
    hashed = hash_to_group(ids)
    sessions = [LabelHolderSession(ids, hashed, m) for m in range(num_parties)]
    report = AlignmentReport({}, len(ids), [], [])

    def send(messages: list[bytes]) -> list[bytes]:
        replies = exchange(messages)
        if len(replies) != num_parties:
            raise PsiError(f"{len(replies)} PSI replies for {num_parties} parties")
        report.traffic.append(([len(m) for m in messages], [len(r) for r in replies]))
        return replies

    hellos = send([session.start() for session in sessions])
    replies = [session.reply(hello) for session, hello in zip(sessions, hellos, strict=True)]
    sizes = [session.hello_size for session in sessions]
    report.party_rows = sizes
    report.work.append((len(ids), [2 * n for n in sizes]))
    matches = send(replies)
    report.work.append((sum(n + len(ids) for n in sizes), [len(ids)] * num_parties))
    found = [session.matches(match) for session, match in zip(sessions, matches, strict=True)]
    report.intersections = [int((f >= 0).sum()) for f in found]
    everywhere = np.logical_and.reduce([f >= 0 for f in found])
    if not everywhere.any():
        raise PsiError(
            f"the PSI found no sample id that the label holder ({len(ids)} rows) and every party "
            f"(rows shared with each: {report.intersections}) hold: the ids do not overlap"
        )
    for s, stage in enumerate(STAGES):
        report.aligned[stage] = np.flatnonzero(everywhere[bounds[s] : bounds[s + 1]])
    if len(report.aligned["train"]) == 0:
        raise PsiError(
            f"the {report.aligned_rows} rows every party holds include no training row of the "
            "label holder's split: nothing to train on"
        )
    positions = [
        {s: f[bounds[i] : bounds[i + 1]][report.aligned[s]] for i, s in enumerate(STAGES)}
        for f in found
    ]
    acks = send([session.align(p) for session, p in zip(sessions, positions, strict=True)])
    report.work.append((0, [0] * num_parties))
    for session, ack, p in zip(sessions, acks, positions, strict=True):
        session.check_aligned(ack, p)
    return report


def local_exchange(parties: Sequence[PsiParty]) -> Exchange:
    """The exchange of parties that live in this process (the local simulation)."""

    def exchange(messages: list[bytes]) -> list[bytes]:
        return [party.respond(message) for party, message in zip(parties, messages, strict=True)]

    return exchange


def align_tables(
    stage_ids: dict[str, np.ndarray], tables: Sequence[PartyTable]
) -> tuple[AlignmentReport, list[dict[str, np.ndarray]]]:
    """The PSI of the label holder with parties that live in this process: the report and each
    party's aligned feature rows per stage."""
    parties = [PsiParty(table.ids, m) for m, table in enumerate(tables)]
    report = align_with_parties(stage_ids, local_exchange(parties), len(parties))
    columns = [
        {stage: table.features[party.rows[stage]] for stage in STAGES}
        for party, table in zip(parties, tables, strict=True)
    ]
    return report, columns
