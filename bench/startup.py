"""Start-up: how long a new Python process takes to import the command line, to import what a run
imports, to print ``python train.py --help``, and to refuse a bad config (an unknown key, a wrong
type, a value out of range, an unknown group option; an unknown key both added with ``+`` and set
without it, which Hydra itself refuses), each against ``import lightning`` timed in
the same rounds (the ratios are what to compare between machines; the seconds depend on the
machine and its load).

Every command is a fresh interpreter (``sys.executable``), run in interleaved rounds (one of each
per round, so a change in the machine's load falls on all of them alike); the table gives the
median, minimum and maximum wall seconds and the median's ratio to ``import lightning``. Each
config error is checked to exit 2 with one ``error:`` line.

    python bench/startup.py                 # 5 rounds, this checkout
    python bench/startup.py --repeats 9
    python bench/startup.py --root ../main  # another checkout (its train.py and package)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORTS = {
    "import lightning": ["-c", "import lightning"],
    "import vfl_lightning.cli": ["-c", "import vfl_lightning.cli"],
    "import vfl_lightning.run.train": ["-c", "import vfl_lightning.run.train"],
}
REFUSALS = {
    "unknown key (+data.bach_size=8)": ["+data.bach_size=8"],
    "unknown key (data.bach_size=8, Hydra's)": ["data.bach_size=8"],
    "wrong type (data.batch_size=abc)": ["data.batch_size=abc"],
    "out of range (optimizer.lr=-1)": ["optimizer.lr=-1"],
    "unknown option (algo=foo)": ["algo=foo"],
}


def commands(root: Path, run_dir: str) -> dict[str, tuple[list[str], int | None]]:
    """``{label: (argv after the interpreter, the exit code it must give or None)}``."""
    found: dict[str, tuple[list[str], int | None]] = {k: (v, 0) for k, v in IMPORTS.items()}
    train = str(root / "train.py")
    found["python train.py --help"] = ([train, "--help"], 0)
    for label, overrides in REFUSALS.items():
        found[label] = ([train, f"hydra.run.dir={run_dir}", *overrides], 2)
    return found


def run_once(argv: list[str], env: dict) -> tuple[float, str]:
    """Wall seconds, and what the process ended with: its exit code and its number of stderr
    lines (``exit 2, 1 line``)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, cwd=env["PYTHONPATH"]
    )
    elapsed = time.perf_counter() - start
    lines = len(done.stderr.splitlines())
    return elapsed, f"exit {done.returncode}, {lines} line{'s' * (lines != 1)}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the checkout to time (default: this one)"
    )
    args = parser.parse_args()
    root = args.root.resolve()
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(root)}
    env.pop("HYDRA_FULL_ERROR", None)
    with tempfile.TemporaryDirectory() as run_dir:
        table = commands(root, run_dir)
        times: dict[str, list[float]] = {label: [] for label in table}
        ended: dict[str, str] = {}
        run_once(table["import lightning"][0], env)  # warm the file cache
        for _ in range(args.repeats):
            for label, (argv, _) in table.items():
                elapsed, ended[label] = run_once(argv, env)
                times[label].append(elapsed)
    base = statistics.median(times["import lightning"])
    print(
        f"{root}: {args.repeats} rounds, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} "
        "(1 min average, after the rounds)"
    )
    print(f"| {'command':<40} | median s | min s | max s | / import lightning | ended |")
    print(f"|{'-' * 42}|---------:|------:|------:|-------------------:|-------|")
    for label, values in times.items():
        median = statistics.median(values)
        print(
            f"| {label:<40} | {median:8.2f} | {min(values):5.2f} | {max(values):5.2f} | "
            f"{median / base:18.2f} | {ended[label]} |"
        )
    wrong = [
        label
        for label, (_, code) in table.items()
        if code is not None
        and not ended[label].startswith(f"exit {code},")
        or code == 2
        and not ended[label].endswith(", 1 line")
    ]
    if root == ROOT and wrong:
        raise SystemExit(f"not the expected exit code and one error line: {wrong}")


if __name__ == "__main__":
    main()
