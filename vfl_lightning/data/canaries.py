"""Canaries of a privacy audit: training rows whose audited features take one of two values, each
chosen by a fair coin, so that an auditor can be asked to guess the coins (plain torch).

``data.canaries`` (set by an ``audit=`` config) maps an audit's name to its spec:
``level`` (``feature``: party ``party``'s features are audited; ``sample``: every party's on the
wire; ``message``: party ``party``'s training releases, see below), ``count`` (canaries). For each
audit, in name order, ``count`` training rows not taken by an earlier audit are drawn; each gets a
coin: the audited slices are set to the per-column minimum (coin 0) or maximum (coin 1) of the
training split, every other slice (the server's own slice of an active label holder included) to
the per-column training mean, so all canaries look alike except for the audited features. Labels
are left as they are (independent of the coins). A ``label`` audit changes only labels: its
rows' training label is its coin, class 0 or 1 (:func:`place_label_canaries`, every other
feature untouched). A ``message`` audit changes no feature: its
party puts the coin into what it releases of those rows (the mechanism's worst-case input,
:mod:`~vfl_lightning.algorithms.release_canaries`), so its rows may be every training row.
Rows and coins come from the run's seed alone (stream ``canaries``), so every process that builds
the data writes the same canaries: a Ray party actor into its own columns, the server's harness
into its record of which rows are canaries and what their coins are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vfl_lightning.seeding import derive_seed

DATA_LEVELS = ("feature", "sample")
"""Canaries written into the features."""
LEVELS = (*DATA_LEVELS, "label", "message")
WRITTEN_LEVELS = (*DATA_LEVELS, "label")
"""Canaries that change the training data (features or labels): at most half of the rows."""


@dataclass(frozen=True)
class CanaryRecord:
    """Which training rows are one audit's canaries, their coins (0 or 1, int64, the order of
    ``rows``) and the audited party slices."""

    rows: torch.Tensor
    coins: torch.Tensor
    parties: tuple[int, ...]
    level: str = "feature"


def check_canary_spec(name: str, spec: Mapping, *, num_wire_parties: int) -> tuple[str, int, int]:
    """(level, count, party) of one audit's spec; one error line per bad value."""
    level = spec.get("level", "feature")
    if level not in LEVELS:
        raise ValueError(f"audit.{name} level must be one of {LEVELS}, got {level!r}")
    count = spec.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 2:
        raise ValueError(f"audit.{name}.count must be an integer >= 2, got {count!r}")
    party = spec.get("party", 0)
    if isinstance(party, bool) or not isinstance(party, int) or not 0 <= party < num_wire_parties:
        raise ValueError(
            f"audit.{name}.party must be in [0, {num_wire_parties - 1}] (a party on the wire), "
            f"got {party!r}"
        )
    return level, count, party


def place_canaries(
    xs: list[torch.Tensor], specs: Mapping[str, Mapping], *, seed: int, num_wire_parties: int
) -> dict[str, CanaryRecord]:
    """Write every audit's canaries into the training slices ``xs`` (in place; one tensor per
    slice, rows first) and return their records by audit name."""
    rows_total = int(xs[0].shape[0])
    checked = {
        name: check_canary_spec(name, specs[name], num_wire_parties=num_wire_parties)
        for name in sorted(specs)
    }
    written = {name: c for name, c in checked.items() if c[0] in WRITTEN_LEVELS}
    wanted = sum(count for _, count, _ in written.values())
    if wanted > rows_total // 2:
        keys = " or ".join(f"audit.{name}.count" for name in written)
        raise ValueError(
            f"the audits' canaries ({wanted}) must be at most half of the {rows_total} training "
            f"samples: lower {keys}"
        )
    total = sum(count for _, count, _ in checked.values())
    if total > rows_total:
        keys = " or ".join(f"audit.{name}.count" for name in checked)
        raise ValueError(
            f"the audits' canaries ({total}) must be at most the {rows_total} training samples: "
            f"lower {keys}"
        )
    flats = [x.view(rows_total, -1) for x in xs]
    low = [flat.amin(dim=0) for flat in flats]
    high = [flat.amax(dim=0) for flat in flats]
    mean = [flat.to(torch.float64).mean(dim=0).to(flat.dtype) for flat in flats]
    generator = torch.Generator().manual_seed(derive_seed(seed, "simulation", "canaries"))
    order = torch.randperm(rows_total, generator=generator)
    records, start = {}, 0
    for name, (level, count, party) in checked.items():
        rows = order[start : start + count]
        start += count
        coins = torch.randint(0, 2, (count,), generator=generator)
        parties = {"sample": tuple(range(num_wire_parties)), "label": ()}.get(level, (party,))
        records[name] = CanaryRecord(rows, coins, parties, level)
        if level not in DATA_LEVELS:
            continue
        for m, flat in enumerate(flats):
            if m in parties:
                flat[rows] = torch.where(coins[:, None].bool(), high[m], low[m])
            else:
                flat[rows] = mean[m]
    return records


def place_label_canaries(labels: torch.Tensor, records: Mapping[str, CanaryRecord]) -> None:
    """Set the training ``labels`` (in place) of every ``label`` audit's rows to their coins:
    class 0 or 1, two neighbouring labels of any task."""
    for record in records.values():
        if record.level == "label":
            labels[record.rows] = record.coins.to(labels.dtype)
