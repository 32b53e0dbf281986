"""The FedBCD recipe: communication rounds to target against the local updates Q per schedule,
and the validation metric over rounds."""

from __future__ import annotations

import dataclasses
import math

from vfl_lightning.report import charts, figures
from vfl_lightning.report.aggregate import rounds_to_stay, summarize
from vfl_lightning.report.document import Context, Panel, Section, ordered
from vfl_lightning.report.markdown import has, number, table
from vfl_lightning.report.runs import Group

STAY = "rounds_to_stay"
LR = "optimizer.lr"


def short_label(group: Group) -> Group:
    """The group labelled without its algo name (the panel names the schedule)."""
    rest = group.label.removeprefix(group.algo).strip()
    return Group(rest or group.label, group.values, group.runs)


def with_stay(group: Group, metric: str, value: float | None, mode: str) -> Group:
    """The group with each run's ``rounds_to_stay`` (see :func:`rounds_to_stay`) among its
    results, for the target ``metric`` >= ``value`` (NaN without a target)."""
    runs = [
        dataclasses.replace(
            run,
            results={
                **run.results,
                STAY: math.nan if value is None else rounds_to_stay(run, metric, value, mode),
            },
        )
        for run in group.runs
    ]
    return Group(group.label, group.values, runs)


def per_seed(values: list[float]) -> str:
    return ", ".join("never" if not math.isfinite(v) else f"{v:.0f}" for v in values)


def fedbcd(ctx: Context) -> Section:
    """Rounds to target against Q per schedule (first crossing, and the round from which the
    curve stays at the target); the validation metric over rounds."""
    section = Section(
        "FedBCD: rounds to target",
        "Q local updates per exchange. Rounds to target, two ways: the first crossing, counted "
        "by the TargetTracker at every validation, and the round from which every later "
        "validation of the run meets the target (they differ where the curve dips back below). "
        "Mean ± sample standard deviation over the seeds that reached it, (k/n) when only k did. "
        "Where the runs differ in the learning rate η0, each rate has its own row and series.",
    )
    metric = "val/auroc" if has(ctx.runs, "val/auroc") else ctx.y
    target = ctx.runs[0].results.get("target_metric"), ctx.runs[0].results.get("target_value")
    mode = ctx.runs[0].setting("target.mode", "max")
    groups = [with_stay(g, str(target[0]), target[1], mode) for g in ordered(ctx.groups, "fedbcd")]
    # a sweep over eta0 too (the same Q at two learning rates): each rate its own series and row
    by_rate = len({v for g in groups if math.isfinite(v := g.runs[0].value(LR))}) > 1
    series: dict[str, list] = {}
    for group in groups:
        name = group.style("label", group.algo)
        if by_rate:
            name += f" η0={group.runs[0].value(LR):g}"
        series.setdefault(name, []).append(
            (group, "algo.local_steps", "rounds_to_target", "filled")
        )
        series[name].append((group, "algo.local_steps", STAY, "open"))
    section.add_figure(
        "fedbcd_rounds_vs_q",
        charts.points(
            series,
            f"{ctx.title}: rounds until {target[0]} ≥ {target[1]}",
            "local updates per exchange Q",
            "communication rounds to target (log scale)",
            connect=True,
            log_x=True,
            log_y=True,
            dodge=0.04,
            integer_ticks=True,
            not_reached=True,
        ),
        "rounds to target against Q per schedule (p: parallel, s: sequential, proximal); "
        "filled: first crossing, open: the round from which the curve stays at the target; "
        "mean ± std over seeds, k/n: only k of n seeds reached the target",
    )
    first: dict[str, Group] = {}
    for group in groups:
        first.setdefault(group.algo, group)
    facets = [
        (head.style("label", algo), [short_label(g) for g in groups if g.algo == algo])
        for algo, head in first.items()
    ]
    reference = (target[1], f"target {target[1]:g}") if target[0] == metric else None
    section.add_figure(
        "fedbcd_metric_vs_rounds",
        figures.facet_curves(
            facets,
            "comm/rounds",
            metric,
            f"{ctx.title}: {figures.label(metric)} per schedule",
            log_x=True,
            hline=reference,
        ),
        f"{figures.label(metric)} over communication rounds (log scale), one panel per schedule",
    )
    section.plotted.append(("comm/rounds", metric))
    rows = []
    for group in groups:
        rows.append(
            [
                group.style("label", group.algo),
                number(group.runs[0].value("algo.local_steps"), 3),
                number(group.runs[0].value("algo.mu"), 3),
                *([f"{group.runs[0].value(LR):g}"] if by_rate else []),
                len(group.runs),
                summarize(group.values_of("rounds_to_target")).text(1),
                per_seed(group.values_of("rounds_to_target")),
                summarize(group.values_of(STAY)).text(1),
                per_seed(group.values_of(STAY)),
                summarize(group.values_of(metric)).text(),
                summarize(group.values_of("comm/rounds")).text(0),
            ]
        )
    section.tables.append(
        table(
            [
                "schedule",
                "Q",
                "μ",
                *(["η0"] if by_rate else []),
                "seeds",
                "rounds to target (first crossing)",
                "per seed",
                "rounds to target (stays from)",
                "per seed",
                f"final {metric}",
                "rounds run",
            ],
            rows,
        )
    )
    section.panels += [
        Panel("line", f"{metric} over rounds", [metric], "comm/rounds"),
        Panel("bar", "rounds to target", ["rounds_to_target"]),
    ]
    return section
