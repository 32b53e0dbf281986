"""From a Rényi DP curve to (ε, δ)-DP, through ``dp_accounting`` (not re-derived here).

Also the expected number of times a training sample is released (the paper's T·B/N).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from vfl_lightning.privacy.analysis.pbm import check_orders

DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [
        1.01,
        1.02,
        1.05,
        1.1,
        1.25,
        1.5,
        1.75,
        2.0,
        2.5,
        3.0,
        4.0,
        5.0,
        6.0,
        8.0,
        10.0,
        12.0,
        16.0,
        20.0,
    ]
    + [24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 256.0]
)
"""The default Rényi orders α of the accountant (configurable everywhere)."""


def rdp_to_dp(
    *, orders: Sequence[float], rdp: Sequence[float], delta: float
) -> tuple[float, float]:
    """(ε, optimal α) at ``delta`` for the RDP curve ``rdp`` over ``orders``.

    Delegates to ``dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon``.
    """
    orders = check_orders(orders)
    rdp = np.asarray(rdp, dtype=np.float64)
    if rdp.shape != orders.shape:
        raise ValueError(f"rdp has shape {rdp.shape}, orders have shape {orders.shape}")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    epsilon, order = compute_epsilon(list(orders), list(rdp), float(delta))
    return float(epsilon), float(order)


def expected_uses(*, steps: int, batch_size: int, num_samples: int) -> float:
    """T·B/N: how often a training sample is released in T steps of batch B over N samples."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return float(steps) * float(batch_size) / float(num_samples)
