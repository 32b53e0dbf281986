"""Rounds to a target AUC for FedSGD and FedBCD (the paper's Table I and Fig. 3b, on our data).

Runs train() in-process for every (algo, Q, mu) and seed, reads ``rounds_to_target`` (the shared
TargetTracker) from the results and prints a markdown table: mean rounds over the seeds that
reached the target, how many did, and the mean final val AUC.

    python bench/fedbcd_rounds.py --experiment fedbcd_breast_cancer --seeds 0 1 2
    python bench/fedbcd_rounds.py --experiment fedbcd_digits --target 0.97 optimizer.lr=0.3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("WANDB_MODE", "disabled")

from conftest import compose_config  # noqa: E402

from vfl_lightning.train import train  # noqa: E402

DEFAULT_RUNS = [
    "fedsgd:1",
    "fedbcd:3",
    "fedbcd:5",
    "fedbcd:10",
    "fedbcd:25",
    "fedbcd_s:1",
    "fedbcd_s:3",
    "fedbcd_s:5",
    "fedbcd_s:10",
    "fedbcd_s:25",
    "fedpbcd:25",
]


def run_one(experiment: str, algo: str, q: int, seed: int, target: float, extra, out: Path):
    cfg = compose_config(
        out / f"{algo}-{q}-{seed}",
        f"experiment={experiment}",
        f"algo={algo}",
        f"algo.local_steps={q}",
        f"seed={seed}",
        f"target.value={target}",
        "callbacks.checkpoint=null",
        "test=false",
        *extra,
    )
    results = train(cfg)
    return results["rounds_to_target"], results["val/auroc"], results["comm/rounds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="fedbcd_breast_cancer")
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, help="algo:Q pairs")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.runs:
            algo, q = run.split(":")
            outcomes = [
                run_one(args.experiment, algo, int(q), s, args.target, args.overrides, Path(tmp))
                for s in args.seeds
            ]
            reached = [r for r, _, _ in outcomes if r is not None]
            rows.append(
                (
                    algo,
                    int(q),
                    statistics.mean(reached) if reached else None,
                    [r for r, _, _ in outcomes],
                    len(reached),
                    statistics.mean(a for _, a, _ in outcomes),
                    int(outcomes[0][2]),
                )
            )
            print(f"done {run}: {rows[-1]}", file=sys.stderr, flush=True)

    print(f"\nexperiment={args.experiment} target val/auroc >= {args.target} seeds={args.seeds}")
    print(f"overrides: {' '.join(args.overrides) or '(none)'}\n")
    print("| algo | Q | mean rounds to target | per seed | reached | final val AUC | rounds run |")
    print("|---|---|---|---|---|---|---|")
    for algo, q, mean_rounds, per_seed, reached, auc, total in rows:
        shown = "never" if mean_rounds is None else f"{mean_rounds:.1f}"
        seeds = ", ".join("-" if r is None else str(r) for r in per_seed)
        print(
            f"| {algo} | {q} | {shown} | {seeds} | {reached}/{len(per_seed)} | {auc:.4f} | {total} |"
        )


if __name__ == "__main__":
    main()
