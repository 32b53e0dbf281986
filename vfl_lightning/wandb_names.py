"""The W&B group, run name and tags of a Hydra job: unique groups per sweep or run directory,
names from the overrides that vary, tags from the config-group choices (experiment included)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

# Config-group choices written as tags (``algo=pbm``).
TAG_GROUPS = ("experiment", "algo", "mechanism", "data", "attack", "runtime")
# Override keys left out of run names: shown otherwise (algo, data, seed) or plumbing.
UNNAMED_KEYS = ("algo", "data", "seed")
UNNAMED_PREFIXES = ("hydra", "paths", "logger", "callbacks", "ckpt_path", "trainer.enable_progress")


def unique_group(directory: str | Path) -> str:
    """``<parent>_<name>-<6 hex digits of the absolute path>``: the default sweep directory
    ``multirun/2026-11-25/20-30-18`` gives ``2026-11-25_20-30-18-1a2b3c``; two sweeps in folders
    of the same name (``a/pbm``, ``b/pbm``) get different groups."""
    path = Path(directory).resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:6]
    return f"{'_'.join(path.parts[-2:])}-{digest}"


def _override_key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _is_named(key: str) -> bool:
    return key not in UNNAMED_KEYS and not key.startswith(UNNAMED_PREFIXES)


def swept_keys(sweep_dir: Path) -> set[str] | None:
    """Keys a multirun sweeps over (``a=1,2``, ``range(...)``, and a search sweeper's
    ``hydra.sweeper.params``), read from the sweep's ``multirun.yaml``; None when that file is
    not there."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    hydra_node = (yaml.safe_load(path.read_text()) or {}).get("hydra", {})
    task = (hydra_node.get("overrides") or {}).get("task", [])
    parsed = OverridesParser.create().parse_overrides([str(t) for t in task])
    searched = set((hydra_node.get("sweeper") or {}).get("params") or {})
    return searched | {o.key_or_group for o in parsed if o.is_sweep_override()}


def agent_keys() -> set[str] | None:
    """The parameters a `wandb agent` sweeps over (its ``WANDB_SWEEP_PARAM_PATH`` file), or None
    outside an agent."""
    path = os.environ.get("WANDB_SWEEP_PARAM_PATH")
    if not path or not Path(path).is_file():
        return None
    return set(yaml.safe_load(Path(path).read_text()) or {}) - {"wandb_version", "_wandb"}


def run_name(prefix: str, seed: Any, overrides: list[str], varying: set[str] | None) -> str:
    """``<prefix>-<key=value of each varying override>-seed<seed>``, keys by their last part
    (``algo.local_steps=5`` -> ``local_steps=5``); every override counts when ``varying`` is None."""
    parts = [prefix]
    for override in overrides:
        key = _override_key(override)
        if _is_named(key) and (varying is None or key in varying):
            parts.append(f"{key.rsplit('.', 1)[-1]}={override.partition('=')[2]}")
    return "-".join([*parts, f"seed{seed}"])


def hydra_run_info(prefix: str, seed: Any) -> dict[str, Any]:
    """Group, name and tags of the running Hydra job ({} outside Hydra): the group is unique per
    multirun sweep directory (one per run directory for a single run); the name carries the
    overrides that vary within the sweep (a single run's: all, or a `wandb agent`'s parameters)."""
    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    choices = dict(hydra_cfg.runtime.choices)
    overrides = [str(o) for o in hydra_cfg.overrides.task]
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hydra_cfg.sweep.dir)
        group, varying = unique_group(sweep_dir), swept_keys(sweep_dir)
    elif OmegaConf.is_missing(hydra_cfg.runtime, "output_dir"):  # composed, not run (tests)
        group, varying = None, None
    else:
        group, varying = unique_group(hydra_cfg.runtime.output_dir), agent_keys()
    return {
        "group": group,
        "name": run_name(prefix, seed, overrides, varying),
        "tags": [f"{g}={choices[g]}" for g in TAG_GROUPS if choices.get(g)],
        "choices": {g: choices[g] for g in TAG_GROUPS if choices.get(g)},
    }
