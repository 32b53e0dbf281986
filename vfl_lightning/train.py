"""train(cfg): build data, parties, head, mechanism, algorithm, trainer from a Hydra config, fit,
test, and write results.json. Importable; the root train.py only adds @hydra.main."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from vfl_lightning.curve import CurveWriter
from vfl_lightning.loggers import quiet_lightning

log = logging.getLogger(__name__)


def _hydra_choices() -> dict:
    try:
        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}


def build(cfg: DictConfig):
    """Instantiate (datamodule, module) from ``cfg``; runtime sizes are passed at instantiation."""
    datamodule = instantiate(cfg.data)
    num_parties = len(datamodule.party_shapes)
    parties = [instantiate(cfg.party)(input_shape=shape) for shape in datamodule.party_shapes]
    # An active label holder (data.active_party=true) gets its own party model for its own slice.
    server_shape = getattr(datamodule, "server_shape", None)
    server_party = (
        None if server_shape is None else instantiate(cfg.party)(input_shape=server_shape)
    )
    mechanism = instantiate(cfg.mechanism)(num_parties=num_parties)
    widths = [p.embedding_dim for p in parties]
    if server_party is not None:
        widths.append(server_party.embedding_dim)
    head = instantiate(cfg.head)(
        in_features=mechanism.fused_width(widths), num_classes=datamodule.num_classes
    )
    active = {} if server_party is None else {"server_party": server_party}
    module = instantiate(
        cfg.algo,
        parties=parties,
        head=head,
        mechanism=mechanism,
        optimizer=instantiate(cfg.optimizer),
        num_classes=datamodule.num_classes,
        seed=cfg.seed,
        **active,
    )
    return datamodule, module


def _loggers(cfg: DictConfig) -> list:
    return [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]


def _callbacks(cfg: DictConfig) -> list:
    return [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]


def _scalar(value) -> float | int | str | None:
    if hasattr(value, "item"):
        return value.item()
    return value


def train(cfg: DictConfig) -> dict:
    """Train and test the configured protocol; return (and write) the results dictionary."""
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg.torch_threads))
    quiet_lightning()
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        datamodule, module = build(cfg)
        callbacks = _callbacks(cfg)
        loggers = _loggers(cfg)
        trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
        for logger in loggers:
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
        fit_metrics = {k: _scalar(v) for k, v in trainer.callback_metrics.items()}
        test_metrics = {}
        if cfg.get("test", True) and not trainer.fast_dev_run:
            for row in trainer.test(module, datamodule=datamodule, verbose=False):
                test_metrics |= {k: _scalar(v) for k, v in row.items()}
        choices = _hydra_choices()
        results = {
            "algo": cfg.algo.get("name"),
            "mechanism": choices.get("mechanism", cfg.mechanism.get("_target_")),
            "data": cfg.data.get("name"),
            "party": choices.get("party"),
            "head": choices.get("head"),
            "num_parties": module.num_parties,
            "active_party": module.server_party is not None,
            "seed": cfg.seed,
            "epochs": int(trainer.current_epoch),
            "global_step": int(trainer.global_step),
            **{k: v for k, v in fit_metrics.items() if not k.startswith("test/")},
            **test_metrics,
            **module.results(),
            "time/wall_s": time.perf_counter() - started,
        }
        for callback in callbacks:
            if hasattr(callback, "results"):
                results |= callback.results()
        checkpoint = next(
            (c for c in callbacks if isinstance(c, L.pytorch.callbacks.ModelCheckpoint)), None
        )
        if checkpoint is not None and checkpoint.last_model_path:
            results["checkpoint"] = checkpoint.last_model_path
        with open(output_dir / "results.json", "w") as f:
            json.dump(results, f, indent=2, sort_keys=True)
        log.info("results: %s", output_dir / "results.json")
        curve = next((c.path for c in callbacks if isinstance(c, CurveWriter)), None)
        for logger in loggers:
            if hasattr(logger, "finish_run"):
                logger.finish_run(results, curve)
        return results
    finally:
        _finish_wandb()


def _finish_wandb() -> None:
    """Close any W&B run so one failed multirun job does not poison the next."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
