"""The papers' figures and tables as report recipes (pbm, fedbcd, cascade, fedvs: one module
each; privacy, audit and alignment beside them) plus the section every report has (the chosen metric over the chosen axis, one table)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vfl_lightning.report import figures
from vfl_lightning.report.aggregate import summarize
from vfl_lightning.report.document import Context, Panel, Section
from vfl_lightning.report.markdown import has, table
from vfl_lightning.report.privacy import privacy
from vfl_lightning.report.recipe_alignment import alignment
from vfl_lightning.report.recipe_audit import audit
from vfl_lightning.report.recipe_cascade import ATTACKS, cascade
from vfl_lightning.report.recipe_fedbcd import fedbcd
from vfl_lightning.report.recipe_fedvs import fedvs
from vfl_lightning.report.recipe_pbm import pbm
from vfl_lightning.report.runs import ReportError, Run

PRIORITY = ("fedvs", "fedbcd", "cascade", "pbm")
"""The order in which the papers' recipes are chosen when runs of several are present."""


def choose_recipe(runs: Sequence[Run]) -> str | None:
    """The recipe for the runs: audit when they ran one, else the first recipe of
    :data:`PRIORITY` in which an algo present appears as more than a shared baseline (its
    config's ``report.recipes``)."""
    if any(key.startswith("audit/") for run in runs for key in run.results):
        return "audit"
    if any(key in run.results for run in runs for key in ATTACKS):
        return "cascade"
    for name in PRIORITY:
        if any(run.in_recipe(name, baselines=False) for run in runs):
            return name
    return None


def check_recipe(recipe: str, runs: Sequence[Run]) -> None:
    """Refuse a recipe none of whose algos is among the runs (its figures would be empty)."""
    if recipe == "privacy":
        if not any(key.startswith("attack/") for run in runs for key in run.results):
            raise ReportError(
                "--recipe privacy needs runs with an attack (train.py attack=feature_reconstruction, "
                "norm_scoring, direction_scoring, model_completion or label_inference); these "
                "runs ran none"
            )
        return
    if recipe == "alignment":
        if len({run.value("data.overlap") for run in runs}) < 2:
            raise ReportError(
                "--recipe alignment draws accuracy against data.overlap and needs runs of at "
                "least two overlaps (train.py -m data.overlap=0.5,1.0 ...)"
            )
        return
    if recipe == "audit":
        if not any(key.startswith("audit/") for run in runs for key in run.results):
            raise ReportError(
                "--recipe audit needs runs with an audit (train.py audit=canary or "
                "audit=canary_sample); these runs ran none"
            )
        return
    algos = sorted({run.algo for run in runs})
    if not any(run.in_recipe(recipe) for run in runs):
        suggested = choose_recipe(runs)
        raise ReportError(
            f"--recipe {recipe} needs runs of an algo whose config lists it in report.recipes; "
            f"these runs are {', '.join(algos)} (use --recipe {suggested or 'none'} or auto)"
        )


def overview(ctx: Context, plotted: Sequence[tuple[str, str]] = ()) -> Section:
    """The chosen metric over the chosen axis (unless a recipe figure in ``plotted`` already
    draws it), and one table of final values per grouping."""
    section = Section(
        "Runs",
        f"{len(ctx.runs)} runs in {len(ctx.groups)} groups (runs that differ only by seed). "
        "Lines: mean over seeds; bands and ±: sample standard deviation over seeds (one seed: "
        "the value alone).",
    )
    if (ctx.x, ctx.y) not in plotted:
        section.add_figure(
            "curves",
            figures.curves(
                ctx.groups,
                ctx.x,
                [ctx.y],
                f"{ctx.title}: {figures.label(ctx.y)}",
                log_x=ctx.x == "comm/total_mb",
            ),
            f"{figures.label(ctx.y)} against {figures.label(ctx.x)}",
        )
    columns = [ctx.y, "test/acc", "test/acc_clean", "privacy/feature_eps", "comm/total_mb"]
    columns = [c for c in dict.fromkeys(columns) if has(ctx.runs, c)]
    header = ["group", "seeds", "epochs", *columns, "rounds", "simulated s"]
    rows = []
    for group in ctx.groups:
        epochs = sorted(
            {
                int(run.value("epochs"))
                for run in group.runs
                if run.results.get("epochs") is not None
            }
        )
        rows.append(
            [
                group.label,
                len(group.runs),
                ",".join(map(str, epochs)),
                *(summarize(group.values_of(c)).text() for c in columns),
                summarize(group.values_of("comm/rounds")).text(0),
                summarize(group.values_of("time/simulated_s")).text(3, significant=True),
            ]
        )
    section.tables.append(table(header, rows))
    section.panels.append(Panel("line", f"{ctx.y} over {ctx.x}", [ctx.y], ctx.x))
    return section


BUILDERS: dict[str, Callable[[Context], Section]] = {
    "pbm": pbm,
    "fedbcd": fedbcd,
    "cascade": cascade,
    "fedvs": fedvs,
    "privacy": privacy,
    "audit": audit,
    "alignment": alignment,
}
