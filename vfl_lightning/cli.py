"""The command line's task function: run train(cfg), and turn a configuration error or a stated
run failure into one line ``error: ...`` (exit 2 or 1) instead of a traceback."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from vfl_lightning.run.outcome import RUN_LOG_ONLY, error_summary, exit_code
from vfl_lightning.run.train import train
from vfl_lightning.search import objective


class FailedJob(CompactHydraException):
    """A multirun job's one-line error: Hydra goes on with the sweep and, at its end, reports
    the first failed job by this message alone (no traceback)."""


class RunLogOnly(logging.Filter):
    """Keeps records logged with ``extra=RUN_LOG_ONLY`` off a console handler (the run's log file
    keeps them): the CLI prints that error itself, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, next(iter(RUN_LOG_ONLY)), False)


RUN_LOG_ONLY_FILTER = RunLogOnly()


def keep_run_log_records_off_the_console() -> None:
    """Add :class:`RunLogOnly` to the root logger's console handlers (Hydra makes new ones per
    job)."""
    for handler in logging.getLogger().handlers:
        console = isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        )
        if console and RUN_LOG_ONLY_FILTER not in handler.filters:
            handler.addFilter(RUN_LOG_ONLY_FILTER)


class OutputDirCheck(Callback):
    """A Hydra callback (``hydra.callbacks`` in conf/hydra/default.yaml): Hydra creates the run
    (or sweep) directory before the task function runs, so an impossible or unwritable
    ``hydra.run.dir`` / ``hydra.sweep.dir`` is refused here, in one line with exit code 2."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        check_output_dir("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        check_output_dir("hydra.sweep.dir", config.hydra.sweep.dir)


class PoolAudits(Callback):
    """A Hydra callback (``hydra.callbacks``): at the end of a multirun, the message-canary
    audits of its jobs (their ``audit_<name>.npz``) are pooled by setting into one multi-run bound
    each (:func:`~vfl_lightning.privacy.analysis.message_audit.pooled_bound`): written to
    ``audit_pooled.json`` in the sweep directory and printed, one line per setting pooled."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from vfl_lightning.privacy.analysis.message_audit import pooled_bound, read_scores

        sweep = Path(config.hydra.sweep.dir)
        groups: dict[tuple[str, str], list[Path]] = {}
        for path in sorted(sweep.glob("*/audit_*.npz")):
            setting = json.dumps(read_scores(path)[0], sort_keys=True)
            groups.setdefault((path.stem.removeprefix("audit_"), setting), []).append(path)
        pooled = []
        for (name, setting), paths in groups.items():
            bound = pooled_bound(paths)
            pooled.append({"audit": name, "setting": json.loads(setting), **bound})
            print(
                f"audit {name} pooled over {bound['runs']} runs: eps_lower "
                f"{bound['eps_lower']:.4g} (beside eps_accountant {bound['eps_accountant']:.4g})",
                flush=True,
            )
        if pooled:
            (sweep / "audit_pooled.json").write_text(json.dumps(pooled, indent=2) + "\n")


def check_output_dir(key: str, directory: str) -> None:
    """Create ``directory`` (as Hydra would) or print one ``error:`` line and exit 2;
    ``HYDRA_FULL_ERROR=1`` leaves the error to Hydra and its traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        problem = None if os.access(path, os.W_OK) else "it is not writable"
    except OSError as error:
        problem = " ".join(str(error).split())
    if problem is not None:
        print(
            f"error: {key}={directory} cannot be used as the output directory: {problem}",
            file=sys.stderr,
        )
        sys.exit(2)


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def main(cfg: DictConfig) -> float | None:
    """Train; return ``optimized_metric`` for sweepers. ``HYDRA_FULL_ERROR=1`` keeps tracebacks;
    in a multirun the line is printed and raised as :class:`FailedJob` so Hydra records the job
    as failed and goes on. Under ``trainer=ddp`` rank 0 alone prints the results lines."""
    keep_run_log_records_off_the_console()
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
