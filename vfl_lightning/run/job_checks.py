"""The per-job check of a sweep: a job's config composed as the launcher composes it, then
:func:`~vfl_lightning.run.early.check_early` (no imports). The grid sweep
(:func:`vfl_lightning.run.hydra_cli.check_every_job`) and the Optuna sweeper's fixed overrides
use it."""

from __future__ import annotations

import os


def job_problem(sweeper, number: int, overrides: list[str]) -> str | None:
    """The line :func:`~vfl_lightning.run.early.check_early` refuses job ``number`` with
    (``overrides`` composed as the launcher composes them), or None."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict, read_write

    from vfl_lightning.errors import ConfigError
    from vfl_lightning.run.early import check_early

    loader = sweeper.hydra_context.config_loader
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    try:
        job = loader.load_sweep_config(master_config=sweeper.config, sweep_overrides=overrides)
        # as the launcher sets them for the job: its number, its output dir (${hydra:...})
        with open_dict(job):
            job.hydra.job.num = number
            job.hydra.job.id = f"check_{number}"
        with read_write(job.hydra.runtime):
            folder = OmegaConf.select(job, "hydra.sweep.dir"), job.hydra.sweep.subdir
            job.hydra.runtime.output_dir = os.path.abspath(os.path.join(*map(str, folder)))
        hydra_config.set_config(job)
        task = copy.deepcopy(job)
        with read_write(task), open_dict(task):
            del task["hydra"]
        check_early(task)
        return None
    except ConfigError as error:
        return " ".join(str(error).split())
    finally:
        hydra_config.cfg = previous
