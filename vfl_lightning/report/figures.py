"""Matplotlib figures for reports: seed-averaged curves with ±std bands (one panel or facets), one
colour family per algo in every figure, plain-number log axes, every axis labelled with its unit."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from vfl_lightning.report.aggregate import mean_curve  # noqa: E402
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
# One colour family per algo (its config's ``report.colormap``), the same in every figure: the
# algo's single group takes the family's dark shade, several groups of one algo (b, β; Q; K) take
# lighter to darker shades. An algo without one gets one of these, by a hash of its name.
OTHER_COLORMAPS = ("YlGnBu", "PuRd", "copper", "pink", "summer")
# legend entries beyond which a one-panel figure puts its legend below the panel
MANY = 12
# x axes whose values are whole numbers: integer ticks only
INTEGER_AXES = ("epoch", "comm/rounds", "global_step")


def label(key: str) -> str:
    return LABELS.get(key, key)


def algo_colormap(group: Group):
    """The colour family of the group's algo."""
    name = group.style("colormap")
    if name is None:
        name = OTHER_COLORMAPS[zlib.crc32(group.algo.encode()) % len(OTHER_COLORMAPS)]
    return plt.get_cmap(name)


def algo_color(group: Group):
    """The colour of the group's algo when it has one group in a figure."""
    return algo_colormap(group)(0.75)


def group_colors(groups: Sequence[Group]) -> list:
    """A colour per group: its algo's family, shaded by its rank among that algo's groups."""
    counts: dict[str, int] = {}
    for group in groups:
        counts[group.algo] = counts.get(group.algo, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for group in groups:
        rank = seen.get(group.algo, 0)
        seen[group.algo] = rank + 1
        n = counts[group.algo]
        shade = 0.75 if n == 1 else float(np.linspace(0.45, 0.95, n)[rank])
        out.append(algo_colormap(group)(shade))
    return out


def plain_log_axis(ax, which: str = "x") -> None:
    """A log-scaled axis ticked at 1, 2, 5 × 10^k and labelled as plain numbers (5, 10, 20)."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def new_figure(title: str, width: float = 7.0, height: float = 4.4, columns: int = 1):
    fig, axes = plt.subplots(
        1, columns, figsize=(width, height), layout="constrained", sharey=True, squeeze=False
    )
    fig.suptitle(title, fontsize=11)
    for ax in axes[0]:
        ax.grid(True, alpha=0.3)
    return fig, list(axes[0])


def legend(ax, entries: int, title: str | None = None) -> None:
    """Inside the axes for a few entries, outside on the right for more (never over curves)."""
    if entries > 3:
        ax.legend(
            fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title=title
        )
    else:
        ax.legend(fontsize=8, loc="best", title=title)


def draw_curves(ax, groups: Sequence[Group], x: str, ys: Sequence[str]) -> int:
    """One line per group and metric (mean over seeds) with a ±std band; the second metric of
    ``ys`` dashed. A curve equal to one drawn before is dotted and says so in its label (else
    only one would be visible). Returns the number of curves drawn."""
    drawn: list[tuple[int, str, np.ndarray, np.ndarray]] = []
    step = "post" if x in ("time/simulated_s", "comm/total_mb") else None
    for group, color in zip(groups, group_colors(groups)):
        for index, y in enumerate(ys):
            curve = mean_curve(group.runs, x, y)
            if curve is None:
                continue
            name = f"{group.label}, noise-free" if index else group.label
            style = "-" if index == 0 else "--"
            twin = next(
                (
                    other
                    for i, other, ox, om in drawn
                    if i == index and np.array_equal(ox, curve.x) and np.array_equal(om, curve.mean)
                ),
                None,
            )
            if twin is not None:
                name, style = f"{name} (identical to {twin})", ":"
            drawn.append((index, name, curve.x, curve.mean))
            band = dict(color=color, alpha=0.15, linewidth=0)
            if step:
                ax.step(curve.x, curve.mean, where=step, color=color, linestyle=style, label=name)
                ax.fill_between(
                    curve.x, curve.mean - curve.std, curve.mean + curve.std, step=step, **band
                )
            else:
                marker = "." if len(curve.x) <= 40 else None
                ax.plot(
                    curve.x, curve.mean, color=color, linestyle=style, label=name, marker=marker
                )
                ax.fill_between(curve.x, curve.mean - curve.std, curve.mean + curve.std, **band)
    return len(drawn)


def finish_axes(ax, x: str, log_x: bool, hline: tuple[float, str] | None) -> int:
    """Axis scale, integer ticks for counts, and the reference line; returns legend entries it
    added."""
    if log_x:
        plain_log_axis(ax)
    elif x in INTEGER_AXES:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if hline is not None and hline[0] is not None:
        ax.axhline(hline[0], color="black", linestyle=":", linewidth=1, label=hline[1])
        return 1
    return 0


def curves(
    groups: Sequence[Group],
    x: str,
    ys: Sequence[str],
    title: str,
    *,
    log_x: bool = False,
    hline: tuple[float, str] | None = None,
) -> Figure | None:
    """Curves of ``ys`` against ``x`` per group in one panel; ``None`` when nothing to draw.
    More than :data:`MANY` entries: the legend goes below the panel (two columns for short
    labels, one for long ones), the figure growing with it, so no label is cut."""
    entries = len(groups) * len(ys)
    columns = 2 if max((len(g.label) for g in groups), default=0) <= 55 else 1
    rows = math.ceil(entries / columns) if entries > MANY else 0
    fig, (ax,) = new_figure(title, height=4.4 + 0.16 * rows)
    drawn = draw_curves(ax, groups, x, ys)
    if not drawn:
        plt.close(fig)
        return None
    drawn += finish_axes(ax, x, log_x, hline)
    ax.set_xlabel(label(x))
    ax.set_ylabel(
        label(ys[0]) if len(ys) == 1 else "accuracy (solid: deployed, dashed: noise-free)"
    )
    if rows:
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(
            handles, labels, loc="outside lower center", ncol=columns, fontsize=7, frameon=False
        )
    else:
        legend(ax, drawn)
    return fig


def facet_curves(
    facets: Sequence[tuple[str, Sequence[Group]]],
    x: str,
    y: str,
    title: str,
    *,
    log_x: bool = False,
    hline: tuple[float, str] | None = None,
) -> Figure | None:
    """One panel per (subtitle, groups) facet, sharing the y axis: many groups that end close
    together stay readable."""
    facets = [(name, groups) for name, groups in facets if groups]
    if len(facets) < 2:
        return curves(facets[0][1], x, [y], title, log_x=log_x, hline=hline) if facets else None
    fig, axes = new_figure(title, width=3.3 * len(facets) + 0.6, height=4.0, columns=len(facets))
    total = 0
    for ax, (name, groups) in zip(axes, facets):
        drawn = draw_curves(ax, groups, x, [y])
        total += drawn
        drawn += finish_axes(ax, x, log_x, hline)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(label(x))
        if drawn:
            ax.legend(fontsize=7, loc="lower right")
    if not total:
        plt.close(fig)
        return None
    axes[0].set_ylabel(label(y))
    return fig


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=120)
    plt.close(fig)
