"""A grid sweep's wall time with Hydra's basic launcher (jobs one after another in one process)
against the joblib launcher (jobs in parallel worker processes), from one process, alternating.

Each variant runs ``python train.py -m seed=0,1,...,S-1 <workload>`` as a subprocess with the
default logging (W&B offline, checkpoints), and is timed from start to exit. Besides the wall
time it reports the cores kept busy: the CPU seconds of the command and all its children over
its wall time (2.0 = both cores of a 2-core machine all the time). Medians over ``--repeats``.

    python bench/sweep_parallel.py --workload experiment=cascade_digits --seeds 4 --repeats 3

A third variant, ``--with-threads N``, runs the basic launcher with ``torch_threads=N`` (intra-op
threads instead of parallel jobs).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_sweep(overrides: list[str], sweep_dir: Path) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children) of one multirun."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        *overrides,
        f"hydra.sweep.dir={sweep_dir}",
        "trainer.enable_progress_bar=false",
    ]
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    cpu = children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not all((job / "results.json").exists() for job in jobs):
        sys.exit(f"a job of {sweep_dir} wrote no results.json")
    return wall, children_cpu_s() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", default=["experiment=cascade_digits"])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-jobs", type=int, default=2, help="hydra.launcher.n_jobs of joblib")
    parser.add_argument(
        "--with-threads", type=int, default=None, help="also basic + torch_threads=N"
    )
    args = parser.parse_args()

    seeds = "seed=" + ",".join(str(s) for s in range(args.seeds))
    variants = {
        "basic (sequential)": [seeds, *args.workload],
        f"joblib, n_jobs={args.n_jobs}": [
            seeds,
            *args.workload,
            "hydra/launcher=joblib",
            f"hydra.launcher.n_jobs={args.n_jobs}",
        ],
    }
    if args.with_threads:
        variants[f"basic, torch_threads={args.with_threads}"] = [
            seeds,
            *args.workload,
            f"torch_threads={args.with_threads}",
        ]
    walls: dict[str, list[float]] = {name: [] for name in variants}
    busy: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="sweep_parallel_") as tmp:
        for repeat in range(args.repeats):
            for number, (name, overrides) in enumerate(variants.items()):
                sweep_dir = Path(tmp) / f"repeat{repeat}_variant{number}"
                wall, cpu = run_sweep(overrides, sweep_dir)
                walls[name].append(wall)
                busy[name].append(cpu / wall)
                print(
                    f"repeat {repeat}: {name}: {wall:.1f} s, {cpu / wall:.2f} cores busy",
                    flush=True,
                )

    base = statistics.median(walls["basic (sequential)"])
    print(f"\n{args.seeds} seeds of {' '.join(args.workload)}, medians of {args.repeats}:")
    print("| launcher | wall s | single runs s | cores busy | / sequential |")
    print("|---|---|---|---|---|")
    for name in variants:
        median = statistics.median(walls[name])
        singles = " ".join(f"{w:.1f}" for w in walls[name])
        cores = statistics.median(busy[name])
        print(f"| {name} | {median:.1f} | {singles} | {cores:.2f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
