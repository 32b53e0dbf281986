"""The FedVS recipe: validation accuracy over simulated seconds per algo (and per K or T), and
accuracy at fixed simulated times."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vfl_lightning.report import figures
from vfl_lightning.report.aggregate import step_values, summarize
from vfl_lightning.report.document import Context, Panel, Section, ordered
from vfl_lightning.report.markdown import number, table
from vfl_lightning.report.runs import SYMBOLS, Group, Run, relabel


def short(key: str) -> str:
    """An override key as group labels show it (``algo.K`` -> ``K``, ``data.batch_size`` ->
    ``batch``)."""
    last = key.rsplit(".", 1)[-1]
    return SYMBOLS.get(last, last)


def by_overridden_keys(groups: Sequence[Group]) -> dict[frozenset, list[Group]]:
    """Groups split by which override keys they set (the algo comparison at the defaults apart
    from a sweep over K or T), in order of first appearance."""
    parts: dict[frozenset, list[Group]] = {}
    for group in groups:
        keys = frozenset(k for k, v in group.values.items() if v is not None)
        parts.setdefault(keys, []).append(group)
    return parts


def fedvs(ctx: Context) -> Section:
    """Validation accuracy over simulated seconds per algo (FedVS Figure 2; Figures 3-4 when K
    or T vary) and accuracy at fixed simulated times."""
    section = Section(
        "FedVS: accuracy over simulated time",
        "Validation accuracy last measured at or before each simulated time (stragglers and "
        "message sizes on the simulated clock); (k/n): only k of n runs had validated by then, "
        "–: none had.",
    )
    groups = ordered(ctx.groups, "fedvs")
    stems: set[str] = set()
    for keys, members in by_overridden_keys(groups).items():
        varying = [k for k in sorted(keys) if len({g.values[k] for g in members}) > 1]
        fixed = ", ".join(
            f"{short(k)}={members[0].values[k]}" for k in sorted(keys) if k not in varying
        )
        what = (", ".join(short(k) for k in varying) + " varies") if varying else "per algo"
        suffix = f" ({fixed})" if fixed else ""
        base = "_".join(["fedvs_acc_vs_time", *(short(k) for k in varying)])
        stem, copy = base, 1
        while stem in stems:  # one file per figure, also when two share their varying keys
            copy += 1
            stem = f"{base}_{copy}"
        stems.add(stem)
        section.add_figure(
            stem,
            figures.curves(
                relabel(members),
                "time/simulated_s",
                ["val/acc"],
                f"{ctx.title}: validation accuracy, {what}{suffix}",
            ),
            f"validation accuracy over simulated seconds, {what}{suffix}",
        )
    section.plotted.append(("time/simulated_s", "val/acc"))
    times = list(ctx.times or default_times(ctx.runs))
    rows = []
    for group in groups:
        columns = accuracy_at(group, "time/simulated_s", times)
        rate = [r.value("comm/rounds") / r.value("time/simulated_s") for r in group.runs]
        rows.append(
            [
                group.label,
                number(group.runs[0].value("fedvs/K"), 3),
                number(group.runs[0].value("fedvs/T"), 3),
                number(group.runs[0].value("fedvs/R"), 3),
                len(group.runs),
                summarize(rate).text(2),
                *(summarize(list(c)).text(3) for c in columns),
            ]
        )
    section.tables.append(
        table(
            [
                "group",
                "K",
                "T",
                "R",
                "seeds",
                "rounds per sim. s",
                *(f"acc @ {t:g} s" for t in times),
            ],
            rows,
        )
    )
    if ctx.rounds:
        section.tables.append(
            "Validation accuracy last measured at or before each round count (the same runs: "
            "what a round achieves, whatever it cost on the clock).\n\n"
            + table(
                ["group", "seeds", *(f"acc @ round {r:g}" for r in ctx.rounds)],
                [
                    [
                        group.label,
                        len(group.runs),
                        *(
                            summarize(list(c)).text(3)
                            for c in accuracy_at(group, "comm/rounds", ctx.rounds)
                        ),
                    ]
                    for group in groups
                ],
            )
        )
    section.panels.append(
        Panel("line", "validation accuracy over simulated time", ["val/acc"], "time/simulated_s")
    )
    return section


def accuracy_at(group: Group, axis: str, points: Sequence[float]) -> np.ndarray:
    """(points, runs): each run's validation accuracy last measured at ``axis`` <= each point."""
    at = []
    for run in group.runs:
        xs = np.array([r[axis] for r in run.curve])
        ys = np.array([r.get("val/acc", math.nan) for r in run.curve])
        at.append(step_values(xs, ys, np.array(points, dtype=float)))
    return np.array(at).T


def default_times(runs: Sequence[Run]) -> list[float]:
    """Five simulated times up to the shortest run's last validation, on round numbers."""
    last = min(run.curve[-1]["time/simulated_s"] for run in runs if run.curve)
    return sorted({float(f"{last * f:.2g}") for f in (0.1, 0.2, 0.4, 0.7, 1.0)})
