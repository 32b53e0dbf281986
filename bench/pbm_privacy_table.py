"""PBM-VFL privacy: the exact per-release RDP next to the paper's asymptotic forms (README table).

Run: python bench/pbm_privacy_table.py [--parties 4]
"""

from __future__ import annotations

import argparse

import numpy as np

from vfl_lightning.privacy.analysis import pbm_rdp, sample_privacy_factor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parties", type=int, default=4)
    args = parser.parse_args()
    m = args.parties
    orders = np.array([2.0, 8.0, 32.0])
    print(
        f"M = {m}, one coordinate, one release. implied C0 = exact eps_feat(alpha) / (b beta^2 alpha / M)"
    )
    print(
        "| b | beta | alpha | exact eps_feat | implied C0 | exact eps_sample | eps_sample / eps_feat | paper S_M(alpha)/alpha |"
    )
    print("|---|---|---|---|---|---|---|---|")
    factor = sample_privacy_factor(orders, m) / orders if m >= 2 else np.full(orders.shape, np.nan)
    for b in (2, 4, 16):
        for beta in (0.05, 0.1, 0.15):
            feature = pbm_rdp(orders=orders, b=b, beta=beta, num_parties=m)
            sample = pbm_rdp(orders=orders, b=b, beta=beta, num_parties=m, num_changed=m)
            implied = feature / (b * beta**2 * orders / m)
            for i, alpha in enumerate(orders):
                print(
                    f"| {b} | {beta} | {alpha:g} | {feature[i]:.4g} | {implied[i]:.3g} | "
                    f"{sample[i]:.4g} | {sample[i] / feature[i]:.3g} | {factor[i]:.3g} |"
                )


if __name__ == "__main__":
    main()
