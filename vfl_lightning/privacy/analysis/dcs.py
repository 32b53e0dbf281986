"""VFLAIR's defense capability score (DCS): one number for an attack's performance against the
main task's, relative to an attack that learns nothing and the undefended protocol."""

from __future__ import annotations

import math

DCS_BETA = 0.5
"""VFLAIR's weight of the main-task term in the DCS (β = 0.5: attack and utility weigh alike)."""


def defense_capability_score(
    *,
    attack_performance: float,
    attack_baseline: float,
    main_performance: float,
    main_reference: float,
    beta: float = DCS_BETA,
) -> float:
    """DCS = 1 / (1 + sqrt((1−β)(AP−AP*)² + β(MP−MP*)²)) (VFLAIR): 1 when the attack does no
    better than its no-information value AP* and the main task keeps MP* (the same protocol's
    metric without defense); lower is a worse trade-off."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"DCS beta must be in [0, 1], got {beta}")
    distance = (1.0 - beta) * (attack_performance - attack_baseline) ** 2
    distance += beta * (main_performance - main_reference) ** 2
    return 1.0 / (1.0 + math.sqrt(distance))
