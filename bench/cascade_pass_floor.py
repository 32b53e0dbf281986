"""What one batch of cascade costs at the least: a client pass (M server iterations, the paper's
epoch) written as bare torch, against one centralized step of the same models.

``experiment=cascade_digits`` makes every batch go through every client once (M server
iterations per batch, ``algo.epoch=client_pass``), and each iteration is Algorithm 1: the active
ZOO client evaluates its model at w and w + mu u (float64), the server answers with the two
batch losses of its head in float64 (client m's column replaced by each), takes one first-order
step on its head, and the client steps with the two-point estimate. This script times exactly
that arithmetic in plain torch, with no Lightning, wire, ledger, table ages or logging, on the
workload's own modules, batch size and data, and in the same process one step of the same
modules trained as one centralized model. The ratio is a floor for
``bench/time_to_result.py``'s cascade ``ratio`` (run against one central update per batch); its
``per_update_ratio`` compares against as many central updates as server iterations instead.

    python bench/cascade_pass_floor.py --steps 300
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("WANDB_MODE", "disabled")

from conftest import compose_config  # noqa: E402
from step_overhead import Centralized  # noqa: E402

from vfl_lightning import lightning_speedups  # noqa: E402
from vfl_lightning.train import build  # noqa: E402

lightning_speedups.use(True)  # as train() does by default (lightning_speedups=true)


def client_pass(parties, head, head_opt, xs, y, table, mu, lr, generator) -> None:
    """Algorithm 1 for every client in turn on one batch (bare torch, float64 answers)."""
    for m, party in enumerate(parties):
        layer = party.net[1]
        w, b = layer.weight.detach().double(), layer.bias.detach().double()
        u = torch.randn(w.numel() + b.numel(), dtype=torch.float64, generator=generator)
        weights = torch.stack([w, w + mu * u[: w.numel()].view_as(w)])
        biases = torch.stack([b, b + mu * u[w.numel() :]])
        x = xs[m].double().expand(2, *xs[m].shape)
        candidates = torch.relu(torch.baddbmm(biases.unsqueeze(1), x, weights.transpose(1, 2)))
        table[m] = candidates[0].float()
        head64 = [p.detach().double() for p in head.parameters()]
        inputs = [column.double().expand(2, *column.shape) for column in table]
        inputs[m] = candidates
        hidden = torch.relu(F.linear(torch.cat(inputs, -1), head64[0], head64[1]))
        logits = F.linear(hidden, head64[2], head64[3])
        losses = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.repeat(2), reduction="none"
        )
        loss, perturbed = losses.view(2, -1).mean(1)
        head_opt.zero_grad()
        F.cross_entropy(head(torch.cat(table, -1)), y).backward()
        head_opt.step()
        estimate = (perturbed - loss) / mu * u
        with torch.no_grad():
            layer.weight -= lr * estimate[: w.numel()].view_as(w).float()
            layer.bias -= lr * estimate[w.numel() :].float()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="batches timed per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps and --rounds must be >= 1, got {args.steps}, {args.rounds}")
    torch.set_num_threads(args.threads)
    cfg = compose_config(Path(tempfile.mkdtemp()), "experiment=cascade_digits")
    datamodule, module = build(cfg)
    datamodule.setup("fit")
    layers = [[type(layer).__name__ for layer in party.net] for party in module.parties]
    if any(kinds != ["Flatten", "Linear", "ReLU"] for kinds in layers):
        raise SystemExit(f"expected clients of one linear layer and a ReLU, got {layers}")
    # full batches only: the table below stands for the server's rows of the current batch
    batches = [b for b in datamodule.train_dataloader() if len(b[1]) == cfg.data.batch_size]
    mu, lr = float(cfg.algo.mu), float(cfg.optimizer.lr)

    central = Centralized(module.parties, module.head, module.mechanism.fusion)
    central_opt = instantiate(cfg.optimizer)(central.parameters())
    head_opt = instantiate(cfg.optimizer)(module.head.parameters())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        table = [party(x) for party, x in zip(module.parties, batches[0][0], strict=True)]

    def central_step(xs, y) -> None:
        central_opt.zero_grad()
        F.cross_entropy(central(xs), y).backward()
        central_opt.step()

    def cascade_step(xs, y) -> None:
        client_pass(module.parties, module.head, head_opt, xs, y, table, mu, lr, generator)

    timings: dict[str, list[float]] = {"central": [], "cascade": []}
    for _ in range(args.rounds):
        for name, step in (("central", central_step), ("cascade", cascade_step)):
            start = time.perf_counter()
            for k in range(args.steps):
                xs, y, _ = batches[k % len(batches)]
                step(xs, y)
            timings[name].append(1e3 * (time.perf_counter() - start) / args.steps)
    central_ms = statistics.median(timings["central"])
    cascade_ms = statistics.median(timings["cascade"])
    parties = module.num_parties
    print(
        f"experiment=cascade_digits: {parties} clients, batch {cfg.data.batch_size}, "
        f"{args.threads} thread(s), medians of {args.rounds} rounds x {args.steps} batches\n"
    )
    print("| central step ms | client pass ms (bare torch) | ratio | per server iteration ratio |")
    print("|---|---|---|---|")
    print(
        f"| {central_ms:.3f} | {cascade_ms:.3f} | **{cascade_ms / central_ms:.2f}** | "
        f"{cascade_ms / parties / central_ms:.2f} |"
    )


if __name__ == "__main__":
    main()
