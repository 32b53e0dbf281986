"""Step overhead of VFL protocols against one centralized model (same modules, same batch).

For each number of parties M, trains the protocol with Lightning and, on every batch, also steps
a centralized copy (the same party modules + head as one nn.Module, one optimizer) on that batch,
so both are timed interleaved in one process. Prints the median step times and their ratio.

    python bench/step_overhead.py                       # npq, pbm, ldp at M = 2, 4, 8, 16
    python bench/step_overhead.py --algos npq splitnn --parties 4 --steps 300
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("WANDB_MODE", "disabled")

from conftest import compose_config  # noqa: E402

from vfl_lightning import lightning_speedups  # noqa: E402
from vfl_lightning.mechanisms import fuse_tensors  # noqa: E402
from vfl_lightning.train import build  # noqa: E402

lightning_speedups.use(True)  # as train() does by default (lightning_speedups=true)


class Centralized(nn.Module):
    """The party modules and the head as one model: head(fuse(party_m(x_m)))."""

    def __init__(self, parties: nn.ModuleList, head: nn.Module, fusion: str) -> None:
        super().__init__()
        self.parties = parties
        self.head = head
        self.fusion = fusion

    def forward(self, xs):
        return self.head(fuse_tensors([p(x) for p, x in zip(self.parties, xs)], self.fusion))


class InterleavedTimer(L.Callback):
    """Times the centralized step before each protocol step, on the same batch."""

    def __init__(self, central: Centralized, optimizer: torch.optim.Optimizer) -> None:
        self.central = central
        self.optimizer = optimizer
        self.central_s: list[float] = []
        self.protocol_s: list[float] = []
        self.lightning_s: list[float] = []
        self._batch_start = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        xs, y, _ = batch
        start = time.perf_counter()
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.central(xs), y)
        loss.backward()
        self.optimizer.step()
        self.central_s.append(time.perf_counter() - start)
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.lightning_s.append(time.perf_counter() - self._batch_start)


def measure(
    algo: str, num_parties: int, steps: int, warmup: int, features: int, batch: int, out: Path
):
    cfg = compose_config(
        out / f"{algo}-{num_parties}",
        f"algo={algo}",
        "data=synthetic",
        f"data.num_parties={num_parties}",
        "data.partition=even",
        f"data.batch_size={batch}",
        "data.drop_last=true",
        f"data.options.n_features={features}",
        f"data.options.n_informative={min(features, 32)}",
        f"data.options.n_samples={batch * 40}",
        "data.val_fraction=0.05",
        "data.test_fraction=0.05",
        f"trainer.max_steps={steps + warmup}",
        "trainer.limit_val_batches=0",
        "test=false",
    )
    L.seed_everything(0)
    datamodule, module = build(cfg)
    fusion = module.mechanism.fusion
    central = Centralized(copy.deepcopy(module.parties), copy.deepcopy(module.head), fusion)
    from hydra.utils import instantiate

    timer = InterleavedTimer(central, instantiate(cfg.optimizer)(central.parameters()))
    protocol_step = module.protocol_step

    def timed(xs, y, idx):
        start = time.perf_counter()
        result = protocol_step(xs, y, idx)
        timer.protocol_s.append(time.perf_counter() - start)
        return result

    module.protocol_step = timed
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[timer])
    trainer.fit(module, datamodule=datamodule)
    central_ms = 1e3 * statistics.median(timer.central_s[warmup:])
    protocol_ms = 1e3 * statistics.median(timer.protocol_s[warmup:])
    lightning_ms = 1e3 * statistics.median(timer.lightning_s[warmup:])
    ratios = [p / c for p, c in zip(timer.protocol_s[warmup:], timer.central_s[warmup:])]
    return central_ms, protocol_ms, statistics.median(ratios), lightning_ms


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=["npq", "pbm", "ldp"])
    parser.add_argument("--parties", nargs="+", type=int, default=[2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("/tmp/vfl_bench"))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.features} features, batch {args.batch}, {args.steps} timed steps"
    )
    header = f"| {'algo':8} | {'M':>3} | {'central ms':>10} | {'protocol ms':>11} | {'ratio':>6} | {'Lightning step ms':>17} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for algo in args.algos:
        for m in args.parties:
            c, p, r, full = measure(
                algo, m, args.steps, args.warmup, args.features, args.batch, args.out
            )
            print(
                f"| {algo:8} | {m:>3} | {c:>10.3f} | {p:>11.3f} | {r:>6.2f} | {full:>17.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
