"""Summarize a PBM-VFL sweep: mean (over seeds) final accuracy, feature ε and MB to target per
(algo, b, β), read from every run's results.json and .hydra/config.yaml. Prints a Markdown table.

Run: python bench/pbm_sweep_table.py <sweep dir> [<sweep dir> ...]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

from omegaconf import OmegaConf


def rows(directories: list[Path]):
    for directory in directories:
        for results_file in sorted(directory.rglob("results.json")):
            config = OmegaConf.load(results_file.parent / ".hydra" / "config.yaml")
            results = json.loads(results_file.read_text())
            mechanism = config.mechanism
            key = (results["algo"], mechanism.get("b"), mechanism.get("beta"))
            yield key, results


def fmt(values: list, digits: int = 3) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "never"
    text = f"{mean(present):.{digits}g}"
    return text if len(present) == len(values) else f"{text} ({len(present)}/{len(values)} runs)"


def values(runs: list[dict], name: str) -> list:
    return [r.get(name) for r in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directories", nargs="+", type=Path)
    args = parser.parse_args()
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for key, results in rows(args.directories):
        groups[key].append(results)
    print(
        "| algo | b | beta | seeds | test acc | train acc | feature eps | MB to target | uplink MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    order = {"npq": 0, "pbm": 1, "ldp": 2}
    for (algo, b, beta), runs in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1] or 0, kv[0][2] or 0)
    ):
        b_text = "-" if algo == "npq" else b
        beta_text = "-" if algo == "npq" else beta
        print(
            f"| {algo} | {b_text} | {beta_text} | {len(runs)} | {fmt(values(runs, 'test/acc'))} | {fmt(values(runs, 'train/acc'))} | "
            f"{fmt(values(runs, 'privacy/feature_eps'), 4) if algo != 'npq' else 'inf'} | "
            f"{fmt(values(runs, 'mb_to_target'))} | {fmt(values(runs, 'comm/uplink_mb'))} |"
        )


if __name__ == "__main__":
    main()
