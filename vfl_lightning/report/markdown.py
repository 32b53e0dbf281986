"""Markdown and number helpers of the report: tables, numbers written for a reader, and whether
the runs have a value at all."""

from __future__ import annotations

import math
from collections.abc import Sequence

from vfl_lightning.report.runs import Run


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def has(runs: Sequence[Run], key: str) -> bool:
    return any(math.isfinite(run.value(key)) for run in runs)


def final_prefix(runs: Sequence[Run]) -> str:
    """``test`` when the runs were tested, else ``val``."""
    return "test" if has(runs, "test/acc") else "val"


def number(value: float, digits: int = 4) -> str:
    return "–" if not math.isfinite(value) else f"{value:.{digits}g}"
