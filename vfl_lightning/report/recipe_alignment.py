"""The alignment recipe: accuracy against ``data.overlap``, the share of the label holder's rows
that every party also holds, one line per algo; the rows the PSI kept and what it cost."""

from __future__ import annotations

from vfl_lightning.report import charts
from vfl_lightning.report.aggregate import summarize
from vfl_lightning.report.document import Context, Panel, Section
from vfl_lightning.report.markdown import has, number, table


def alignment(ctx: Context) -> Section:
    """Test (else validation) accuracy against the overlap per algo, and one table."""
    section = Section(
        "Partial overlap: accuracy against the rows the parties share",
        "data.overlap is the share of the label holder's rows that every party also holds; the "
        "ECDH-PSI keeps those rows (data/aligned_rows) before training, the label holder's split "
        "decides their stage. Mean ± std over seeds.",
    )
    metric = "test/acc" if has(ctx.runs, "test/acc") else ctx.y
    series: dict[str, list] = {}
    for group in sorted(ctx.groups, key=lambda g: (g.algo, g.runs[0].value("data.overlap"))):
        series.setdefault(group.algo, []).append((group, "data.overlap", metric, "filled"))
    section.add_figure(
        "overlap_acc_vs_overlap",
        charts.points(
            series,
            f"{ctx.title}: {metric} against the overlap",
            "data.overlap (share of the label holder's rows every party holds)",
            metric,
            connect=True,
        ),
        f"{metric} against data.overlap, one line per algo; mean ± std over seeds",
    )
    rows = []
    for group in sorted(ctx.groups, key=lambda g: (g.algo, g.runs[0].value("data.overlap"))):
        rows.append(
            [
                group.algo,
                number(group.runs[0].value("data.overlap"), 3),
                len(group.runs),
                summarize(group.values_of("data/aligned_rows")).text(0),
                summarize(group.values_of("comm/psi_mb")).text(3, significant=True),
                summarize(group.values_of(metric)).text(),
                summarize(group.values_of("time/simulated_s")).text(3, significant=True),
            ]
        )
    section.tables.append(
        table(
            ["algo", "overlap", "seeds", "aligned rows", "PSI MB", metric, "simulated s"],
            rows,
        )
    )
    section.panels.append(Panel("bar", f"{metric} per overlap", [metric]))
    return section
