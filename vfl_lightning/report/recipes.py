"""The papers' figures and tables as report recipes (pbm, fedbcd, cascade, fedvs) plus the
section every report has (the chosen metric over the chosen axis, one table per grouping)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from matplotlib.figure import Figure

from vfl_lightning.report import figures
from vfl_lightning.report.aggregate import Summary, step_values, summarize
from vfl_lightning.report.runs import Group, Run, relabel

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
}
SCHEDULES = {
    "fedsgd": "FedSGD",
    "fedbcd": "FedBCD-p",
    "fedbcd_s": "FedBCD-s",
    "fedpbcd": "FedPBCD-p",
}
ATTACKS = {
    "attack/label_inference/acc": "curious client",
    "attack/label_inference/eavesdropper_acc": "eavesdropper",
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


def choose_recipe(runs: Sequence[Run]) -> str | None:
    """The recipe for the algos present (FedVS, FedBCD, cascade, PBM in that priority)."""
    algos = {run.algo for run in runs}
    if any(key in run.results for run in runs for key in ATTACKS):
        return "cascade"
    for name in ("fedvs", "fedbcd", "cascade"):
        if algos & (set(FAMILIES[name]) - BASELINES):
            return name
    if algos & {"pbm", "ldp"}:
        return "pbm"
    return None


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


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


def has(runs: Sequence[Run], key: str) -> bool:
    return any(math.isfinite(run.value(key)) for run in runs)


def final_prefix(runs: Sequence[Run]) -> str:
    """``test`` when the runs were tested, else ``val``."""
    return "test" if has(runs, "test/acc") else "val"


def number(value: float, digits: int = 4) -> str:
    return "–" if not math.isfinite(value) else f"{value:.{digits}g}"


# --------------------------------------------------------------------------- every report
def overview(ctx: Context) -> Section:
    """The chosen metric over the chosen axis, and one table of final values per grouping."""
    section = Section(
        "Runs",
        f"{len(ctx.runs)} runs in {len(ctx.groups)} groups (runs that differ only by seed). "
        "Lines: mean over seeds; bands and ±: sample standard deviation over seeds.",
    )
    section.add_figure(
        "curves",
        figures.curves(ctx.groups, ctx.x, [ctx.y], f"{ctx.title}: {figures.label(ctx.y)}"),
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
                summarize(group.values_of("time/simulated_s")).text(1),
            ]
        )
    section.tables.append(table(header, rows))
    section.panels.append(Panel("line", f"{ctx.y} over {ctx.x}", [ctx.y], ctx.x))
    return section


# --------------------------------------------------------------------------- PBM-VFL
def pbm(ctx: Context) -> Section:
    """Accuracy against feature ε per mechanism and (b, β), noisy and clean; accuracy per epoch;
    MB to target; the exact per-release privacy of the (b, β) present."""
    section = Section(
        "PBM-VFL: accuracy, privacy, communication",
        "Deployed accuracy evaluates through the mechanism (filled markers, solid lines); "
        "noise-free accuracy evaluates the plain sum of the clean embeddings, as the PBM authors' "
        "code does (open markers, dashed lines). Feature ε at δ = 1e-5 after the whole run.",
    )
    prefix = final_prefix(ctx.runs)
    groups = ordered(ctx.groups, "pbm")
    private = [g for g in groups if g.algo in ("pbm", "ldp")]
    baselines = [g for g in groups if g.algo not in ("pbm", "ldp")]
    series = {}
    for algo in ("pbm", "ldp"):
        entries = []
        for group in (g for g in private if g.algo == algo):
            entries.append((group, "privacy/feature_eps", f"{prefix}/acc", "filled"))
            entries.append((group, "privacy/feature_eps", f"{prefix}/acc_clean", "open"))
        if entries:
            series[algo] = entries
    lines = [
        (f"{g.label} (no privacy)", summarize(g.values_of(f"{prefix}/acc")).mean) for g in baselines
    ]
    section.add_figure(
        "pbm_acc_vs_eps",
        figures.points(
            series,
            f"{ctx.title}: {prefix} accuracy against feature privacy",
            figures.label("privacy/feature_eps"),
            f"{prefix} accuracy (filled: deployed, open: noise-free)",
            log_x=True,
            lines=lines,
        ),
        f"{prefix} accuracy against feature ε per mechanism and (b, β)",
    )
    for algo in ("pbm", "ldp"):
        chosen = [g for g in private if g.algo == algo]
        if chosen:
            section.add_figure(
                f"{algo}_acc_vs_epoch",
                figures.curves(
                    [*chosen, *baselines],
                    "epoch",
                    ["val/acc", "val/acc_clean"],
                    f"{ctx.title}: {algo} validation accuracy per (b, β)",
                ),
                f"{algo}: validation accuracy per epoch (solid: deployed, dashed: noise-free)",
            )
    if has(ctx.runs, "mb_to_target"):
        target = ctx.runs[0].results.get("target_metric"), ctx.runs[0].results.get("target_value")
        section.add_figure(
            "pbm_mb_to_target",
            figures.bars(
                [g.label for g in groups],
                {"MB to target": [summarize(g.values_of("mb_to_target")) for g in groups]},
                f"{ctx.title}: communication until {target[0]} ≥ {target[1]}",
                "MB (uplink + downlink + peer) to target",
            ),
            f"MB until {target[0]} first reached {target[1]} ('never': not within the run)",
        )
    rows = []
    for group in groups:
        run = group.runs[0]
        noisy = group.algo in ("pbm", "ldp")
        rows.append(
            [
                group.algo,
                run.setting("mechanism.b", "-") if noisy else "-",
                run.setting("mechanism.beta", "-") if noisy else "-",
                len(group.runs),
                summarize(group.values_of(f"{prefix}/acc")).text(),
                summarize(group.values_of(f"{prefix}/acc_clean")).text() if noisy else "–",
                summarize(group.values_of("train/acc")).text(),
                summarize(group.values_of("privacy/feature_eps")).text(1) if noisy else "∞",
                summarize(group.values_of("mb_to_target")).text(3),
                summarize(group.values_of("comm/uplink_mb")).text(3),
                summarize(group.values_of("comm/total_mb")).text(3),
            ]
        )
    section.tables.append(
        table(
            [
                "algo",
                "b",
                "β",
                "seeds",
                f"{prefix} acc",
                f"{prefix} acc (noise-free)",
                "train acc",
                "feature ε",
                "MB to target",
                "uplink MB",
                "total MB",
            ],
            rows,
        )
    )
    section.tables.append(privacy_table(private))
    section.panels += [
        Panel("line", "validation accuracy per epoch", ["val/acc", "val/acc_clean"], "epoch"),
        Panel("line", "validation accuracy against feature ε", ["val/acc"], "privacy/feature_eps"),
        Panel("bar", "MB to target", ["mb_to_target"]),
    ]
    return section


def privacy_table(groups: Sequence[Group]) -> str:
    """Exact per-release PBM RDP (one coordinate) for the (b, β, M) present, next to the paper's
    asymptotic forms: implied C0 = ε_feat / (bβ²α/M), and the sample/feature ratio against the
    paper's S_M(α)/α."""
    from vfl_lightning.privacy.analysis import pbm_rdp, sample_privacy_factor

    settings = sorted(
        {
            (
                int(g.runs[0].setting("mechanism.b")),
                float(g.runs[0].setting("mechanism.beta")),
                int(g.runs[0].results["num_parties"]),
            )
            for g in groups
            if g.runs[0].setting("mechanism.b") is not None
            and g.runs[0].setting("mechanism.beta") is not None
        }
    )
    if not settings:
        return ""
    orders = np.array([2.0, 8.0, 32.0])
    rows = []
    for b, beta, m in settings:
        feature = pbm_rdp(orders=orders, b=b, beta=beta, num_parties=m)
        sample = pbm_rdp(orders=orders, b=b, beta=beta, num_parties=m, num_changed=m)
        factor = sample_privacy_factor(orders, m) / orders if m >= 2 else np.full(3, np.nan)
        implied = feature / (b * beta**2 * orders / m)
        for i, alpha in enumerate(orders):
            rows.append(
                [
                    b,
                    beta,
                    m,
                    f"{alpha:g}",
                    number(feature[i]),
                    number(implied[i], 3),
                    number(sample[i]),
                    number(sample[i] / feature[i], 3),
                    number(factor[i], 3),
                ]
            )
    return (
        "Exact PBM Rényi DP of one release (one coordinate) for the (b, β, M) above, beside the "
        "paper's forms (implied C0 = exact ε_feat / (bβ²α/M)):\n\n"
        + table(
            [
                "b",
                "β",
                "M",
                "α",
                "exact ε_feat",
                "implied C0",
                "exact ε_sample",
                "ε_sample / ε_feat",
                "paper S_M(α)/α",
            ],
            rows,
        )
    )


