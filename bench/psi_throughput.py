"""Throughput of the sample alignment (ECDH-PSI on ristretto255, data/psi.py): one label holder and
one party of N ids each, half of them shared, every message as the runtimes send it, both sides in
this process one after the other (no network); prints a table.

    python bench/psi_throughput.py                 # N = 10^5 and 10^6
    python bench/psi_throughput.py --sizes 10000   # quicker

ids/s is N over the wall time of the whole PSI (both sides' work: the runtimes overlap the
parties' work with each other, not with the label holder's). group ops/s counts every hash to the
group and every scalar multiplication of both sides (AlignmentReport.work), the rate
``network.group_ops_per_second`` models.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import time

import numpy as np

from vfl_lightning.data.alignment import align_with_parties, local_exchange
from vfl_lightning.data.psi import PsiParty, group


def per_element_costs(samples: int = 20_000) -> tuple[float, float]:
    """(µs per hash to the group, µs per scalar multiplication), one libsodium call each."""
    rbcl = group()
    digests = [hashlib.sha512(str(i).encode()).digest() for i in range(samples)]
    start = time.perf_counter()
    points = [rbcl.crypto_core_ristretto255_from_hash(d) for d in digests]
    hashed = time.perf_counter() - start
    scalar = rbcl.crypto_core_ristretto255_scalar_random()
    start = time.perf_counter()
    for point in points:
        rbcl.crypto_scalarmult_ristretto255(scalar, point)
    multiplied = time.perf_counter() - start
    return hashed / samples * 1e6, multiplied / samples * 1e6


def machine() -> str:
    """The CPU's model name (Linux), else the platform's."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(size: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    universe = rng.choice(10**12, size=size + size // 2, replace=False).astype(np.int64)
    holder, party = universe[:size], universe[size // 2 :]
    split = rng.permutation(holder)  # the label holder's stages mix shared and own ids
    stages = {"train": split[: size // 2], "val": split[size // 2 : 3 * size // 4]}
    stages["test"] = split[3 * size // 4 :]
    start = time.perf_counter()
    report = align_with_parties(stages, local_exchange([PsiParty(party, 0)]), 1)
    wall = time.perf_counter() - start
    ops = sum(holder_ops + sum(party_ops) for holder_ops, party_ops in report.work)
    assert report.aligned_rows == size // 2
    return {
        "ids": size,
        "aligned": report.aligned_rows,
        "wall_s": wall,
        "ids_per_s": size / wall,
        "group_ops_per_s": ops / wall,
        "mb": report.total_bytes / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6])
    args = parser.parse_args()
    print(
        f"{machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; rbcl (libsodium ristretto255), one process"
    )
    hash_us, mult_us = per_element_costs()
    print(
        f"per element: hash to the group {hash_us:.1f} µs, scalar multiplication {mult_us:.1f} µs"
    )
    print(
        f"{'ids per side':>12} {'aligned':>9} {'wall s':>9} {'ids/s':>9} {'group ops/s':>12} {'MB':>9}"
    )
    for size in args.sizes:
        row = run(size)
        print(
            f"{row['ids']:>12,} {row['aligned']:>9,} {row['wall_s']:>9.1f} "
            f"{row['ids_per_s']:>9,.0f} {row['group_ops_per_s']:>12,.0f} {row['mb']:>9.1f}"
        )


if __name__ == "__main__":
    main()
