"""CPU time of the configuration checks ``train()`` runs before it builds anything, per workload.

``train()`` runs the early check (the seed, every key, type and range from the key index, the
metric names, the ``_target_`` packages: what the command line runs before torch), then reads the
keys of the classes the key index lacks from their signatures (``check_unindexed_keys``). The
script also times the early check followed by the whole schema check again (``check_schema``,
which walks every value and unset key a second time), so the saving of the single walk shows in
one process. Thread-CPU milliseconds, medians over ``--repeats`` alternating rounds.

    python bench/config_checks.py --algos npq pbm cascade fedvs --repeats 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import compose_config  # noqa: E402

from vfl_lightning.run.early import check_early  # noqa: E402
from vfl_lightning.run.schema import check_schema, check_unindexed_keys  # noqa: E402

WORKLOADS = {
    "npq": ["algo=npq"],
    "pbm": ["algo=pbm"],
    "cascade": ["experiment=cascade_digits"],
    "fedvs": ["experiment=fedvs_digits"],
}
SEQUENCES = {
    "train()": lambda cfg: (check_early(cfg), check_unindexed_keys(cfg)),
    "early + whole schema again": lambda cfg: (check_early(cfg), check_schema(cfg)),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    print("| algo | " + " | ".join(f"{name} ms" for name in SEQUENCES) + " |")
    print("|---|" + "---|" * len(SEQUENCES))
    for algo in args.algos:
        cfg = compose_config(Path(tempfile.mkdtemp()), *WORKLOADS[algo])
        times: dict[str, list[float]] = {name: [] for name in SEQUENCES}
        for _ in range(args.repeats + 1):  # the first round warms the caches up, not counted
            for name, checks in SEQUENCES.items():
                start = time.thread_time()
                checks(cfg)
                times[name].append(1e3 * (time.thread_time() - start))
        cells = " | ".join(f"{statistics.median(t[1:]):.2f}" for t in times.values())
        print(f"| {algo} | {cells} |")


if __name__ == "__main__":
    main()
