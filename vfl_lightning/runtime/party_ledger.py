"""What a party program released of its own rows over every run it served (``runtime=grpc``):
its policy's caps (``max_releases_per_row``, ``max_feature_eps``) hold over all of them, not
only within one run. A run's own count (:class:`~vfl_lightning.algorithms.party_budget.
PartyBudget`, what ``privacy/party_<m>/*`` reports) starts afresh with every proposal and counts
the run's aligned positions; a server could otherwise reset it by proposing again (the same run,
a new run key) or by aligning the rows anew before a resume, and have the same rows released
past the caps.

The ledger counts each release by the party's own row (the row of its data file the aligned
position stands for), every split together (within one run a row belongs to one split, so an
honest run is counted exactly as its run's count does). It is kept in the program's memory and
written to ``<state_dir>/party_<m>/released.pt`` whenever the party saves its state, at the end
of a session and when the program stops, and read back when the program starts (tensors and plain
values only). Releases after the last write are lost if the program is killed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from vfl_lightning.algorithms.party_budget import PartyBudget
from vfl_lightning.checkpoints import atomic_torch_save
from vfl_lightning.errors import ConfigError, PartyRefusal
from vfl_lightning.runtime.party_state import party_folder

LEDGER_FILE = "released.pt"
ROWS = "rows"
"""The ledger's one split: every release of an own row counts, whatever split it was in."""


class RowPastBudget(Exception):
    """A release the ledger refuses: the own row, the count it would reach, the budget's text."""

    def __init__(self, row: int | None, count: int, budget: str) -> None:
        super().__init__(budget)
        self.row, self.count, self.budget = row, count, budget


class LedgerBudget(PartyBudget):
    """A :class:`PartyBudget` over own rows whose row refusal names no row (the caller names the
    aligned position the server asked for: an own row's index would tell the server the party's
    own order)."""

    def _refuse_row(self, call, split, row, count: int, limit: int) -> None:
        raise RowPastBudget(row, count, self.row_budget(limit))


def ids_digest(ids: np.ndarray) -> str:
    """A digest of a data file's sample ids, in its order (the rows the ledger counts)."""
    array = np.asarray(ids)
    text = array.astype(str) if array.dtype.kind in "OU" else array.astype("<i8")
    return hashlib.sha256(str(array.dtype.kind).encode() + text.tobytes()).hexdigest()


class PartyLedger:
    """Party ``config.party``'s ledger for the data file whose ids are ``ids``: read from its
    state directory when the program starts (a ledger of another data file is refused in one
    line), counted by every session's guard (:meth:`attach`)."""

    def __init__(self, config, ids: np.ndarray) -> None:
        self.party, self.policy = int(config.party), config.policy
        self.path = party_folder(config.state_dir, config.party) / LEDGER_FILE
        self.ids, self.size = ids_digest(ids), len(ids)
        self.saved = self.read(self.path)
        self.budget: LedgerBudget | None = None
        self.changed = False

    def read(self, path: Path) -> dict | None:
        if not path.is_file():
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            found = (saved["party"], saved["ids"], saved["rows"])
            state = saved["budget"]
        except Exception as error:
            reason = " ".join(str(error).split())[:200]
            raise ConfigError(
                f"state_dir: {path} (the party's count of its releases over every run) cannot be "
                f"read: {type(error).__name__}: {reason}; restore it from a backup"
            ) from None
        if found != (self.party, self.ids, self.size):
            raise ConfigError(
                f"state_dir: {path} counts the releases of party {found[0]}'s data file of "
                f"{found[2]} rows with other sample ids, not this party's data file: keep each "
                "party's state_dir beside its own data file"
            )
        return state

    def attach(self, session) -> LedgerView:
        """The view through which ``session``'s guard counts its releases here (the budget is
        made with the first session's mechanism: the party's configuration fixes it)."""
        if self.budget is None:
            self.budget = LedgerBudget(
                self.party, self.policy, session.mechanism, embedding_dim=session.width
            )
            if self.saved is not None:
                self.budget.load_state_dict(self.saved)
        view = LedgerView(self, session)
        session.own.guard.ledger = view
        return view

    def save(self) -> None:
        """Write the counts (atomically) to :attr:`path` if a release was counted since the
        last write."""
        if self.budget is None or not self.changed:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        state = {"party": self.party, "ids": self.ids, "rows": self.size}
        atomic_torch_save(state | {"budget": self.budget.state_dict()}, self.path)
        self.changed = False


class LedgerView:
    """One session's releases, counted by own row in ``ledger`` (the session's alignment maps
    each aligned position of a split to its own row)."""

    def __init__(self, ledger: PartyLedger, session) -> None:
        self.ledger, self.session = ledger, session

    def own_rows(self, stage: str, rows: np.ndarray | None) -> np.ndarray | None:
        if rows is None or len(rows) == 0:
            return rows
        return self.session.alignment.rows[stage][rows]

    def check(self, call: str, stage: str, rows: np.ndarray | None, noise) -> None:
        own = self.own_rows(stage, rows)
        try:
            self.ledger.budget.check(call, ROWS, own, noise)
        except RowPastBudget as past:
            which = "every row" if past.row is None else f"row {rows[own == past.row][0]}"
            raise PartyRefusal(
                f"party {self.ledger.party} refused {call}: its budget {past.budget} over every "
                f"run and session it served (counted in {self.ledger.path}): this would be "
                f"release {past.count} of {which} of {stage}"
            ) from None

    def record(self, stage: str, rows: np.ndarray | None, noise) -> None:
        self.ledger.budget.record(ROWS, self.own_rows(stage, rows), noise)
        self.ledger.changed = True

    def save(self) -> None:
        self.ledger.save()
