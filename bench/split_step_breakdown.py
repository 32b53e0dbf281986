"""Where the synchronous split step's overhead goes, in plain torch (no Lightning, no wire).

Times, interleaved in one process on the same batch: the centralized step; the split step as
SyncVFL does it (detached cut layer, server backward, one surrogate backward for all parties)
with one optimizer per party plus one for the server; the same split step with one optimizer
over every parameter; and the cost of one bare ``optimizer.step()`` call.

    python bench/split_step_breakdown.py --parties 4 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from vfl_lightning.models import LinearHead, MLPEncoder


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    m = args.parties
    width = args.features // m
    parties = nn.ModuleList([MLPEncoder((width,), 16, [64]) for _ in range(m)])
    head = LinearHead(16, 2)
    xs = [torch.randn(args.batch, width) for _ in range(m)]
    y = torch.randint(0, 2, (args.batch,))

    def sgd(params):
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)

    joint = sgd([*parties.parameters(), *head.parameters()])
    party_opts = [sgd(p.parameters()) for p in parties]
    server_opt = sgd(head.parameters())

    def centralized():
        joint.zero_grad()
        logits = head(torch.stack([p(x) for p, x in zip(parties, xs)]).sum(0))
        F.cross_entropy(logits, y).backward()
        joint.step()

    def split(optimizers):
        embeddings = [p(x) for p, x in zip(parties, xs)]
        fused = torch.stack([h.detach() for h in embeddings]).sum(0).requires_grad_()
        for opt in optimizers:
            opt.zero_grad()
        F.cross_entropy(head(fused), y).backward()
        torch.autograd.backward(torch.stack([(h * fused.grad).sum() for h in embeddings]).sum())
        for opt in optimizers:
            opt.step()

    variants = {
        "centralized (1 optimizer)": centralized,
        f"split, {m + 1} optimizers (as SyncVFL)": lambda: split([*party_opts, server_opt]),
        "split, 1 optimizer": lambda: split([joint]),
        "one bare server_opt.step()": server_opt.step,
    }
    times = {name: [] for name in variants}
    for step in range(args.steps + 30):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            if step >= 30:
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["centralized (1 optimizer)"])
    print(f"M = {m}, {args.features} features, batch {args.batch}, {args.threads} thread(s)")
    print("| variant | median ms | / centralized |")
    print("|---|---|---|")
    for name, values in times.items():
        ms = statistics.median(values)
        print(f"| {name} | {1e3 * ms:.3f} | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
