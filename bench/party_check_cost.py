"""What the parties' own checks cost inside a run: the thread-CPU of every party-side check
(:class:`~vfl_lightning.algorithms.party_rules.PartyGuard`'s release checks, its budget's check
and count, the received gradients' check) over a whole ``train()`` of each workload of
``bench/time_to_result.py``, per training batch and over the central loop's CPU per batch.

Each workload is run once to warm up, then once measured with the checks wrapped by a thread-CPU
clock (:class:`phase_clock.PhaseClock`: a check's time is taken out of the training step that
calls it), then its central loop. The clock's own calls add about a microsecond per wrapped call.

    python bench/party_check_cost.py --algos npq pbm cascade fedvs
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import time_to_result as ttr  # noqa: E402
from phase_clock import PhaseClock, party_check_phases  # noqa: E402

from vfl_lightning.algorithms.asynchronous import HybridVFL  # noqa: E402
from vfl_lightning.algorithms.fedvs import FedVSFamily  # noqa: E402
from vfl_lightning.algorithms.sync import SyncVFL  # noqa: E402

CHECKS = party_check_phases()

STEPS = {(cls, "training_step"): "step" for cls in (SyncVFL, HybridVFL, FedVSFamily)}


def measure(algo: str, directory: Path) -> dict[str, float]:
    ttr.train(ttr.run_config(algo, directory / "warm", None))
    clock = PhaseClock()
    with clock.watch(STEPS | CHECKS):
        run = clock.measure(lambda: ttr.train(ttr.run_config(algo, directory / "run", None)))
    batches = ttr.COUNTERS[-1].batches
    checks = {phase: run.get(phase, 0.0) for phase in sorted(set(CHECKS.values()))}
    _, central_cpu = ttr.central_loop(ttr.run_config(algo, directory / "central", None), batches)
    central = central_cpu / batches
    return {
        "batches": batches,
        "check_calls": sum(clock.calls.get(phase, 0) for phase in checks),
        "checks_us": 1e6 * sum(checks.values()) / batches,
        "each_us": {phase: 1e6 * seconds / batches for phase, seconds in checks.items()},
        "step_us": 1e6 * run.get("step", 0.0) / batches,
        "central_us": 1e6 * central,
        "checks_over_central": sum(checks.values()) / batches / central,
        "run_over_central": run["total"] / batches / central,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=list(ttr.WORKLOADS), choices=ttr.WORKLOADS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="vfl_party_check_cost_") as folder:
        for algo in args.algos:
            rows[algo] = measure(algo, Path(folder) / algo)
    print(
        "\n| algo | batches | check calls | checks µs / batch | step µs / batch (without "
        "checks) | central µs / batch | checks / central | run CPU / central |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for algo, row in rows.items():
        print(
            f"| {algo} | {row['batches']} | {row['check_calls']} | {row['checks_us']:.1f} | "
            f"{row['step_us']:.1f} | {row['central_us']:.1f} | "
            f"{row['checks_over_central']:.3f} | {row['run_over_central']:.2f} |"
        )
    print("\nµs per batch of each check:")
    for algo, row in rows.items():
        each = ", ".join(f"{phase} {us:.1f}" for phase, us in row["each_us"].items() if us)
        print(f"- {algo}: {each}")


if __name__ == "__main__":
    main()
