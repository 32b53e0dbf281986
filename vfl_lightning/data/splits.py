"""What a data module's splits are made of: per-party tensors of a split (:class:`PartyTensors`),
the rows that await the PSI and the splits made of the aligned ones (:class:`AlignedSplits`), and
the split measures computed once per process."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from vfl_lightning.data.alignment import (
    AlignmentReport,
    LabelHolderRows,
    PartyTable,
    align_tables,
)
from vfl_lightning.data.partition import PartySlice
from vfl_lightning.data.psi import STAGES
from vfl_lightning.data.vertibench import split_scores


class PartyTensors(Dataset):
    """One split held as per-party tensors; indexing with a tensor (or list) of indices returns a
    whole batch."""

    def __init__(self, xs: list[torch.Tensor], y: torch.Tensor) -> None:
        self.xs = xs
        self.y = y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index):
        idx = torch.as_tensor(index, dtype=torch.long)
        return [x[idx] for x in self.xs], self.y[idx], idx


PSI_CHOICES = ("auto", "always")
_SCORES: dict[tuple, dict[str, float]] = {}


def cached_split_scores(key: tuple, x_train, y_train, slices) -> dict[str, float]:
    """:func:`~vfl_lightning.data.vertibench.split_scores` of the split, computed once per
    process for each ``key`` (the data and the split it measures)."""
    if key not in _SCORES:
        if len(_SCORES) >= 32:
            _SCORES.clear()
        seed = key[5]
        _SCORES[key] = split_scores(x_train, y_train, [s.index for s in slices], seed)
    return dict(_SCORES[key])


def check_psi(psi) -> str:
    if psi not in PSI_CHOICES:
        raise ValueError(
            f"data.psi must be one of {PSI_CHOICES} (auto: align by PSI when the parties' rows can "
            f"differ; always: also when every party holds every row), got {psi!r}"
        )
    return psi


def column(flat: np.ndarray, rows: np.ndarray, part: PartySlice) -> np.ndarray:
    """Rows ``rows`` of the flat features, ``part``'s columns, in its slice shape."""
    return np.ascontiguousarray(flat[rows][:, part.index]).reshape(len(rows), *part.shape)


class AlignedSplits:
    """The rows of a data module that still await the PSI (``pending``: the label holder's ids,
    labels and own slice per stage; ``party_tables``: the rows of the parties this process
    holds), and the splits made of the aligned rows (:meth:`apply_alignment`). ``alignment`` is
    the PSI's report (None: no PSI ran, every party holds every row in the label holder's order)."""

    def start_alignment(self) -> None:
        self.pending: LabelHolderRows | None = None
        self.party_tables: list[PartyTable] = []
        self.alignment: AlignmentReport | None = None

    @property
    def label_holder_ids(self) -> dict[str, np.ndarray] | None:
        """The label holder's sample ids per stage while the PSI is still to run, else None."""
        return None if self.pending is None else self.pending.ids

    def align_here(self) -> None:
        """The PSI between the label holder and the parties whose tables this process holds."""
        report, columns = align_tables(self.pending.ids, self.party_tables)
        self.apply_alignment(report, columns)

    def await_alignment(self) -> None:
        """Hold the label holder's rows (ids, labels, its own slice) for a PSI, also when every
        party holds every row of this data module: a runtime whose parties read their own files,
        in their own order, always aligns them."""
        if self.pending is not None:
            return
        own = None
        if getattr(self, "server_shape", None) is not None:
            own = {stage: split.xs[-1].numpy() for stage, split in self.splits.items()}
        self.pending = LabelHolderRows(
            ids={stage: np.asarray(self.split_index[stage]) for stage in STAGES},
            labels={stage: self.splits[stage].y.numpy() for stage in STAGES},
            own=own,
        )
        self.splits = {}

    def apply_alignment(self, report: AlignmentReport, columns=None) -> None:
        """Keep the aligned rows: the labels (and the label holder's own slice) of each stage at
        the report's positions, the parties' ``columns`` (per party, per stage, aligned; None:
        no party column in this process); the party tables are dropped."""
        pending = self.pending
        for stage in STAGES:
            rows = report.aligned[stage]
            xs = [torch.from_numpy(c[stage]) for c in columns or []]
            if pending.own is not None:
                xs.append(torch.from_numpy(np.ascontiguousarray(pending.own[stage][rows])))
            self.splits[stage] = PartyTensors(xs, torch.from_numpy(pending.labels[stage][rows]))
            self.split_index[stage] = pending.ids[stage][rows]
        self.pending, self.party_tables, self.alignment = None, [], report
