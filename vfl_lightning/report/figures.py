"""Matplotlib figures for reports: seed-averaged curves with ±std bands, points with error bars,
bar charts; every axis labelled with its unit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from vfl_lightning.report.aggregate import mean_curve, summarize  # noqa: E402
from vfl_lightning.report.runs import Group  # noqa: E402

LABELS = {
    "epoch": "training epochs",
    "global_step": "server updates",
    "comm/rounds": "communication rounds",
    "comm/total_mb": "communication (MB, uplink + downlink + peer)",
    "time/simulated_s": "simulated time (s)",
    "privacy/feature_eps": "feature ε (δ = 1e-5)",
    "val/acc": "validation accuracy",
    "val/acc_clean": "validation accuracy, noise-free evaluation",
    "val/auroc": "validation AUC",
    "val/auprc": "validation AUPRC",
    "val/loss": "validation loss",
    "test/acc": "test accuracy",
    "test/acc_clean": "test accuracy, noise-free evaluation",
    "test/auroc": "test AUC",
}


def label(key: str) -> str:
    return LABELS.get(key, key)


def colors(count: int) -> list:
    """Distinct colors: tab10, or tab20 with its dark shades first beyond ten."""
    if count <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(count)]
    cmap = plt.get_cmap("tab20")
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return [cmap(order[i % 20]) for i in range(count)]


def new_figure(title: str, width: float = 7.0, height: float = 4.4) -> tuple[Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    return fig, ax


def curves(
    groups: Sequence[Group], x: str, ys: Sequence[str], title: str, *, log_x: bool = False
) -> Figure | None:
    """One line per group and metric (mean over seeds) with a ±std band; the second metric of
    ``ys`` is dashed. ``None`` when no run has these columns."""
    fig, ax = new_figure(title)
    drawn = 0
    for group, color in zip(groups, colors(len(groups))):
        for index, y in enumerate(ys):
            curve = mean_curve(group.runs, x, y)
            if curve is None:
                continue
            name = f"{group.label}, noise-free" if index else group.label
            line = "-" if index == 0 else "--"
            step = "post" if x in ("time/simulated_s", "comm/total_mb") else None
            if step:
                ax.step(curve.x, curve.mean, where=step, color=color, linestyle=line, label=name)
                ax.fill_between(
                    curve.x,
                    curve.mean - curve.std,
                    curve.mean + curve.std,
                    step=step,
                    color=color,
                    alpha=0.15,
                    linewidth=0,
                )
            else:
                ax.plot(
                    curve.x,
                    curve.mean,
                    color=color,
                    linestyle=line,
                    label=name,
                    marker="." if len(curve.x) <= 40 else None,
                )
                ax.fill_between(
                    curve.x,
                    curve.mean - curve.std,
                    curve.mean + curve.std,
                    color=color,
                    alpha=0.15,
                    linewidth=0,
                )
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel(label(x))
    ax.set_ylabel(
        label(ys[0]) if len(ys) == 1 else "accuracy (solid: deployed, dashed: noise-free)"
    )
    if log_x:
        ax.set_xscale("log")
    legend(ax, drawn)
    return fig


def legend(ax: plt.Axes, entries: int) -> None:
    if entries > 8:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    else:
        ax.legend(fontsize=8)


def bars(
    names: Sequence[str],
    series: dict[str, Sequence],
    title: str,
    ylabel: str,
    *,
    missing_text: str = "never",
) -> Figure:
    """Grouped bars: one cluster per name, one bar per series, each a :class:`Summary`; a bar
    whose summary has no value is drawn as text (``missing_text``)."""
    fig, ax = new_figure(title, width=max(7.0, 0.6 * len(names) * len(series)))
    width = 0.8 / max(len(series), 1)
    for index, ((series_name, summaries), color) in enumerate(
        zip(series.items(), colors(len(series)))
    ):
        for position, summary in enumerate(summaries):
            x = position + (index - (len(series) - 1) / 2) * width
            if summary.count == 0:
                ax.text(x, 0, missing_text, rotation=90, ha="center", va="bottom", fontsize=7)
                continue
            ax.bar(
                x,
                summary.mean,
                width,
                yerr=summary.std if summary.count > 1 else None,
                color=color,
                capsize=3,
                label=series_name if position == 0 else None,
            )
    ax.set_xticks(range(len(names)), names, rotation=30 if len(names) > 3 else 0, ha="right")
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8)
    return fig


def points(
    series: dict[str, list[tuple[Group, str, str, str]]],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    log_x: bool = False,
    lines: Sequence[tuple[str, float]] = (),
    annotate: bool = True,
    connect: bool = False,
    dodge: float = 0.0,
    integer_ticks: bool = False,
) -> Figure | None:
    """Mean ± std of a final value against another, one marker per group.

    ``series`` maps a legend name to (group, x key, y key, marker style) tuples; marker style
    ``"filled"`` or ``"open"``. ``lines``: horizontal reference lines (name, y). ``connect``:
    join a series' filled markers in x order. ``dodge``: shift series i by the factor
    (1 + dodge)^(i - centre) in x, so series at the same x (log scale) do not hide each other.
    ``integer_ticks``: one tick per x value present, written as an integer (Q = 1, 3, 10, ...).
    """
    ticks = set()
    fig, ax = new_figure(title)
    drawn = 0
    centre = (len(series) - 1) / 2
    for index, ((name, entries), color) in enumerate(zip(series.items(), colors(len(series)))):
        shift = (1.0 + dodge) ** (index - centre)
        labelled = False
        path = []
        for group, x_key, y_key, style in entries:
            xs, ys = summarize(group.values_of(x_key)), summarize(group.values_of(y_key))
            if xs.count == 0 or ys.count == 0:
                continue
            face = color if style == "filled" else "none"
            ax.errorbar(
                xs.mean * shift,
                ys.mean,
                yerr=ys.std,
                fmt="o",
                color=color,
                markerfacecolor=face,
                capsize=3,
                label=None if labelled else name,
            )
            labelled = True
            if style == "filled":
                path.append((xs.mean * shift, ys.mean))
            ticks.add(xs.mean)
            if annotate and style == "filled":
                short = group.label.split(" ", 1)[1] if " " in group.label else ""
                ax.annotate(
                    short,
                    (xs.mean * shift, ys.mean),
                    fontsize=6,
                    xytext=(4, 3),
                    textcoords="offset points",
                )
            drawn += 1
        if connect and len(path) > 1:
            ax.plot(*zip(*sorted(path)), color=color, alpha=0.6)
    for (name, y), color in zip(lines, colors(len(series) + len(lines))[len(series) :]):
        if math.isfinite(y):
            ax.axhline(y, color=color, linestyle=":", label=name)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_x:
        ax.set_xscale("log")
    if integer_ticks:
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
        ax.minorticks_off()
    legend(ax, len(series) + len(lines))
    return fig


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=120)
    plt.close(fig)
