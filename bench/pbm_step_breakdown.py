"""Where a PBM-VFL step's extra time goes: the mechanism's parts timed alone, in one process.

Same shapes as bench/step_overhead.py (batch 256, P = 16). Prints CPU microseconds per call.
Every release takes the next round, as training does, so the pair masks are expanded in blocks of
consecutive rounds (``PairwiseMasking``) and their column is the per-round share of a block.

    python bench/pbm_step_breakdown.py --parties 4 --b 2 16 64
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from vfl_lightning.mechanisms import PBM, GaussianLDP, Plain


def cpu_us(function, repeats: int) -> float:
    for _ in range(10):
        function()
    start = time.process_time()
    for _ in range(repeats):
        function()
    return 1e6 * (time.process_time() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--b", nargs="+", type=int, default=[2, 16, 64])
    parser.add_argument("--beta", type=float, default=0.15)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    embeddings = [
        2 * torch.rand(args.batch, args.width, generator=generator) - 1 for _ in range(args.parties)
    ]
    stacked = torch.stack(embeddings)
    shape = (args.batch, args.width)
    print(
        f"torch {torch.__version__}, {args.threads} threads, M = {args.parties}, "
        f"batch {args.batch}, P = {args.width}; CPU us per call"
    )
    print(
        "| mechanism | encode + fuse | quantize | pair masks | mask (add) | secure sum + dequantize |"
    )
    print("|---|---|---|---|---|---|")
    plain = Plain(args.parties)
    ldp = GaussianLDP(args.parties, b=16, beta=args.beta)
    for name, mech in (("plain (npq)", plain), ("ldp b=16", ldp)):
        total = cpu_us(
            lambda m=mech: m.fuse(m.encode(embeddings, generator=generator)), args.repeats
        )
        print(f"| {name} | {total:.0f} | - | - | - | - |")
    for b in args.b:
        pbm = PBM(args.parties, b, args.beta)
        counts = list(pbm.quantize(stacked, generator).unbind(0))
        masked = pbm.masking.mask(counts, 0)
        rounds = itertools.count(1)
        total = cpu_us(
            lambda p=pbm, r=rounds: p.fuse(
                p.encode(embeddings, generator=generator, round=next(r))
            ),
            args.repeats,
        )
        quantize = cpu_us(lambda p=pbm: p.quantize(stacked, generator), args.repeats)
        masks = cpu_us(lambda p=pbm, r=rounds: p.masking.party_masks(next(r), shape), args.repeats)
        mask = cpu_us(lambda p=pbm, c=counts, r=rounds: p.masking.mask(c, next(r)), args.repeats)
        server = cpu_us(lambda p=pbm, y=masked: p.fuse(y), args.repeats)
        print(
            f"| pbm b={b} (R = 2^{pbm.bits_per_element}) | {total:.0f} | {quantize:.0f} | "
            f"{masks:.0f} | {mask - masks:.0f} | {server:.0f} |"
        )


if __name__ == "__main__":
    main()
