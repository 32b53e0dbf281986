"""results.json: what a finished run reports (protocol, metrics, totals, callbacks' results),
and what a failed one keeps (written by :func:`vfl_lightning.files.write_results`)."""

from __future__ import annotations

import contextlib

import lightning as L
from omegaconf import DictConfig

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.party_factory import chosen_configs
from vfl_lightning.checkpoints import LastCheckpoint
from vfl_lightning.run.checks import party_seeds, runtime_name


def scalar(value) -> float | int | str | None:
    if hasattr(value, "item"):
        return value.item()
    return value


def logged_metrics(trainer: L.Trainer) -> dict:
    """The trainer's latest logged metrics as plain numbers (read right after ``fit``: testing
    replaces them)."""
    return {k: scalar(v) for k, v in trainer.callback_metrics.items()}


def finished_results(
    cfg: DictConfig,
    module: VFLModule,
    trainer: L.Trainer,
    callbacks: list,
    fit_metrics: dict,
    test_rows: list[dict],
) -> dict:
    """The results of a finished run (``status`` set by the caller): ``fit_metrics`` from
    :func:`logged_metrics` after fitting, ``test_rows`` from ``trainer.test``."""
    test_metrics = {k: scalar(v) for row in test_rows for k, v in row.items()}
    choices = chosen_configs()
    results = {
        "algo": cfg.algo.get("name"),
        "mechanism": choices.get("mechanism", cfg.mechanism.get("_target_")),
        "data": cfg.data.get("name"),
        "party": choices.get("party"),
        "head": choices.get("head"),
        "num_parties": module.num_parties,
        "active_party": module.server_party is not None,
        "seed": cfg.seed,
        "runtime": runtime_name(cfg),
        "party_seeds": party_seeds(cfg),
        "model_digest": module.model_digest(),
        "epochs": int(trainer.current_epoch),
        "global_step": int(trainer.global_step),
        **{k: v for k, v in fit_metrics.items() if not k.startswith("test/")},
        **test_metrics,
        **module.results(),
        **data_results(trainer.datamodule),
    }
    for callback in callbacks:
        if hasattr(callback, "results"):
            results |= callback.results()
    checkpoint = next((c for c in callbacks if isinstance(c, LastCheckpoint)), None)
    if checkpoint is not None and checkpoint.last_model_path:
        results["checkpoint"] = checkpoint.last_model_path
    return results


def data_results(datamodule) -> dict:
    """``data/aligned_rows``: the rows the run's splits hold (after the PSI, the rows every party
    holds; without it, every row); ``data/split_alpha`` and ``data/split_beta``: VertiBench's
    measures of the split (:mod:`vfl_lightning.data.vertibench`)."""
    splits = getattr(datamodule, "splits", None) or {}
    return {
        "data/aligned_rows": int(sum(len(split) for split in splits.values())),
        **getattr(datamodule, "split_scores", {}),
    }


def progress_results(module: VFLModule | None, trainer: L.Trainer | None) -> dict:
    """What a run that stopped early reached: epochs, steps and the communication totals."""
    results: dict = {}
    if trainer is not None:
        results |= {"epochs": int(trainer.current_epoch), "global_step": trainer.global_step}
    if module is not None:
        results |= module.communication_metrics()
        # a party that cannot answer (its process died) has nothing to add
        with contextlib.suppress(Exception):
            results |= module.party_privacy()
    return results
