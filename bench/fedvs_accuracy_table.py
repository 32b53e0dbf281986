"""Accuracy at fixed simulated times from FedVS-family runs (the shape of FedVS Figures 2-4).

    python bench/fedvs_accuracy_table.py <sweep dir> [--times 15 30 60 120] [--by algo|K|T]

Reads every results.json under the directory, takes from ``fedvs/val_curve`` the last validation
accuracy at or before each time, and prints mean ± std over seeds per group ("–": some run had no validation yet).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def accuracy_at(curve: list[list[float]], seconds: float) -> float:
    """Last validation accuracy measured at simulated time <= ``seconds`` (NaN before the first)."""
    reached = [acc for _, time, acc in curve if time <= seconds]
    return reached[-1] if reached else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--times", type=float, nargs="+", default=[15, 30, 60, 120])
    parser.add_argument("--by", default="algo", choices=["algo", "K", "T", "K,T"])
    args = parser.parse_args()
    groups: dict[str, list[list[float]]] = defaultdict(list)
    rounds: dict[str, list[float]] = defaultdict(list)
    for path in sorted(args.sweep_dir.rglob("results.json")):
        result = json.loads(path.read_text())
        key = {
            "algo": result["algo"],
            "K": f"K={result['fedvs/K']}",
            "T": f"T={result['fedvs/T']}",
            "K,T": f"K={result['fedvs/K']},T={result['fedvs/T']} (R={result['fedvs/R']})",
        }[args.by]
        groups[key].append([accuracy_at(result["fedvs/val_curve"], t) for t in args.times])
        rounds[key].append(result["comm/rounds"] / result["time/simulated_s"])
    header = f"| {args.by} | seeds | rounds per sim. s | " + " | ".join(
        f"acc @ {t:g} s" for t in args.times
    )
    print(header + " |")
    print("|" + "---|" * (3 + len(args.times)))
    for key in sorted(groups):
        values = np.array(groups[key])
        cells = [
            f"{np.mean(column):.3f} ± {np.std(column):.3f}" if np.all(np.isfinite(column)) else "–"
            for column in values.T
        ]
        print(f"| {key} | {len(values)} | {np.mean(rounds[key]):.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
