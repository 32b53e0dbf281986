"""The CPU of a gRPC party program's own work for one training round, back to back and in bursts.

Builds party 0's session as its party program builds it (``tests/grpc_parties.session_of``: the
proposal of a 4-party run on digits, the PSI through its ``Psi`` calls; fixed pair seeds stand in
for the key agreement) and drives it without a network, as the program's stream handler does:
each round one stream message (the previous round's gradient, then the next release) is split,
decoded, run through the session's runner (the party's guard included) and its reply encoded.
It prints the CPU milliseconds per round of the thread that did the work, with the rounds run
back to back and with a pause between rounds (a sleep, as a party program waits for the server's
next message while the server and the other parties run), in the main thread and in a thread
pool's worker thread (where gRPC runs a party's calls). Several repeats, alternating.

    python bench/party_bursts.py                          # pbm; pauses 0, 0.5 and 4 ms
    python bench/party_bursts.py --algo npq --pauses 0 4 --rounds 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("WANDB_MODE", "disabled")

from grpc_parties import session_of  # noqa: E402

from vfl_lightning.runtime.grpc_channel import (  # noqa: E402
    bundle,
    decode_call,
    encode_call,
    framed,
    unbundle,
)
from vfl_lightning.runtime.grpc_parties import packed_rows  # noqa: E402
from vfl_lightning.runtime.grpc_schema import SESSION  # noqa: E402
from vfl_lightning.wire.codecs import Codec  # noqa: E402
from vfl_lightning.wire.frames import encode_frame  # noqa: E402


class Driver:
    """Party 0's session and the stream messages of its training rounds."""

    def __init__(self, algo: str, parties: int, batch: int, root: Path) -> None:
        overrides = [f"algo={algo}", f"data.num_parties={parties}", "data.partition=quadrants"]
        self.program, session = session_of(root, overrides, seeds="derived")
        if session.mechanism.uses_pair_masks:
            session.mechanism.set_pair_seeds({(0, m): 1000 + m for m in range(1, parties)})
        self.run = self.program.open_session(session.session)
        self.rows = len(session.features["train"])
        self.gradient = torch.randn(batch, session.width)
        self.batch, self.round = batch, 0

    def message(self) -> bytes:
        """The next round's stream message: the last round's gradient, then the release."""
        calls = []
        if self.round:
            gradient = {"gradient": Codec().encode(self.gradient), "fresh": False, "mu": 0.0}
            calls.append(encode_call("ApplyGradient", gradient))
        idx = torch.randint(0, self.rows, (self.batch,))
        send = {"idx": packed_rows(idx), "stage": "train", "round": self.round}
        calls.append(encode_call("Send", send))
        self.round += 1
        return bundle(calls)

    def answer(self, message: bytes) -> list[bytes]:
        """What the party program's stream handler does with one message."""
        replies = []
        for data in unbundle(message):
            method, fields = decode_call(data)
            reply = self.run(method, fields)
            if SESSION[method][1] is not None:
                replies.append(encode_frame(framed(SESSION[method][1], reply)))
        return replies

    def rounds(self, count: int, pause_s: float) -> float:
        """CPU milliseconds per round of the calling thread over ``count`` rounds."""
        messages = [self.message() for _ in range(count)]
        spent = 0.0
        for message in messages:
            start = time.thread_time()
            self.answer(message)
            spent += time.thread_time() - start
            if pause_s:
                time.sleep(pause_s)
        return 1e3 * spent / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="pbm")
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pauses", nargs="+", type=float, default=[0, 0.5, 4], help="ms")
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="the party's torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        driver = Driver(args.algo, args.parties, args.batch, Path(tmp))
        driver.rounds(100, 0.0)  # warm-up
        pool = ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(args.threads,))
        results: dict[tuple[float, str], list[float]] = {}
        for _ in range(args.repeats):
            for pause in args.pauses:
                main_ms = driver.rounds(args.rounds, pause / 1e3)
                worker_ms = pool.submit(driver.rounds, args.rounds, pause / 1e3).result()
                results.setdefault((pause, "main thread"), []).append(main_ms)
                results.setdefault((pause, "pool worker"), []).append(worker_ms)
        pool.shutdown()
    print(
        f"{args.algo}, party 0 of {args.parties}, batch {args.batch}: CPU ms per round of the "
        f"thread doing the work ({args.rounds} rounds x {args.repeats} repeats)"
    )
    print(f"{'pause ms':>8} {'thread':12} {'median':>7}  each")
    for (pause, thread), values in results.items():
        each = " ".join(f"{v:.3f}" for v in values)
        print(f"{pause:8g} {thread:12} {statistics.median(values):7.3f}  {each}")


if __name__ == "__main__":
    main()
