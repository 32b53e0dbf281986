"""Step cost against the number of parties at a fixed total feature count: an npq (or pbm) step
at M = 28 against M = 4, with homogeneous parties grouped (default) and with the per-party loop.

Each configuration trains a few hundred steps through Lightning, timing ``protocol_step``
(the protocol's own step) and the whole Lightning batch; the configurations run in turn,
``--rounds`` times, and the table gives medians and the M_large / M_small ratio per mode. The
last row times the same modules trained as one centralized model (plain loop, one optimizer):
M parties with a fixed hidden width are a larger model at larger M, and that row shows how much
of the step growth is compute.

By default every party has the configured hidden width (``party.hidden=[64]``), so M = 28 is a
7x wider hidden layer than M = 4. ``--total-hidden H`` gives each party H / M hidden units
instead: the same model size at every M, so the ratio shows what many parties cost beyond
compute.

    python bench/party_scaling.py                      # npq, M = 4 and 28, 784 features, batch 32
    python bench/party_scaling.py --total-hidden 224   # 56 hidden units per party at M = 4, 8 at 28
    python bench/party_scaling.py --algo pbm --parties 4 28 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("WANDB_MODE", "disabled")

from conftest import compose_config  # noqa: E402

from vfl_lightning import lightning_speedups  # noqa: E402
from vfl_lightning.mechanisms import fuse_tensors  # noqa: E402
from vfl_lightning.train import build  # noqa: E402

lightning_speedups.use(True)  # as train() does by default (lightning_speedups=true)


class BatchTimer(L.Callback):
    """Wall time of every Lightning training batch (loop, protocol, logging)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seconds.append(time.perf_counter() - self._start)


def central_step_ms(args, cfg, parties, head, fusion, datamodule) -> float:
    """Median ms of one centralized step (forward, backward, one optimizer) of the modules."""
    modules = torch.nn.ModuleList([*parties, head])
    optimizer = instantiate(cfg.optimizer)(modules.parameters())
    batches = list(datamodule.train_dataloader())
    seconds = []
    for step in range(args.steps + args.warmup):
        xs, y, _ = batches[step % len(batches)]
        start = time.perf_counter()
        optimizer.zero_grad()
        fused = fuse_tensors([p(x) for p, x in zip(parties, xs, strict=True)], fusion)
        torch.nn.functional.cross_entropy(head(fused), y).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return 1e3 * statistics.median(seconds[args.warmup :])


def measure(args, parties: int, grouped: bool | None, out: Path) -> tuple[float, float]:
    """(median protocol step ms, median Lightning batch ms) after ``args.warmup`` steps;
    ``grouped=None``: (centralized step ms, the same)."""
    cfg = compose_config(
        out / f"{args.algo}-{parties}-{grouped}",
        f"algo={args.algo}",
        "data=synthetic",
        f"data.num_parties={parties}",
        "data.partition=even",
        f"data.batch_size={args.batch}",
        "data.drop_last=true",
        f"data.options.n_features={args.features}",
        "data.options.n_informative=32",
        f"data.options.n_samples={args.batch * 50}",
        "data.val_fraction=0.05",
        "data.test_fraction=0.05",
        f"trainer.max_steps={args.steps + args.warmup}",
        "trainer.limit_val_batches=0",
        f"+algo.batch_parties={str(bool(grouped)).lower()}",
        "test=false",
        *([f"party.hidden=[{args.total_hidden // parties}]"] if args.total_hidden else []),
    )
    L.seed_everything(0)
    datamodule, module = build(cfg)
    if grouped is None:
        datamodule.setup("fit")
        central = central_step_ms(
            args, cfg, module.parties, module.head, module.mechanism.fusion, datamodule
        )
        return central, central
    if grouped and module.party_side.grouped is None:
        raise RuntimeError(f"M={parties}: parties are not groupable, nothing to compare")
    protocol_s: list[float] = []
    protocol_step = module.protocol_step

    def timed(*batch):
        start = time.perf_counter()
        result = protocol_step(*batch)
        protocol_s.append(time.perf_counter() - start)
        return result

    module.protocol_step = timed
    timer = BatchTimer()
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[timer])
    trainer.fit(module, datamodule=datamodule)
    return (
        1e3 * statistics.median(protocol_s[args.warmup :]),
        1e3 * statistics.median(timer.seconds[args.warmup :]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algo", default="npq", choices=["npq", "pbm", "splitnn", "ldp"])
    parser.add_argument("--parties", nargs=2, type=int, default=[4, 28])
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--total-hidden",
        type=int,
        default=None,
        help="hidden units summed over the parties (each gets total / M); default: party config",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/vfl_party_scaling"))
    args = parser.parse_args()
    small, large = args.parties
    for m in args.parties:
        if m < 1 or args.features % m:
            parser.error(f"--parties values must divide --features={args.features}, got {m}")
        if args.total_hidden is not None and (args.total_hidden < m or args.total_hidden % m):
            parser.error(
                f"--parties values must divide --total-hidden={args.total_hidden}, got {m}"
            )
    torch.set_num_threads(args.threads)
    times: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for grouped in (True, False, None):
            for m in (small, large):
                times.setdefault((m, grouped), []).append(measure(args, m, grouped, args.out))
    print(
        f"{args.algo}, {args.features} features split over M parties, batch {args.batch}, "
        f"{torch.get_num_threads()} thread(s), medians of {args.rounds} rounds x {args.steps} steps, "
        + (
            f"{args.total_hidden} hidden units in all (total / M per party)"
            if args.total_hidden
            else "the party config's hidden width per party"
        )
    )
    print(
        f"| parties | M={small} protocol ms | M={large} protocol ms | ratio | "
        f"M={small} batch ms | M={large} batch ms | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for grouped in (True, False, None):
        rows = [
            [statistics.median(r[k] for r in times[(m, grouped)]) for m in (small, large)]
            for k in (0, 1)
        ]
        (p_small, p_large), (b_small, b_large) = rows
        print(
            f"| {'central' if grouped is None else 'grouped' if grouped else 'loop'} | {p_small:.3f} | {p_large:.3f} | "
            f"{p_large / p_small:.2f} | {b_small:.3f} | {b_large:.3f} | {b_large / b_small:.2f} |"
        )


if __name__ == "__main__":
    main()
