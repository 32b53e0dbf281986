"""The PBM-VFL paper's closed forms (Theorems 6.1, 6.2), for documentation beside the exact ε(α).

They carry the paper's unspecified universal constant C0, so they are shapes, not guarantees.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vfl_lightning.privacy.analysis.pbm import check_orders


def paper_feature_rdp(
    *,
    orders: Sequence[float],
    c0: float,
    b: int,
    beta: float,
    num_parties: int,
    embedding_dim: int,
    uses: float,
) -> np.ndarray:
    """Theorem 6.1: ε_final^feat(α) = C0 · (T B / N) · P b β² α / M."""
    orders = check_orders(orders)
    return c0 * uses * embedding_dim * b * beta**2 * orders / num_parties


def sample_privacy_factor(orders: Sequence[float], num_parties: int) -> np.ndarray:
    """Theorem 6.2's S_M(α) = (2^{M+1} − 2^{M−1} − 2) α − (3·2^{M−1} − 3M) + (2^{M−1} − 1)/(2^{M−2}(α−1))."""
    orders = check_orders(orders)
    if num_parties < 2:
        raise ValueError(f"S_M(alpha) is defined for num_parties >= 2, got {num_parties}")
    m = float(num_parties)
    return (
        (2 ** (m + 1) - 2 ** (m - 1) - 2) * orders
        - (3 * 2 ** (m - 1) - 3 * m)
        + (2 ** (m - 1) - 1) / (2 ** (m - 2) * (orders - 1))
    )


def paper_sample_rdp(
    *,
    orders: Sequence[float],
    c0: float,
    b: int,
    beta: float,
    num_parties: int,
    embedding_dim: int,
    uses: float,
) -> np.ndarray:
    """Theorem 6.2 composed over T B / N uses: C0 · (T B / N) · P b β² S_M(α) / M."""
    factor = sample_privacy_factor(orders, num_parties)
    return c0 * uses * embedding_dim * b * beta**2 * factor / num_parties