# --------------------------------------------------------------------------- FedBCD
def fedbcd(ctx: Context) -> Section:
    """Rounds to target against Q per schedule; the validation metric over rounds."""
    section = Section(
        "FedBCD: rounds to target",
        "Q local updates per exchange; rounds to target are counted by the TargetTracker at "
        "every validation (mean over the seeds that reached it, (k/n) when only k did).",
    )
    metric = "val/auroc" if has(ctx.runs, "val/auroc") else ctx.y
    groups = ordered(ctx.groups, "fedbcd")
    series: dict[str, list] = {}
    for group in groups:
        name = SCHEDULES.get(group.algo, group.algo)
        series.setdefault(name, []).append(
            (group, "algo.local_steps", "rounds_to_target", "filled")
        )
    target = ctx.runs[0].results.get("target_metric"), ctx.runs[0].results.get("target_value")
    section.add_figure(
        "fedbcd_rounds_vs_q",
        figures.points(
            series,
            f"{ctx.title}: rounds until {target[0]} ≥ {target[1]}",
            "local updates per exchange Q",
            "communication rounds to target",
            annotate=False,
            connect=True,
            log_x=True,
            dodge=0.04,
            integer_ticks=True,
        ),
        "rounds to target against Q per schedule (p: parallel, s: sequential, proximal)",
    )
    section.add_figure(
        "fedbcd_metric_vs_rounds",
        figures.curves(groups, "comm/rounds", [metric], f"{ctx.title}: {figures.label(metric)}"),
        f"{figures.label(metric)} over communication rounds",
    )
    rows = []
    for group in groups:
        reached = summarize(group.values_of("rounds_to_target"))
        per_seed = ", ".join(
            "never" if not math.isfinite(v) else f"{v:.0f}"
            for v in group.values_of("rounds_to_target")
        )
        rows.append(
            [
                SCHEDULES.get(group.algo, group.algo),
                number(group.runs[0].value("algo.local_steps"), 3),
                number(group.runs[0].value("algo.mu"), 3),
                len(group.runs),
                reached.text(1),
                per_seed,
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
                "seeds",
                "rounds to target",
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


# --------------------------------------------------------------------------- cascaded hybrid
def cascade(ctx: Context) -> Section:
    """Accuracy per epoch and per MB per algo; label-inference accuracy (curious client,
    eavesdropper) when the attack ran."""
    section = Section(
        "Cascaded hybrid optimization: accuracy, communication, label inference",
        "Validation accuracy over epochs and over communicated MB; the table gives the final "
        "test accuracy (%).",
    )
    ranked = ordered(ctx.groups, "cascade")
    attacked = relabel([g for g in ranked if has(g.runs, "attack/label_inference/acc")])
    groups = relabel([g for g in ranked if not has(g.runs, "attack/label_inference/acc")])
    prefix = final_prefix(ctx.runs)
    section.add_figure(
        "cascade_acc_vs_epoch",
        figures.curves(groups, "epoch", ["val/acc"], f"{ctx.title}: validation accuracy"),
        "validation accuracy per epoch",
    )
    section.add_figure(
        "cascade_acc_vs_mb",
        figures.curves(
            groups,
            "comm/total_mb",
            ["val/acc"],
            f"{ctx.title}: accuracy against communication",
            log_x=True,
        ),
        "validation accuracy against communicated MB",
    )
    rows = []
    for group in groups:
        hidden = group.runs[0].setting("head.hidden")
        epochs = sorted(
            {int(r.value("epochs")) for r in group.runs if math.isfinite(r.value("epochs"))}
        )
        rows.append(
            [
                group.label,
                int(group.runs[0].value("num_parties")),
                "-" if not hidden else "/".join(map(str, hidden)),
                len(group.runs),
                ",".join(map(str, epochs)),
                summarize(group.values_of(f"{prefix}/acc")).text(1, scale=100),
                summarize(group.values_of("comm/uplink_mb")).text(2),
                summarize(group.values_of("comm/downlink_mb")).text(4),
                summarize(group.values_of("comm/rounds")).text(0),
            ]
        )
    section.tables.append(
        ""
        if not rows
        else table(
            [
                "group",
                "clients",
                "server hidden",
                "seeds",
                "epochs",
                f"{prefix} acc (%)",
                "uplink MB",
                "downlink MB",
                "rounds",
            ],
            rows,
        )
    )
    if attacked:
        scaled = {
            name: [scale(summarize(g.values_of(key)), 100) for g in attacked]
            for key, name in ATTACKS.items()
        }
        section.add_figure(
            "cascade_label_inference",
            figures.bars(
                [g.label for g in attacked],
                scaled,
                f"{ctx.title}: label inference by client 0",
                "labels inferred (%)",
                missing_text="n/a",
            ),
            "label-inference accuracy of a curious client and of an eavesdropper",
        )
        section.tables.append(
            table(
                ["group", "clients", "seeds", "curious client (%)", "eavesdropper (%)"],
                [
                    [
                        g.label,
                        int(g.runs[0].value("num_parties")),
                        len(g.runs),
                        *(summarize(g.values_of(k)).text(1, scale=100) for k in ATTACKS),
                    ]
                    for g in attacked
                ],
            )
        )
        section.panels.append(Panel("bar", "label inference", list(ATTACKS)))
    section.panels += [
        Panel("line", "validation accuracy per epoch", ["val/acc"], "epoch"),
        Panel("line", "validation accuracy against MB", ["val/acc"], "comm/total_mb"),
    ]
    return section


def scale(summary: Summary, factor: float) -> Summary:
    return Summary(summary.mean * factor, summary.std * factor, summary.count, summary.total)


# --------------------------------------------------------------------------- FedVS
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
    section.add_figure(
        "fedvs_acc_vs_time",
        figures.curves(
            groups, "time/simulated_s", ["val/acc"], f"{ctx.title}: validation accuracy"
        ),
        "validation accuracy over simulated seconds",
    )
    times = list(ctx.times or default_times(ctx.runs))
    rows = []
    for group in groups:
        at = []
        for run in group.runs:
            xs = np.array([r["time/simulated_s"] for r in run.curve])
            ys = np.array([r.get("val/acc", math.nan) for r in run.curve])
            at.append(step_values(xs, ys, np.array(times)))
        columns = np.array(at).T
        rate = [r.value("comm/rounds") / r.value("time/simulated_s") for r in group.runs]
        rows.append(
            [
                group.label,
                int(group.runs[0].value("fedvs/K")),
                int(group.runs[0].value("fedvs/T")),
                int(group.runs[0].value("fedvs/R")),
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
    section.panels.append(
        Panel("line", "validation accuracy over simulated time", ["val/acc"], "time/simulated_s")
    )
    return section


def default_times(runs: Sequence[Run]) -> list[float]:
    """Five simulated times up to the shortest run's last validation, on round numbers."""
    last = min(run.curve[-1]["time/simulated_s"] for run in runs if run.curve)
    return sorted({float(f"{last * f:.2g}") for f in (0.1, 0.2, 0.4, 0.7, 1.0)})


BUILDERS: dict[str, Callable[[Context], Section]] = {
    "pbm": pbm,
    "fedbcd": fedbcd,
    "cascade": cascade,
    "fedvs": fedvs,
}
