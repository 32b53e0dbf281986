"""Rényi DP of the Gaussian mechanism, for the PBM-VFL paper's local-DP baseline.

Each party releases clip(h_m) + N(0, σ² I) in the clear; these functions give its ε(α).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vfl_lightning.privacy.analysis.pbm import check_orders, compose


def gaussian_rdp(*, orders: Sequence[float], sensitivity: float, sigma: float) -> np.ndarray:
    """ε(α) = α Δ² / (2σ²) of one Gaussian release with L2 sensitivity Δ (Mironov 2017, Prop. 7)."""
    orders = check_orders(orders)
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if sensitivity < 0:
        raise ValueError(f"sensitivity must be >= 0, got {sensitivity}")
    return orders * float(sensitivity) ** 2 / (2.0 * float(sigma) ** 2)


def ldp_feature_rdp(
    *, orders: Sequence[float], sigma: float, C: float, embedding_dim: int, uses: float
) -> np.ndarray:
    """Feature privacy of the LDP baseline: one party's embedding in [−C, C]^P changes.

    Its noisy embedding is released on its own, with L2 sensitivity 2C√P, ``uses`` times.
    """
    sensitivity = 2.0 * float(C) * float(embedding_dim) ** 0.5
    return compose(gaussian_rdp(orders=orders, sensitivity=sensitivity, sigma=sigma), count=uses)


def ldp_sample_rdp(
    *,
    orders: Sequence[float],
    sigma: float,
    C: float,
    embedding_dim: int,
    num_parties: int,
    uses: float,
) -> np.ndarray:
    """Sample privacy of the LDP baseline: all M independent party releases of a sample change."""
    feature = ldp_feature_rdp(
        orders=orders, sigma=sigma, C=C, embedding_dim=embedding_dim, uses=uses
    )
    return compose(feature, count=num_parties)
