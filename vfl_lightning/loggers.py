"""Lightning's W&B logger with the library's conventions (group per multirun, job type = algo,
tags from the Hydra choices, one run id across resumes, the paper axes), and a quieter start."""

from __future__ import annotations

import importlib.metadata
import logging
import math
import secrets
import string
import warnings
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger

from vfl_lightning.curve import read_curve

REQUIREMENTS_FILE = "requirements.txt"
# Every val/* and test/* metric can be charted against each of these.
X_AXES = ("comm/rounds", "comm/total_mb", "time/simulated_s", "privacy/feature_eps")
ID_FILE = "wandb_id"
LIGHTNING_TIP = "💡 Tip: For seamless cloud"


def _drop_lightning_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(LIGHTNING_TIP)


def quiet_lightning() -> None:
    """Drop Lightning's advertisements for litlogger and litmodels (printed by every Trainer) and
    its internal pytree deprecation warning (about Lightning's own code, not ours)."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _drop_lightning_tip not in logger.filters:
            logger.addFilter(_drop_lightning_tip)


def hydra_run_info() -> dict[str, Any]:
    """Group, job type and tags from the running Hydra job: a multirun's jobs share the sweep
    directory's name as group; tags are the algo, mechanism and data choices."""
    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    choices = dict(hydra_cfg.runtime.choices)
    info: dict[str, Any] = {
        "tags": [f"{g}={choices[g]}" for g in ("algo", "mechanism", "data") if choices.get(g)]
    }
    if hydra_cfg.mode == RunMode.MULTIRUN:
        info["group"] = Path(hydra_cfg.sweep.dir).name
    return info


def installed_packages() -> list[str]:
    """``name==version`` of every installed distribution, sorted.

    Read from the names of the ``name-version.dist-info`` metadata directories (about 1 ms);
    parsing every METADATA file, as W&B does for its requirements.txt, costs about 0.15 s per
    run. Distributions without a version in their directory name (egg-info) are parsed."""
    lines = set()
    for dist in importlib.metadata.distributions():
        path = getattr(dist, "_path", None)
        name = version = ""
        if path is not None and path.name.endswith(".dist-info"):
            name, _, version = path.name[: -len(".dist-info")].partition("-")
        if not (name and version):
            name, version = dist.metadata["Name"], dist.version
        lines.add(f"{name}=={version}")
    return sorted(lines)


def new_run_id() -> str:
    """A fresh W&B run id: 8 lowercase letters and digits, like wandb's own."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def previous_run_id(ckpt_path: str | Path | None) -> str | None:
    """The W&B run id of the run that wrote ``ckpt_path`` (``<run dir>/checkpoints/x.ckpt``)."""
    if not ckpt_path:
        return None
    ckpt = Path(ckpt_path)
    for directory in (ckpt.parent.parent, ckpt.parent):
        id_file = directory / ID_FILE
        if id_file.is_file():
            return id_file.read_text().strip() or None
    return None


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger`` for VFL runs.

    - ``group``: the multirun's sweep directory name (``None`` outside a multirun keeps the
      configured value); ``tags``: ``algo=``, ``mechanism=``, ``data=`` Hydra choices.
    - ``ckpt_path``: a resumed run continues the W&B run that wrote the checkpoint (its id is read
      from ``wandb_id`` in that run's directory, ``resume="allow"``); every run writes its id there.
    - Every ``val/*`` and ``test/*`` metric is defined against the paper axes (rounds, total MB,
      simulated seconds, feature ε) so W&B charts them over any of these.
    - Lightning always passes ``anonymous`` to ``wandb.init``, which wandb >= 0.19 answers with a
      deprecation warning whatever the value; it is not passed.
    - The run's ``requirements.txt`` (installed packages) is written by :func:`installed_packages`
      instead of W&B's own listing (``x_save_requirements``), which costs ~0.15 s per run;
      ``settings: {x_save_requirements: true}`` brings W&B's back.
    """

    def __init__(
        self, *args: Any, ckpt_path: str | None = None, group: str | None = None, **kwargs: Any
    ) -> None:
        info = hydra_run_info()
        group = info.get("group", group)
        tags = list(kwargs.pop("tags", None) or []) + info.get("tags", [])
        run_id = kwargs.pop("id", None) or previous_run_id(ckpt_path) or new_run_id()
        super().__init__(*args, id=run_id, group=group, tags=tags or None, **kwargs)
        self._wandb_init["resume"] = "allow"
        self._wandb_init.pop("anonymous", None)
        settings = self._wandb_init.get("settings") or {}
        if isinstance(settings, dict):
            settings = {"x_save_requirements": False, **settings}
            self._wandb_init["settings"] = settings
            self._write_requirements = not settings["x_save_requirements"]
        else:  # a wandb.Settings object: as given
            self._write_requirements = False
        save_dir = self._wandb_init.get("dir")
        if save_dir:
            Path(save_dir).mkdir(parents=True, exist_ok=True)
            (Path(save_dir) / ID_FILE).write_text(run_id + "\n")
        self._axes_defined = False

    @property
    def experiment(self):
        run = super().experiment
        if not self._axes_defined and callable(getattr(run, "define_metric", None)):
            for axis in X_AXES:
                run.define_metric(axis)
            for pattern in ("val/*", "test/*"):
                run.define_metric(pattern, step_metric="comm/rounds", step_sync=True)
            self._axes_defined = True
            run_dir = getattr(run, "dir", None)
            if self._write_requirements and run_dir:
                (Path(run_dir) / REQUIREMENTS_FILE).write_text(
                    "\n".join(installed_packages()) + "\n"
                )
        return run

    def finish_run(self, results: dict, curve_path: str | Path | None) -> None:
        """Put ``results`` (results.json) in the run summary and log the curve as a table."""
        import wandb

        run = self.experiment
        run.summary.update({k: v for k, v in results.items() if v is not None})
        if curve_path is None or not Path(curve_path).is_file():
            return
        rows = read_curve(curve_path)
        if rows:
            columns = list(rows[0])
            data = [[None if math.isnan(r[c]) else r[c] for c in columns] for r in rows]
            run.log({"curve": wandb.Table(columns=columns, data=data)})
