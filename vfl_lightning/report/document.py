"""The report's document model: sections (text, figures, tables, W&B panels), the context a
recipe reads, the papers' algo families and their order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from matplotlib.figure import Figure

from vfl_lightning.report.runs import Group, Run

FAMILIES = {
    "fedvs": ("fedvs", "fedvs_wait", "fedvs_ignore", "fedvs_wait_dp"),
    "fedbcd": ("fedsgd", "fedbcd", "fedbcd_s", "fedpbcd"),
    "cascade": ("splitnn", "npq", "vafl", "syn_zoo_vfl", "zoo_vfl", "cascade"),
    "pbm": ("npq", "pbm", "ldp"),
}
# Shared baselines: their presence alone does not choose a recipe.
BASELINES = {"npq", "splitnn"}
TITLES = {
    "pbm": "PBM-VFL",
    "fedbcd": "FedBCD",
    "cascade": "Cascaded hybrid optimization",
    "fedvs": "FedVS",
    "privacy": "Attacks and defenses",
    "audit": "Privacy audit",
}


@dataclass
class Panel:
    """A W&B panel over the runs: ``line`` (y over x from the history) or ``bar`` (summary)."""

    kind: str
    title: str
    y: list[str]
    x: str | None = None


@dataclass
class Section:
    """A part of the report: text, figures (file stem, figure, caption), Markdown tables and
    the matching W&B panels."""

    title: str
    text: str = ""
    figures: list[tuple[str, Figure, str]] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    panels: list[Panel] = field(default_factory=list)
    # (x, y) of the curves a figure of this section draws for every group: the overview leaves
    # out its own figure of the same curves
    plotted: list[tuple[str, str]] = field(default_factory=list)

    def add_figure(self, stem: str, figure: Figure | None, caption: str) -> None:
        if figure is not None:
            self.figures.append((stem, figure, caption))


@dataclass
class Context:
    runs: list[Run]
    groups: list[Group]
    x: str
    y: str
    title: str
    times: Sequence[float] | None = None
    rounds: Sequence[float] | None = None


def natural(value: str | None) -> tuple:
    """Sort key for an override value: missing (the default) first, numbers by value, text."""
    if value is None:
        return (-1, 0.0, "")
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def ordered(groups: Sequence[Group], family: str) -> list[Group]:
    """Groups in the family's algo order, then by their override values (numbers by value)."""
    order = FAMILIES.get(family, ())
    rank = {algo: i for i, algo in enumerate(order)}
    return sorted(
        groups,
        key=lambda g: (rank.get(g.algo, len(order)), [natural(v) for v in g.values.values()]),
    )
