"""Lightning's W&B logger with the library's conventions (unique groups, names from the varying
overrides, one run id across resumes, the paper axes, best-value summaries, the model artifact)."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import os
import secrets
import string
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.utilities import rank_zero_only

from vfl_lightning.curve import read_curve
from vfl_lightning.errors import ConfigError
from vfl_lightning.wandb_names import hydra_run_info

REQUIREMENTS_FILE = "requirements.txt"
# Every val/* and test/* metric can be charted against each of these.
X_AXES = ("comm/rounds", "comm/total_mb", "time/simulated_s", "privacy/feature_eps")
ID_FILE = "wandb_id"
# Where the run was logged (id, entity, project, group, name, mode): the report reads it.
RUN_FILE = "wandb_run.json"
# Summary of these validation metrics: their best value over the run, not the last one.
BEST_SUMMARY = {
    "val/acc": "max",
    "val/acc_clean": "max",
    "val/auroc": "max",
    "val/auprc": "max",
    "val/loss": "min",
}
LIGHTNING_TIP = "💡 Tip: For seamless cloud"


def _drop_lightning_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(LIGHTNING_TIP)


def _drop_sigterm_notice(record: logging.LogRecord) -> bool:
    return "Received SIGTERM" not in str(record.msg)


def quiet_lightning() -> None:
    """Drop Lightning's advertisements for litlogger and litmodels (printed by every Trainer) and
    its internal pytree deprecation warning (about Lightning's own code, not ours). Also its
    warning that an epoch has fewer batches than ``log_every_n_steps``: the epoch means
    (``train/loss_epoch``, ``train/acc``) are logged every epoch whatever that interval. And its
    notice of a SIGTERM: the run's own line says where SIGTERM stopped it."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches .* is smaller than the logging interval"
    )
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _drop_lightning_tip not in logger.filters:
            logger.addFilter(_drop_lightning_tip)
    signals = logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector")
    if _drop_sigterm_notice not in signals.filters:
        signals.addFilter(_drop_sigterm_notice)


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


def under_sweep_agent() -> bool:
    """Whether a ``wandb agent`` started this process (it sets ``WANDB_SWEEP_ID``)."""
    return bool(os.environ.get("WANDB_SWEEP_ID"))


def login_hint(error: Exception) -> ConfigError:
    """The one-line error for an online W&B run that cannot log in."""
    reason = " ".join(str(error).split())
    return ConfigError(
        f"logger.wandb.offline=false: W&B cannot log in ({reason}); run `wandb login` or set "
        "WANDB_API_KEY, or keep logger.wandb.offline=true (upload later with `wandb sync`)"
    )


