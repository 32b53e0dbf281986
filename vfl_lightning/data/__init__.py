"""Vertical data: dataset loaders, partitions, and the VerticalDataModule."""

from vfl_lightning.data.datamodule import VerticalDataModule
from vfl_lightning.data.datasets import LOADERS, RawDataset, binary_view, load_dataset
from vfl_lightning.data.partition import PARTITIONS, PartySlice, make_partition

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
