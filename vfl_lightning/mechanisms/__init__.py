"""Mechanisms: how the parties' embeddings reach the server (plain, PBM, LDP, LCC)."""

from vfl_lightning.mechanisms.base import (
    Mechanism,
    fuse_tensors,
    fused_width,
    join_own_embedding,
    split_gradient,
)
from vfl_lightning.mechanisms.ldp import GaussianLDP
from vfl_lightning.mechanisms.pbm import PBM
from vfl_lightning.mechanisms.plain import Plain

__all__ = [
    "PBM",
    "GaussianLDP",
    "Mechanism",
    "Plain",
    "fuse_tensors",
    "fused_width",
    "join_own_embedding",
    "split_gradient",
]
