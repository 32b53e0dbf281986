"""Command line: python -m vfl_lightning.report DIR... --out OUT [--recipe ...] [--x ...]
[--y ...] [--wandb ENTITY/PROJECT]; bad input ends with one `error: ...` line and status 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vfl_lightning.report.runs import RECIPES, X_AXES, OneLineParser, ReportError


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m vfl_lightning.report",
        description="Figures, report.md and a W&B Report from run and sweep directories.",
    )
    p.add_argument("dirs", nargs="+", type=Path, help="run or multirun sweep directories")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--recipe", default="auto", choices=["auto", "none", *RECIPES])
    p.add_argument("--x", default="epoch", choices=list(X_AXES), help="x axis of the curves")
    p.add_argument("--y", default="val/acc", help="curve metric (a curve.csv column)")
    p.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also build a W&B Report")
    p.add_argument("--name", default="report", help="report.md / figure prefix (e.g. pbm)")
    p.add_argument("--note", default="", help="a paragraph put under the report's header")
    p.add_argument("--times", type=float, nargs="+", help="simulated times of the FedVS table")
    p.add_argument("--rounds", type=float, nargs="+", help="round counts of a second FedVS table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, or a usage error already printed as one line
        return int(done.code or 0)
    try:
        from vfl_lightning.report.build import make_report
    except ImportError as error:
        print(
            f"error: the report needs the `report` extra ({error.name} is missing): "
            "pip install 'vfl_lightning[report]'",
            file=sys.stderr,
        )
        return 2

    try:
        make_report(
            args.dirs,
            args.out,
            recipe=args.recipe,
            x=args.x,
            y=args.y,
            wandb=args.wandb,
            name=args.name,
            note=args.note,
            times=args.times,
            rounds=args.rounds,
            progress=not args.no_progress,
        )
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
