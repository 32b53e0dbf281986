"""Summarize multirun results.json files as the cascaded-hybrid paper's tables: test accuracy
(Table II) or label-inference accuracy (Table I), mean ± std over seeds, per algo, client count
and server hidden width (read from the job's .hydra/config.yaml).

    python bench/cascade_table.py multirun/<date>/<time> [more sweep dirs]
    python bench/cascade_table.py --attack multirun/<date>/<time>
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean, stdev

from omegaconf import OmegaConf

ORDER = ["splitnn", "npq", "vafl", "syn_zoo_vfl", "zoo_vfl", "cascade"]


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    spread = stdev(values) if len(values) > 1 else 0.0
    return f"{100 * mean(values):.1f} ± {100 * spread:.1f}"


def server_hidden(results_path: Path) -> str:
    """The head's hidden widths of the job that wrote ``results_path`` ("-" if unknown)."""
    config = results_path.parent / ".hydra" / "config.yaml"
    if not config.exists():
        return "-"
    hidden = OmegaConf.load(config).head.get("hidden")
    return "-" if hidden is None else "/".join(str(h) for h in hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--attack", action="store_true", help="label-inference table")
    args = parser.parse_args()
    rows: dict[tuple[str, int, str], list[dict]] = defaultdict(list)
    for directory in args.dirs:
        for path in sorted(directory.rglob("results.json")):
            result = json.loads(path.read_text())
            rows[(result["algo"], result["num_parties"], server_hidden(path))].append(result)
    keys = sorted(rows, key=lambda k: (k[2], ORDER.index(k[0]) if k[0] in ORDER else 99, k[1]))
    if args.attack:
        print("| algo | clients | seeds | curious client (%) | eavesdropper (%) |")
        print("|---|---|---|---|---|")
        for key in keys:
            algo, parties, _ = key
            runs = rows[key]
            client = summary([r["attack/label_inference_acc"] for r in runs])
            eavesdropper = summary([r["attack/eavesdropper_acc"] for r in runs])
            print(f"| {algo} | {parties} | {len(runs)} | {client} | {eavesdropper} |")
        return
    print(
        "| algo | clients | server hidden | seeds | epochs | test acc (%) | uplink MB "
        "| downlink MB | rounds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for algo, parties, hidden in keys:
        runs = rows[(algo, parties, hidden)]
        test = summary([r["test/acc"] for r in runs])
        up = mean(r["comm/uplink_mb"] for r in runs)
        down = mean(r["comm/downlink_mb"] for r in runs)
        rounds = mean(r["comm/rounds"] for r in runs)
        epochs = sorted({r["epochs"] for r in runs})
        print(
            f"| {algo} | {parties} | {hidden} | {len(runs)} | {','.join(map(str, epochs))} | {test} "
            f"| {up:.2f} | {down:.4f} | {rounds:.0f} |"
        )


if __name__ == "__main__":
    main()
