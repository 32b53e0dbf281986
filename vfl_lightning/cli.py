"""The command line's task function: run train(cfg), and turn a configuration error or a stated
run failure into one line ``error: ...`` (exit 2 or 1) instead of a traceback."""

from __future__ import annotations

import os
import sys

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from vfl_lightning.errors import error_summary, exit_code
from vfl_lightning.train import train


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def main(cfg: DictConfig) -> float | None:
    """Train; return ``optimized_metric`` for sweepers. ``HYDRA_FULL_ERROR=1`` keeps tracebacks;
    in a multirun the error is printed and re-raised so Hydra records the failed job."""
    try:
        results = train(cfg)
    except Exception as error:
        code = exit_code(error)
        if code is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {error_summary(error)}", file=sys.stderr)
        if _multirun():
            raise
        sys.exit(code)
    print(f"results: {cfg.paths.output_dir}/results.json")
    value = results.get(cfg.get("optimized_metric"))
    return None if value is None else float(value)
