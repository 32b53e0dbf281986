"""train(cfg) and build(cfg), importable from here; the run's steps live in ``run/``
(checks, assembly, the Ray session, resume, results, outcome). The root train.py adds @hydra.main."""

from vfl_lightning.files import strict_json, write_results
from vfl_lightning.run.assemble import build
from vfl_lightning.run.checks import check_runtime
from vfl_lightning.run.early import check_run_config
from vfl_lightning.run.ray_session import attach_ray_parties, start_ray
from vfl_lightning.run.train import train

__all__ = [
    "attach_ray_parties",
    "build",
    "check_run_config",
    "check_runtime",
    "start_ray",
    "strict_json",
    "train",
    "write_results",
]
