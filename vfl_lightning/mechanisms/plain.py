"""Plain mechanism: float32 embeddings, fused by sum, mean or concatenation (no privacy)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vfl_lightning.mechanisms.base import Mechanism, fuse_tensors


class Plain(Mechanism):
    """Each party sends its embedding in float32; the server sums, averages or concatenates."""

    def encode(self, embeddings, *, generator=None, round=0) -> list[torch.Tensor]:
        return list(embeddings)

    def fuse(self, messages: Sequence[torch.Tensor]) -> torch.Tensor:
        return fuse_tensors(messages, self.fusion)
