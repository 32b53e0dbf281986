"""train(cfg): check, build, fit, test and report one run; each step is a function of ``run/``,
so this reads top to bottom. results.json is written whatever happens."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import lightning as L
from omegaconf import DictConfig, OmegaConf

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.checkpoints import LastCheckpoint
from vfl_lightning.curve import CurveWriter
from vfl_lightning.errors import Terminated
from vfl_lightning.files import write_results
from vfl_lightning.run.assemble import (
    build_in_data_dir,
    charge_alignment,
    make_callbacks,
    make_loggers,
    make_trainer,
)
from vfl_lightning.run.checks import (
    check_accounting,
    check_checkpoint_dir,
    check_output_dir,
    check_runtime,
)
from vfl_lightning.run.config_checks import check_config
from vfl_lightning.run.early import check_early
from vfl_lightning.run.outcome import (
    RUN_LOG_ONLY,
    error_summary,
    exit_code,
    finish_wandb,
    interrupted,
)
from vfl_lightning.run.process import freeze_import_time_objects, prepare_process
from vfl_lightning.run.results import finished_results, logged_metrics, progress_results
from vfl_lightning.run.resume import check_resume, protocol_config
from vfl_lightning.run.runtimes import LocalRuntime, make_runtime
from vfl_lightning.run.schema import check_unindexed_keys
from vfl_lightning.run.signals import EXIT_CODE as SIGTERM_EXIT_CODE
from vfl_lightning.run.signals import (
    INTERRUPT_EXIT_CODE,
    ignore_sigterm_from_here,
    raise_if_terminated,
    sigterm_message,
    sigterm_stops_the_run,
    take_sigterm_back,
    terminated,
)
from vfl_lightning.run.summary import print_summary

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict:
    """Train and test the configured protocol; return (and write) the results dictionary.

    ``results.json`` is written whatever happens, with ``status``: ``finished``, ``failed``
    (with ``error``, also logged) or ``interrupted`` (Ctrl-C or SIGTERM: then
    :class:`~vfl_lightning.errors.Terminated` is raised with the one line and its exit code); W&B is finished with
    a non-zero exit code unless the run finished.
    """
    with sigterm_stops_the_run():
        return _train(cfg)


def _train(cfg: DictConfig) -> dict:
    started = time.perf_counter()
    freeze_import_time_objects()
    output_dir = Path(cfg.paths.output_dir)
    results: dict = {"status": "failed", "algo": cfg.algo.get("name"), "seed": cfg.get("seed")}
    trainer: L.Trainer | None = None
    module: VFLModule | None = None
    runtime: LocalRuntime | None = None
    refused = False
    try:
        check_output_dir(output_dir)
        check_checkpoint_dir(cfg)
        check_early(cfg)  # with every check of the schema that needs no import
        check_unindexed_keys(cfg)
        check_config(cfg)
        check_runtime(cfg)
        prepare_process(cfg)
        config = protocol_config(cfg)
        ckpt_path = check_resume(cfg, config)
        runtime = make_runtime(cfg)
        runtime.start(cfg)
        take_sigterm_back()
        datamodule, module = build_in_data_dir(cfg, runtime)
        module.run_config = config
        runtime.attach(cfg, module)
        charge_alignment(module, datamodule)
        callbacks = make_callbacks(cfg)
        check_accounting(module, callbacks)
        loggers = make_loggers(cfg)
        trainer = make_trainer(cfg, callbacks, loggers, resuming=ckpt_path is not None)
        for logger in loggers:
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        # the checkpoint was unpickled in full above (check_resume): Lightning's own weights-only
        # load would refuse list-valued hyperparameters (e.g. algo.client_speeds)
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=False)
        raise_if_terminated()
        module.check_finite()
        fit_metrics = logged_metrics(trainer)
        test_rows = []
        if cfg.get("test", True) and not trainer.fast_dev_run:
            test_rows = trainer.test(module, datamodule=datamodule, verbose=False)
            raise_if_terminated()
        results |= finished_results(cfg, module, trainer, callbacks, fit_metrics, test_rows)
        results["status"] = "finished"
        curve = next((c.path for c in callbacks if isinstance(c, CurveWriter)), None)
        for logger in loggers:
            if hasattr(logger, "finish_run"):
                logger.finish_run(results, curve)
        return results
    except BaseException as error:
        refused = exit_code(error) == 2  # a configuration refusal: its error line says it all
        stopped = terminated(error)
        ctrl_c = not stopped and interrupted(error)
        results["status"] = "interrupted" if stopped or ctrl_c else "failed"
        results |= progress_results(module, trainer)
        if stopped or ctrl_c:
            by = "SIGTERM" if stopped else "Ctrl-C"
            results["error"] = sigterm_message(results, last_checkpoint(trainer), by)
        else:
            results["error"] = error_summary(error)
        log.error("run %s: %s", results["status"], results["error"], extra=RUN_LOG_ONLY)
        if stopped or ctrl_c:
            code = SIGTERM_EXIT_CODE if stopped else INTERRUPT_EXIT_CODE
            raise Terminated(results["error"], code) from error
        raise
    finally:
        ignore_sigterm_from_here()
        if module is not None:
            module.party_side.close(results.get("status", "ended"))
        if runtime is not None:
            runtime.stop()
        results["time/wall_s"] = time.perf_counter() - started
        # With trainer=ddp every rank holds the same totals: rank 0 alone writes them.
        rank_zero = trainer is None or trainer.is_global_zero
        written = rank_zero and output_dir.is_dir() and os.access(output_dir, os.W_OK)
        if written:
            write_results(output_dir / "results.json", results)
            log.info("results: %s", output_dir / "results.json", extra=RUN_LOG_ONLY)
        finish_wandb(0 if results["status"] == "finished" else 1)
        if written and not refused:
            print_summary(results, output_dir)


def last_checkpoint(trainer: L.Trainer | None) -> Path | None:
    """The run's last checkpoint file (None before the first is written)."""
    for callback in trainer.callbacks if trainer is not None else []:
        if isinstance(callback, LastCheckpoint) and callback.last_model_path:
            return Path(callback.last_model_path)
    return None
