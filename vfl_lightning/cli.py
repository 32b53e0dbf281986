"""The command line's task function: check the config before torch and Lightning are imported
(:mod:`vfl_lightning.run.early`), then run train(cfg); a configuration error, a stated run
failure or SIGTERM becomes one line ``error: ...`` (exit 2, 1 or 143) instead of a traceback. This module imports
neither torch nor Lightning: ``python train.py --help`` and a refused config answer in a second."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from vfl_lightning.errors import ConfigError, Terminated
from vfl_lightning.files import write_results
from vfl_lightning.run.early import check_early
from vfl_lightning.run.hydra_cli import FailedJob, hydra_command_line
from vfl_lightning.run.outcome import RUN_LOG_ONLY, error_summary, exit_code
from vfl_lightning.run.signals import EXIT_CODE as SIGTERM_EXIT_CODE
from vfl_lightning.run.signals import INTERRUPT_EXIT_CODE, sigterm_stops_the_run

__all__ = ["FailedJob", "OutputDirCheck", "main", "hydra_command_line"]

log = logging.getLogger(__name__)


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


def lightning_logs_to_stderr() -> None:
    """Lightning's own INFO lines (devices, why fit stopped, a DDP rank starting) go to stderr
    once, through their own handler, and stay out of the run's log (``train.log``, and each DDP
    process's own log). Lightning arranges this itself when it is imported before logging is
    configured; here it is imported after Hydra configured logging (after the early check)."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if not any(type(handler) is logging.StreamHandler for handler in logger.handlers):
            logger.addHandler(logging.StreamHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False


class OutputDirCheck(Callback):
    """A Hydra callback (``hydra.callbacks`` in conf/hydra/default.yaml): Hydra creates the run
    (or sweep) directory before the task function runs, so an impossible or unwritable
    ``hydra.run.dir`` / ``hydra.sweep.dir`` is refused here, in one line with exit code 2; so is
    a joblib launcher's ``n_jobs`` that joblib would refuse with a traceback."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        check_output_dir("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        check_output_dir("hydra.sweep.dir", config.hydra.sweep.dir)
        launcher = OmegaConf.select(config, "hydra.launcher._target_", default="") or ""
        jobs = OmegaConf.select(config, "hydra.launcher.n_jobs", default=None)
        if "joblib" in launcher and (
            isinstance(jobs, bool) or not isinstance(jobs, int) or jobs == 0
        ):
            fail(
                f"error: hydra.launcher.n_jobs must be a nonzero integer (jobs at a time; -1: one "
                f"per core), got {jobs!r}",
                2,
            )


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


def fail(line: str, code: int) -> None:
    """Print ``line`` and exit ``code``; in a multirun raise it as :class:`FailedJob` so Hydra
    records the job as failed and goes on."""
    print(line, file=sys.stderr)
    if _multirun():
        raise FailedJob(line, code) from None
    sys.exit(code)


def record(cfg: DictConfig, status: str, error: str, started: float) -> None:
    """results.json and the run's log for a run that stopped before :func:`train` took over."""
    output_dir = Path(str(OmegaConf.select(cfg, "paths.output_dir", default="") or "."))

    def plain(key: str):
        """The value as JSON takes it: a refused ``seed=[1,2]`` is a list, not a ListConfig."""
        value = OmegaConf.select(cfg, key, default=None)
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value

    results = {
        "status": status,
        "algo": plain("algo.name"),
        "seed": plain("seed"),
        "error": error,
        "time/wall_s": time.perf_counter() - started,
    }
    log.error("run %s: %s", status, error, extra=RUN_LOG_ONLY)
    with contextlib.suppress(OSError):
        output_dir.mkdir(parents=True, exist_ok=True)
    if output_dir.is_dir() and os.access(output_dir, os.W_OK):
        write_results(output_dir / "results.json", results)
        log.info("results: %s", output_dir / "results.json", extra=RUN_LOG_ONLY)


def main(cfg: DictConfig) -> float | None:
    """Train; return ``optimized_metric`` for sweepers. ``HYDRA_FULL_ERROR=1`` keeps tracebacks;
    in a multirun the line is printed and raised as :class:`FailedJob` so Hydra records the job
    as failed and goes on. SIGTERM (Ctrl-C) ends the run (and a multirun) with its one line, exit
    code 143 (130). Under ``trainer=ddp`` rank 0 alone prints the results lines."""
    with sigterm_stops_the_run():
        return _main(cfg)


def _main(cfg: DictConfig) -> float | None:
    started = time.perf_counter()
    keep_run_log_records_off_the_console()
    lightning_logs_to_stderr()
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        check_early(cfg)
    except ConfigError as error:
        record(cfg, "failed", error_summary(error), started)
        if full_error:
            raise
        fail(f"error: {error_summary(error)}", 2)
    try:
        from vfl_lightning.run.train import train
        from vfl_lightning.search import objective

        results = train(cfg)
    except (Terminated, KeyboardInterrupt) as stop:
        line = str(stop) if isinstance(stop, Terminated) else ""
        code = stop.exit_code if isinstance(stop, Terminated) else INTERRUPT_EXIT_CODE
        if not line:  # before train() took over (e.g. while torch is imported)
            by = "SIGTERM" if code == SIGTERM_EXIT_CODE else "Ctrl-C"
            line = f"stopped by {by} before training started: results.json has status interrupted"
            record(cfg, "interrupted", line, started)
        if full_error:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(code)
    except Exception as error:
        code = exit_code(error)
        if code is None or full_error:
            raise
        fail(f"error: {error_summary(error)}", code)
    return objective(cfg, results)
