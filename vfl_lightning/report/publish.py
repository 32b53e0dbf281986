"""Publish a W&B Report specification written offline by the report command:
python -m vfl_lightning.report.publish OUT/wandb_report.json (needs network and a W&B key)."""

from __future__ import annotations

import sys
from pathlib import Path

from vfl_lightning.report.runs import OneLineParser, ReportError
from vfl_lightning.report.wandb_report import has_credentials, publish, read_spec


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m vfl_lightning.report.publish")
    p.add_argument("spec", type=Path)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for W&B")
    args = p.parse_args(argv)
    if not args.spec.is_file():
        print(f"error: no such specification file: {args.spec}", file=sys.stderr)
        return 2
    try:
        report = read_spec(args.spec)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not has_credentials():
        print(
            "error: no W&B key (run `wandb login`, or set WANDB_API_KEY) or WANDB_MODE is offline",
            file=sys.stderr,
        )
        return 2
    url = publish(report, args.timeout)
    if url is None:
        return 1
    print(f"W&B report: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
