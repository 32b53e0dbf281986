"""Report charts of final values: mean ± std points of one value against another (markers by
setting, "not reached" marked) and horizontal bars (text for missing values, reference lines)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from vfl_lightning.report.aggregate import Summary, summarize
from vfl_lightning.report.figures import algo_color, legend, new_figure, plain_log_axis
from vfl_lightning.report.runs import Group

MARKERS = (
    "o",
    "s",
    "^",
    "D",
    "v",
    "P",
    "X",
    "*",
    "h",
    "<",
    ">",
    "p",
    "d",
    "8",
    "H",
    "1",
    "2",
    "3",
    "4",
    "+",
)


def points(
    series: dict[str, list[tuple[Group, str, str, str]]],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    log_x: bool = False,
    log_y: bool = False,
    lines: Sequence[tuple[str, float]] = (),
    marker_by: Callable[[Group], str] | None = None,
    connect: bool = False,
    dodge: float = 0.0,
    integer_ticks: bool = False,
    not_reached: bool = False,
) -> Figure | None:
    """Mean ± std of a final value against another, one marker per group.

    ``series`` maps a legend name to (group, x key, y key, marker style) tuples (style
    ``"filled"`` or ``"open"``); a series takes its first group's algo colour. ``marker_by``:
    the marker shape tells apart the groups' settings (legend in grey), instead of text beside
    each point. ``lines``: horizontal reference lines (name, y). ``connect``: join a series'
    filled markers in x order. ``dodge``: shift series i by (1 + dodge)^(i - centre) in x.
    ``integer_ticks``: one tick per x value present. ``not_reached``: a group with an x but no
    y value in any run is drawn as a triangle on the top edge (and ``k/n`` is written beside
    a point that only k of n runs reached).
    """
    fig, (ax,) = new_figure(title)
    top = blended_transform_factory(ax.transData, ax.transAxes)
    shapes: dict[str, str] = {}
    ticks, handles = set(), []
    centre = (len(series) - 1) / 2
    drawn = missing = 0
    for index, (name, entries) in enumerate(series.items()):
        if not entries:
            continue
        color = algo_color(entries[0][0])
        shift = (1.0 + dodge) ** (index - centre)
        path = []
        for group, x_key, y_key, style in entries:
            xs, ys = summarize(group.values_of(x_key)), summarize(group.values_of(y_key))
            if xs.count == 0:
                continue
            ticks.add(xs.mean)
            x = xs.mean * shift if log_x else xs.mean + (shift - 1.0)
            if ys.count == 0:
                if not_reached:
                    ax.plot(x, 0.97, "v", color=color, transform=top, clip_on=False)
                    missing += 1
                continue
            marker = "o"
            if marker_by is not None:
                marker = shapes.setdefault(marker_by(group), MARKERS[len(shapes) % len(MARKERS)])
            face = color if style == "filled" else "none"
            ax.errorbar(
                x, ys.mean, yerr=ys.std, fmt=marker, color=color, markerfacecolor=face, capsize=3
            )
            if not_reached and ys.count < ys.total:
                ax.annotate(
                    f"{ys.count}/{ys.total}",
                    (x, ys.mean),
                    fontsize=7,
                    xytext=(5, -3),
                    textcoords="offset points",
                )
            if style == "filled":
                path.append((x, ys.mean))
            drawn += 1
        if connect and len(path) > 1:
            ax.plot(*zip(*sorted(path)), color=color, alpha=0.6)
        line = "-" if connect else ""
        handles.append(Line2D([], [], color=color, marker="o", linestyle=line, label=name))
    for name, y in lines:
        if math.isfinite(y):
            ax.axhline(y, color="black", linestyle=":", linewidth=1)
            handles.append(Line2D([], [], color="black", linestyle=":", label=name))
    if not drawn and not missing:
        plt.close(fig)
        return None
    for setting, marker in shapes.items():
        handles.append(Line2D([], [], color="gray", marker=marker, linestyle="", label=setting))
    if missing:
        handles.append(
            Line2D([], [], color="gray", marker="v", linestyle="", label="not reached (top edge)")
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_x:
        plain_log_axis(ax, "x")
    if log_y and drawn:
        plain_log_axis(ax, "y")
    if not drawn:  # only "not reached" markers: no y values to scale
        ax.set_yticks([])
    if integer_ticks:
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
        ax.minorticks_off()
    if len(ticks) == 1:  # one x value: a narrow range around it, not the whole width
        (only,) = ticks
        ax.set_xlim(*((only / 3, only * 3) if log_x else (only - 1, only + 1)))
    ax.legend(handles=handles, **legend_place(len(handles)))
    if len(handles) > 4:  # the legend is outside: widen the figure, not narrow the axes
        fig.set_size_inches(8.6, 4.4)
    return fig


def legend_place(entries: int) -> dict:
    if entries > 4:
        return {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "frameon": False}
    return {"fontsize": 8, "loc": "best"}


def bars(
    names: Sequence[str],
    series: dict[str, Sequence[Summary]],
    title: str,
    xlabel: str,
    *,
    missing_text: str = "not reached",
    reference: tuple[float, str] | None = None,
    colors: Sequence | None = None,
) -> Figure:
    """Horizontal bars: one row per name (top to bottom), one bar per series, each a
    :class:`Summary` (± std when several runs); a bar without any value is written as
    ``missing_text``, one that only k of n runs have is marked ``(k/n)``. ``reference``: a
    vertical line (value, label), e.g. chance."""
    rows = len(names) * max(len(series), 1)
    fig, (ax,) = new_figure(title, height=max(2.6, 0.28 * rows + 1.5))
    ax.grid(True, axis="x", alpha=0.3)
    ax.grid(False, axis="y")
    height = 0.8 / max(len(series), 1)
    palette = colors or [plt.get_cmap("tab10")(i) for i in range(len(series))]
    for index, ((series_name, summaries), color) in enumerate(zip(series.items(), palette)):
        for position, summary in enumerate(summaries):
            y = position + (index - (len(series) - 1) / 2) * height
            if summary.count == 0:
                ax.text(0, y, f" {missing_text}", va="center", fontsize=8, color="dimgray")
                continue
            ax.barh(
                y,
                summary.mean,
                height,
                xerr=summary.std if summary.count > 1 else None,
                color=color,
                capsize=3,
                label=series_name if position == 0 else None,
            )
            if summary.count < summary.total:
                ax.text(
                    summary.mean,
                    y,
                    f"  ({summary.count}/{summary.total})",
                    va="center",
                    fontsize=7,
                )
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first name on top, every row inside the frame
    ax.set_xlabel(xlabel)
    ax.set_xlim(left=0)
    entries = len(series) if len(series) > 1 else 0
    if reference is not None:
        ax.axvline(reference[0], color="black", linestyle=":", linewidth=1, label=reference[1])
        entries += 1
    if entries:
        legend(ax, entries)
    return fig
