"""FedVS collusion: clients pool the Lagrange shares they hold of another client's data and
interpolate it (FedVS §4, T-privacy). Plain torch over F_p.

``python -m vfl_lightning.privacy.attacks.collusion`` prints, for every coalition size, the
fraction of a client's quantized data a coalition recovers exactly, on digits features.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch

from vfl_lightning.mechanisms.field import field_matmul, lagrange_coefficients, quantize
from vfl_lightning.mechanisms.lcc import LagrangeCode
from vfl_lightning.seeding import derive_seed


def collude(code: LagrangeCode, shares: torch.Tensor, colluders: Sequence[int]) -> torch.Tensor:
    """The coalition's estimate of the K data segments: the polynomial of degree < |coalition|
    through the shares F(alpha_n) they hold, evaluated at beta_1..beta_K. Exact once the
    coalition has K + T shares (deg F = K + T − 1); with T or fewer the shares are uniform
    whatever the data, so the estimate is independent of it."""
    colluders = list(colluders)
    nodes = code.alphas[colluders]
    matrix = lagrange_coefficients(nodes, code.betas[: code.K], code.prime)
    held = shares[colluders].reshape(len(colluders), -1)
    return field_matmul(matrix, held, code.prime).reshape(code.K, *shares.shape[1:])


def collusion_experiment(
    segments: torch.Tensor,
    *,
    num_clients: int,
    K: int,
    T: int,
    trials: int = 20,
    seed: int = 0,
) -> list[dict]:
    """For each coalition size c = 1..K+T: over ``trials`` fresh sharings of ``segments`` (K, S,
    F quantized data of one victim), each shared by a random coalition of c other clients, the
    mean fraction of entries recovered exactly (``exact_fraction``) and the fraction of trials
    with every entry exact (``all_exact``)."""
    code = LagrangeCode(num_clients, K, T)
    generator = torch.Generator().manual_seed(derive_seed(seed, "adversary", "collusion"))
    rows = []
    for size in range(1, K + T + 1):
        exact, complete = 0.0, 0
        for _ in range(trials):
            shares = code.encode_data(segments, generator=generator)
            coalition = torch.randperm(num_clients, generator=generator)[:size].tolist()
            matches = collude(code, shares, coalition) == segments
            exact += float(matches.double().mean())
            complete += int(bool(matches.all()))
        rows.append(
            {
                "colluders": size,
                "exact_fraction": exact / trials,
                "all_exact": complete / trials,
                "K": K,
                "T": T,
            }
        )
    return rows


def digits_segments(K: int, samples: int, bits: int = 8) -> torch.Tensor:
    """K segments of ``samples`` digits images (16 pixels of one quadrant), quantized to F_p."""
    from sklearn.datasets import load_digits

    images = torch.from_numpy(load_digits().images[: K * samples, :4, :4] / 16.0)
    return quantize(images.reshape(K, samples, 16), bits, 2**31 - 1)


DIGITS_IMAGES = 1797
"""Images in scikit-learn's digits set, which :func:`digits_segments` cuts into K segments."""
MAX_CLIENTS = 10_000
"""The command's largest ``--clients``: each client's share of the data is held at once."""


def argument_problem(args: argparse.Namespace) -> str | None:
    """Why the command's arguments cannot run (the flag, the value, what is allowed), or None."""
    for flag, value, low, high in (
        ("--clients", args.clients, 1, MAX_CLIENTS),
        ("--K", args.K, 1, None),
        ("--T", args.T, 0, None),
        ("--samples", args.samples, 1, None),
        ("--trials", args.trials, 1, None),
        ("--seed", args.seed, 0, 2**32 - 1),
    ):
        if value < low or (high is not None and value > high):
            allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
            return f"{flag} must be an integer {allowed}, got {value}"
    if args.K * args.samples > DIGITS_IMAGES:
        return (
            f"--K {args.K} segments of --samples {args.samples} images need "
            f"{args.K * args.samples}, and digits has {DIGITS_IMAGES}: lower --samples to at "
            f"most {DIGITS_IMAGES // args.K}"
        )
    try:
        LagrangeCode(args.clients, args.K, args.T)
    except ValueError as error:
        return f"{error} (--clients, --K, --T)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vfl_lightning.privacy.attacks.collusion",
        description=__doc__.splitlines()[0],
    )
    parser.error = lambda message: parser.exit(2, f"error: {message} (see --help)\n")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--K", type=int, default=1)
    parser.add_argument("--T", type=int, default=2)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    problem = argument_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    segments = digits_segments(args.K, args.samples)
    rows = collusion_experiment(
        segments, num_clients=args.clients, K=args.K, T=args.T, trials=args.trials, seed=args.seed
    )
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
