"""Seed aggregation for reports: mean ± sample standard deviation of final values, and of curves
put on a common x grid (the last value at or before each x, as a reader of a log would)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vfl_lightning.report.runs import Run


@dataclass
class Summary:
    """Mean, sample standard deviation (0 for one run) and count of the finite values."""

    mean: float
    std: float
    count: int
    total: int

    def text(self, digits: int = 4, scale: float = 1.0, significant: bool = False) -> str:
        """``mean ± std`` with ``digits`` decimals (``significant``: significant digits, for
        values spanning magnitudes); the mean alone for one value; ``–`` when no value;
        ``(k/n)`` when only k of n runs have one."""
        if self.count == 0:
            return "–"
        form = f".{digits}g" if significant else f".{digits}f"
        out = f"{self.mean * scale:{form}}"
        if self.count > 1:
            out += f" ± {self.std * scale:{form}}"
        return out if self.count == self.total else f"{out} ({self.count}/{self.total})"


def summarize(values: Sequence[float]) -> Summary:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return Summary(math.nan, math.nan, 0, len(values))
    std = float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0
    return Summary(float(np.mean(finite)), std, len(finite), len(values))


def rounds_to_stay(run: Run, metric: str, value: float, mode: str = "max") -> float:
    """The first communication round from which every later measurement of ``metric`` in the
    run's curve meets ``value`` (``mode='max'``: >=, ``'min'``: <=), up to the run's end; NaN when
    its last measurement misses it (or it has none). The TargetTracker's ``rounds_to_target``
    is the first crossing instead: the two differ when the curve dips below after crossing."""
    rounds, values = _points(run, "comm/rounds", metric)
    if not rounds.size:
        return math.nan
    hit = values >= value if mode == "max" else values <= value
    if not hit[-1]:
        return math.nan
    misses = np.flatnonzero(~hit)
    return float(rounds[misses[-1] + 1] if misses.size else rounds[0])


@dataclass
class Curve:
    """A seed-aggregated curve: x grid, mean, std and the number of runs."""

    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    runs: int


def _points(run: Run, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    xs = np.array([row.get(x, math.nan) for row in run.curve], dtype=float)
    ys = np.array([row.get(y, math.nan) for row in run.curve], dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    order = np.argsort(xs[keep], kind="stable")
    return xs[keep][order], ys[keep][order]


def step_values(xs: np.ndarray, ys: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The last y measured at x <= each grid point (NaN before the first measurement)."""
    index = np.searchsorted(xs, grid, side="right") - 1
    out = np.full(grid.shape, math.nan)
    valid = index >= 0
    out[valid] = ys[index[valid]]
    return out


def mean_curve(runs: Sequence[Run], x: str, y: str) -> Curve | None:
    """Mean ± std over runs of ``y`` against ``x``; ``None`` when no run has both columns.

    Runs measured at the same x values (epochs, rounds) are averaged point by point. Otherwise
    (simulated seconds, MB) every run is read as a step function on the union of x values, from
    the point where every run has a measurement up to the shortest run's last one.
    """
    points = [_points(run, x, y) for run in runs]
    points = [(xs, ys) for xs, ys in points if xs.size]
    if not points:
        return None
    if all(np.array_equal(points[0][0], xs) for xs, _ in points):
        grid = points[0][0]
        values = np.stack([ys for _, ys in points])
    else:
        start = max(xs[0] for xs, _ in points)
        stop = min(xs[-1] for xs, _ in points)
        grid = np.unique(np.concatenate([xs for xs, _ in points]))
        grid = grid[(grid >= start) & (grid <= stop)]
        if not grid.size:
            return None
        values = np.stack([step_values(xs, ys, grid) for xs, ys in points])
    std = values.std(axis=0, ddof=1) if len(values) > 1 else np.zeros(grid.shape)
    return Curve(grid, values.mean(axis=0), std, len(values))
