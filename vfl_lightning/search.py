"""The value a run returns to a Hydra sweeper (Optuna): its ``optimized_metric``, or a penalty
when the run spent more feature privacy than the search's budget."""

from __future__ import annotations

import logging
import math

from omegaconf import DictConfig

log = logging.getLogger(__name__)


def objective(cfg: DictConfig, results: dict) -> float | None:
    """``results[cfg.optimized_metric]``, or ``cfg.search.penalty`` when ``cfg.search.max_feature_eps``
    is set and the run's ``privacy/feature_eps`` exceeds it (a run without a privacy accountant
    spends unbounded ε, so it is over any budget). ``None`` when no metric is configured or the
    run did not produce it.
    """
    search = cfg.get("search") or {}
    budget = search.get("max_feature_eps")
    if budget is not None:
        budget = float(budget)
        if not budget > 0.0:
            raise ValueError(f"search.max_feature_eps must be > 0 (or null), got {budget}")
        penalty = search.get("penalty")
        if penalty is None or not math.isfinite(float(penalty)):
            raise ValueError(f"search.penalty must be a finite number, got {penalty!r}")
        spent = results.get("privacy/feature_eps")
        if spent is None or float(spent) > budget:
            log.info(
                "feature eps %s over the budget %s: returning penalty %s", spent, budget, penalty
            )
            return float(penalty)
    metric = cfg.get("optimized_metric")
    if not metric:
        return None
    value = results.get(metric)
    if value is None:
        log.warning("optimized_metric %r is not in the results", metric)
        return None
    return float(value)
