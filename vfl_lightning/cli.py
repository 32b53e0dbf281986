"""The command line's task function: run train(cfg), and turn a configuration error or a stated
run failure into one line ``error: ...`` (exit 2 or 1) instead of a traceback."""

from __future__ import annotations

import os
import sys

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from vfl_lightning.errors import error_summary, exit_code
from vfl_lightning.search import objective
from vfl_lightning.train import train


class FailedJob(CompactHydraException):
    """A multirun job's one-line error: Hydra goes on with the sweep and, at its end, reports
    the first failed job by this message alone (no traceback)."""


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def main(cfg: DictConfig) -> float | None:
    """Train; return ``optimized_metric`` for sweepers. ``HYDRA_FULL_ERROR=1`` keeps tracebacks;
    in a multirun the line is printed and raised as :class:`FailedJob` so Hydra records the job
    as failed and goes on."""
    try:
        results = train(cfg)
    except Exception as error:
        code = exit_code(error)
        if code is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        line = f"error: {error_summary(error)}"
        print(line, file=sys.stderr)
        if _multirun():
            raise FailedJob(line) from None
        sys.exit(code)
    return objective(cfg, results)
