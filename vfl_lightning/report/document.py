"""The report's document model: sections (text, figures, tables, W&B panels), the context a
recipe reads, and the order of a recipe's groups (from each run's ``report`` config)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from matplotlib.figure import Figure

from vfl_lightning.report.runs import Group, Run

TITLES = {
    "pbm": "PBM-VFL",
    "fedbcd": "FedBCD",
    "cascade": "Cascaded hybrid optimization",
    "fedvs": "FedVS",
    "privacy": "Attacks and defenses",
    "audit": "Privacy audit",
    "alignment": "Partial overlap",
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


def ordered(groups: Sequence[Group], recipe: str) -> list[Group]:
    """The recipe's groups first, in their algos' ``report.order``, then the others; then by
    their override values (numbers by value)."""

    def rank(group: Group) -> tuple:
        inside = group.runs[0].in_recipe(recipe)
        order = group.style("order", 0) if inside else 0
        return (not inside, order, [natural(v) for v in group.values.values()])

    return sorted(groups, key=rank)
