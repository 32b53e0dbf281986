"""FedVS collusion: clients pool the Lagrange shares they hold of another client's data and
interpolate it (FedVS §4, T-privacy). Plain torch over F_p.

``python -m vfl_lightning.privacy.attacks.collusion`` prints, for every coalition size, the
fraction of a client's quantized data a coalition recovers exactly, on digits features.
"""

from __future__ import annotations

import argparse
import json
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--K", type=int, default=1)
    parser.add_argument("--T", type=int, default=2)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    segments = digits_segments(args.K, args.samples)
    rows = collusion_experiment(
        segments, num_clients=args.clients, K=args.K, T=args.T, trials=args.trials, seed=args.seed
    )
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
