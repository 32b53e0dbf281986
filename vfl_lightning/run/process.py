"""Process hygiene around a run: the cyclic garbage collector kept off import-time objects, torch's
thread count, Lightning's console noise, Lightning's fast paths and the global seed."""

from __future__ import annotations

import gc

import lightning as L
import torch
from omegaconf import DictConfig

from vfl_lightning import lightning_speedups
from vfl_lightning.loggers import quiet_lightning

_FROZEN = False


def freeze_import_time_objects() -> None:
    """Take every object alive at the first run of this process (about 500,000 once torch,
    Lightning, Hydra and W&B are imported: modules, classes, functions) out of the cyclic garbage
    collector's view (``gc.freeze``). Otherwise a full collection, which scans them all, falls
    somewhere inside a run (about 0.2 s on a 2-core machine, a tenth of a small run). Objects made
    by runs are collected as usual; later runs of the process (a multirun) freeze nothing more."""
    global _FROZEN
    if not _FROZEN:
        gc.freeze()
        _FROZEN = True


def prepare_process(cfg: DictConfig) -> None:
    """``torch_threads``, Lightning's console kept quiet, its fast paths on or off
    (``lightning_speedups``), and every global generator seeded."""
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg.torch_threads))
    quiet_lightning()
    lightning_speedups.use(cfg.get("lightning_speedups", True))
    L.seed_everything(cfg.seed, workers=True, verbose=False)
