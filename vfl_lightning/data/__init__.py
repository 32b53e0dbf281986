"""Vertical data: dataset loaders, partitions, and the VerticalDataModule.

Loaders and partitions are plain numpy; the Lightning data module is imported on first use.
"""

from vfl_lightning.data.datasets import LOADERS, load_dataset
from vfl_lightning.data.partition import PARTITIONS, PartySlice, make_partition
from vfl_lightning.data.raw import RawDataset, binary_view

__all__ = [
    "LOADERS",
    "PARTITIONS",
    "PartySlice",
    "RawDataset",
    "VerticalDataModule",
    "binary_view",
    "load_dataset",
    "make_partition",
]


def __getattr__(name: str):
    if name == "VerticalDataModule":
        from vfl_lightning.data.datamodule import VerticalDataModule

        return VerticalDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
