"""Protocols as LightningModules (manual optimization): one class per protocol family."""

from vfl_lightning.algorithms.asynchronous import HybridVFL
from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.sync import SyncVFL

__all__ = ["HybridVFL", "SyncVFL", "VFLModule"]
