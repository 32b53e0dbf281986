"""Protocols as LightningModules (manual optimization): one class per protocol family."""

from vfl_lightning.algorithms.asynchronous import HybridVFL
from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.fedbcd import FedBCD
from vfl_lightning.algorithms.fedvs import FedVSFamily
from vfl_lightning.algorithms.sync import SyncVFL

__all__ = ["FedBCD", "FedVSFamily", "HybridVFL", "SyncVFL", "VFLModule"]