def check_credentials() -> None:
    """An online run needs an API key: refuse, before the trainer is built, a run that has none
    (W&B's own check, without contacting the server)."""
    import wandb

    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "disabled"):
        return
    if not wandb.login(prompt=False, verify=False):
        raise login_hint(RuntimeError("no API key configured"))


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger`` for VFL runs.

    - ``group``, ``name``: ``None`` (the default) derives them from the Hydra job (see
      :mod:`vfl_lightning.wandb_names`): one group per sweep directory (per run directory for a
      single run), a name ``<run_prefix>-<varying overrides>-seed<seed>``. Tags: the
      ``experiment=``, ``algo=``, ``mechanism=``, ``data=`` (``attack=``, ``runtime=``) choices,
      also put in the run config as ``choices``.
    - ``ckpt_path``: a resumed run continues the W&B run that wrote the checkpoint (its id is read
      from ``wandb_id`` in that run's directory, ``resume="allow"``); every run writes its id there,
      and where it was logged to ``wandb_run.json``.
    - Under ``wandb agent`` (W&B Sweeps) the agent's run is joined (no run id or mode is set) and
      the group is ``sweep-<sweep id>``.
    - Every ``val/*`` and ``test/*`` metric is defined against the paper axes (rounds, total MB,
      simulated seconds, feature ε); ``test/*`` rows carry the axes' last values. The summary of
      accuracy-like validation metrics is their maximum, of ``val/loss`` its minimum.
    - ``log_model``: ``last.ckpt`` is logged as a ``model`` artifact at the end of the run (offline
      too: ``wandb sync`` uploads it); Lightning's own ``log_model`` (ModelCheckpoint callbacks
      only, refused offline) is not used.
    - Lightning always passes ``anonymous`` to ``wandb.init``, which wandb >= 0.19 answers with a
      deprecation warning whatever the value; it is not passed.
    - The run's ``requirements.txt`` (installed packages) is written by :func:`installed_packages`
      instead of W&B's own listing (``x_save_requirements``), which costs ~0.15 s per run;
      ``settings: {x_save_requirements: true}`` brings W&B's back. W&B's end-of-run history
      block is left out (``quiet``): the run prints its own summary.
    """

    KWARGS_GO_TO = "wandb.init"
    """Where the keyword arguments Lightning's logger does not take go: the key index lists its
    parameters, so ``+logger.wandb.foo=1`` is refused before anything is built."""

    def __init__(
        self,
        *args: Any,
        ckpt_path: str | None = None,
        group: str | None = None,
        name: str | None = None,
        run_prefix: str = "run",
        seed: Any = None,
        log_model: bool = True,
        offline: bool = False,
        **kwargs: Any,
    ) -> None:
        agent = under_sweep_agent()
        if not offline and not agent and rank_zero_only.rank == 0:
            check_credentials()
        info = hydra_run_info(run_prefix, seed)
        self._choices = info.get("choices", {})
        if agent:  # the agent's runs of one sweep share a group; the agent picks id and mode
            group = group or f"sweep-{os.environ['WANDB_SWEEP_ID']}"
        group = group or info.get("group")
        name = name or info.get("name")
        tags = list(kwargs.pop("tags", None) or []) + info.get("tags", [])
        run_id = None
        if not agent:
            run_id = kwargs.pop("id", None) or previous_run_id(ckpt_path) or new_run_id()
        super().__init__(
            *args,
            id=run_id,
            name=name,
            group=group,
            tags=tags or None,
            offline=offline and not agent,
            **kwargs,
        )
        if agent:
            for key in ("id", "resume"):
                self._wandb_init.pop(key, None)
        else:
            self._wandb_init["resume"] = "allow"
        self._wandb_init.pop("anonymous", None)
        self._log_checkpoint = bool(log_model)
        settings = self._wandb_init.get("settings") or {}
        if isinstance(settings, dict):
            settings = {"x_save_requirements": False, "quiet": True, **settings}
            self._wandb_init["settings"] = settings
            self._write_requirements = not settings["x_save_requirements"]
        else:  # a wandb.Settings object: as given
            self._write_requirements = False
        save_dir = self._wandb_init.get("dir")
        if save_dir and run_id and rank_zero_only.rank == 0:  # DDP: rank 0's run only
            Path(save_dir).mkdir(parents=True, exist_ok=True)
            (Path(save_dir) / ID_FILE).write_text(run_id + "\n")
        self._axes_defined = False
        self._last_axes: dict[str, float] = {}

    @property
    def experiment(self):
        import wandb

        try:
            run = super().experiment
        except wandb.errors.UsageError as error:
            if self._offline:
                raise
            raise login_hint(error) from error
        if rank_zero_only.rank != 0 or self._axes_defined:
            return run  # Lightning's stand-in run on the other DDP ranks
        self._axes_defined = True
        for axis in X_AXES:
            run.define_metric(axis)
        for pattern in ("val/*", "test/*"):
            run.define_metric(pattern, step_metric="comm/rounds", step_sync=True)
        for key, best in BEST_SUMMARY.items():
            run.define_metric(key, step_metric="comm/rounds", step_sync=True, summary=best)
        save_dir = self._wandb_init.get("dir")
        if save_dir:
            self._write_run_file(run, Path(save_dir))
        if self._write_requirements and run.dir:
            (Path(run.dir) / REQUIREMENTS_FILE).write_text("\n".join(installed_packages()) + "\n")
        return run

    def _write_run_file(self, run, save_dir: Path) -> None:
        """``wandb_run.json``: where this run was logged, as the report needs it."""
        record = {
            "id": run.id,
            "entity": run.entity or None,
            "project": run.project,
            "group": run.group or None,
            "name": run.name,
            "mode": "offline" if run.offline else "online",
            "sweep_id": os.environ.get("WANDB_SWEEP_ID") or None,
        }
        save_dir.mkdir(parents=True, exist_ok=True)
        (save_dir / ID_FILE).write_text(run.id + "\n")
        (save_dir / RUN_FILE).write_text(json.dumps(record, indent=1) + "\n")

    def log_hyperparams(self, params: Any) -> None:
        """The resolved config, plus the config-group choices (``choices.experiment``)."""
        if isinstance(params, dict) and self._choices:
            params = {**params, "choices": self._choices}
        super().log_hyperparams(params)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Lightning's, with the paper axes' last values added to rows of ``test/*`` metrics."""
        if rank_zero_only.rank == 0:
            self._last_axes |= {k: v for k, v in metrics.items() if k in X_AXES}
            if any(k.startswith("test/") for k in metrics):
                metrics = {**self._last_axes, **metrics}
        super().log_metrics(metrics, step)

    def finish_run(self, results: dict, curve_path: str | Path | None) -> None:
        """Put ``results`` (results.json) in the run summary (the best-value summaries of
        :data:`BEST_SUMMARY` kept), log the curve as a table and ``last.ckpt`` as a model
        artifact. Rank 0 only."""
        import wandb

        if rank_zero_only.rank != 0:
            return
        run = self.experiment
        run.summary.update(
            {k: v for k, v in results.items() if v is not None and k not in BEST_SUMMARY}
        )
        checkpoint = results.get("checkpoint")
        if self._log_checkpoint and checkpoint and Path(checkpoint).is_file():
            artifact = wandb.Artifact(
                f"model-{run.id}",
                type="model",
                metadata={k: results.get(k) for k in ("algo", "data", "seed", "model_digest")},
            )
            artifact.add_file(str(checkpoint), name=Path(checkpoint).name)
            run.log_artifact(artifact, aliases=["latest"])
        if curve_path is None or not Path(curve_path).is_file():
            return
        rows = read_curve(curve_path)
        if rows:
            columns = list(rows[0])
            data = [[None if math.isnan(r[c]) else r[c] for c in columns] for r in rows]
            run.log({"curve": wandb.Table(columns=columns, data=data)})
