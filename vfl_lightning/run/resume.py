"""Resuming a run: the protocol configuration a checkpoint must match, the checkpoint read once,
and one ConfigError naming every key that differs."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from vfl_lightning.errors import ConfigError

PROTOCOL_KEYS = ("seed", "data", "party", "head", "algo", "mechanism", "optimizer")
"""Config groups a resumed run must keep: they define the data split, the protocol and its state."""
NOT_PROTOCOL = {"data.data_dir"}


def protocol_config(cfg: DictConfig) -> dict:
    """The resolved protocol-relevant configuration, flattened to ``{"group.key": value}``."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif prefix not in NOT_PROTOCOL:
            flat[prefix] = value

    for key in PROTOCOL_KEYS:
        node = cfg.get(key)
        walk(key, OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node)
    return flat


def load_resume_checkpoint(path: str) -> dict:
    """The checkpoint at ``path``, or one ConfigError naming the path and what is wrong with it."""
    if not Path(path).is_file():
        raise ConfigError(f"ckpt_path={path} does not exist or is not a file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise ConfigError(
            f"ckpt_path={path} is not a readable checkpoint (truncated, empty or another kind of "
            f"file): {type(error).__name__}: {reason}"
        ) from error
    if not isinstance(checkpoint, dict) or "vfl" not in checkpoint:
        raise ConfigError(f"ckpt_path={path} was not written by vfl_lightning (no 'vfl' state)")
    return checkpoint


def check_resume_config(checkpoint: dict, config: dict, path: str) -> None:
    """Refuse a resume whose protocol configuration differs from the checkpoint's, naming keys."""
    stored = checkpoint["vfl"].get("config")
    if stored is None:
        raise ConfigError(
            f"ckpt_path={path} holds no run configuration (written by an older version): its data "
            "split and protocol cannot be checked, start a new run"
        )
    changed = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
    if changed:
        listed = ", ".join(
            f"{k}={config.get(k)!r} (checkpoint: {stored.get(k)!r})" for k in changed
        )
        raise ConfigError(
            f"resuming from ckpt_path={path} with a different configuration: {listed}; a resumed "
            f"run must keep {', '.join(PROTOCOL_KEYS)} (start a new run to change them)"
        )


def check_resume(cfg: DictConfig, config: dict) -> str | None:
    """``ckpt_path`` (or None) once its checkpoint is readable and matches ``config``."""
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path is not None:
        checkpoint = load_resume_checkpoint(str(ckpt_path))
        check_resume_config(checkpoint, config, str(ckpt_path))
        check_resume_epochs(checkpoint.get("epoch"), cfg.trainer, str(ckpt_path))
    return ckpt_path


def check_resume_epochs(epoch, trainer: DictConfig, path: str) -> None:
    """The checkpoint's epoch is within ``trainer.max_epochs`` (``trainer.fast_dev_run``: 1), as
    Lightning requires, or one ConfigError naming both and the fix."""
    fast = trainer.get("fast_dev_run")
    limit, key = (1, f"trainer.fast_dev_run={fast} (1 epoch)") if fast else (None, None)
    if not fast:
        limit = trainer.get("max_epochs")
        key = f"trainer.max_epochs={limit}"
    if type(epoch) is int and type(limit) is int and limit != -1 and epoch > limit:
        fix = "drop debug=fdr / trainer.fast_dev_run" if fast else f"set it to {epoch} or more"
        raise ConfigError(f"ckpt_path={path} is at epoch {epoch}, beyond {key}: {fix}")
