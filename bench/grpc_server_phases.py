"""Where the server's own thread spends its CPU in a gRPC round: runs ``runtime_overhead.py
--runtime grpc`` for one algo with thread-CPU timers around the server's party calls, and prints,
per training round of the gRPC run, the CPU milliseconds of the server's main thread in all, in
``GrpcParties.send`` (encode the release request, run the streams' event loop until every party
answered, decode and check the replies), in the loop alone (``StreamLoop.until``: the writes,
the reads and their wake-ups), in ``PartyStream.reply`` (decode a reply) and in
``GrpcParties.apply_gradients`` (encode the gradients); the rest is the training step itself
(Lightning, the server's model, the protocol). ``--calls`` adds Python's function calls and the
event loop's turns per round (cProfile's counts; its timings are not used).

    python bench/grpc_server_phases.py                    # pbm, 4 parties, 1000 rounds
    python bench/grpc_server_phases.py --algo npq --calls
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning as L  # noqa: E402
import runtime_overhead  # noqa: E402

from vfl_lightning.runtime import grpc_parties, grpc_stream  # noqa: E402

PHASES = [
    (grpc_parties.GrpcParties, "send", "send"),
    (grpc_stream.StreamLoop, "until", "  the streams' loop"),
    (grpc_stream.PartyStream, "reply", "  decode the replies"),
    (grpc_parties.GrpcParties, "apply_gradients", "apply_gradients"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="pbm")
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--calls", action="store_true", help="count function calls (slower)")
    args = parser.parse_args()
    spent: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for owner, name, label in PHASES:
        original = getattr(owner, name)

        def timed(*a, _original=original, _label=label, **k):
            start = time.thread_time()
            try:
                return _original(*a, **k)
            finally:
                spent[_label] += time.thread_time() - start
                calls[_label] += 1

        setattr(owner, name, timed)
    fit = L.Trainer.fit
    report: list[str] = []

    def measured_fit(trainer, module, *a, **k):
        if not isinstance(module.party_side, grpc_parties.GrpcParties):
            return fit(trainer, module, *a, **k)
        spent.clear()
        calls.clear()
        profile = cProfile.Profile() if args.calls else None
        start = time.thread_time()
        if profile is not None:
            profile.enable()
        try:
            return fit(trainer, module, *a, **k)
        finally:
            if profile is not None:
                profile.disable()
            total = time.thread_time() - start
            rounds = calls["send"]
            report.append(
                f"{args.algo}: the server's main thread, CPU ms per round over the whole gRPC fit "
                f"({rounds} rounds)"
            )
            report.append(f"  {'all':24} {1e3 * total / rounds:7.3f}")
            for _, _, label in PHASES:
                report.append(f"  {label:24} {1e3 * spent[label] / rounds:7.3f}")
            if profile is not None:
                stats = pstats.Stats(profile).stats
                functions = sum(entry[1] for entry in stats.values())
                turns = sum(
                    entry[1]
                    for (file, _, function), entry in stats.items()
                    if function == "_run_once" and file.endswith("base_events.py")
                )
                report.append(f"  Python function calls per round: {functions / rounds:.0f}")
                report.append(f"  event loop turns per round: {turns / rounds:.1f}")

    L.Trainer.fit = measured_fit
    sys.argv = [
        "runtime_overhead.py",
        "--runtime",
        "grpc",
        "--algos",
        args.algo,
        "--parties",
        str(args.parties),
        "--rounds",
        str(args.rounds),
    ]
    runtime_overhead.main()
    print("\n".join(report))


if __name__ == "__main__":
    main()
