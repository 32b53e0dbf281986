"""A mechanism outside the library: each party clips its embedding to [-bound, bound] and sends it
rounded to one of 2^bits evenly spaced levels (``bits`` per element on the wire); the server
dequantizes and fuses. Deterministic, so it adds no privacy."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vfl_lightning.mechanisms.base import Mechanism, fuse_tensors


class UniformQuantizer(Mechanism):
    def __init__(
        self,
        num_parties: int,
        fusion: str = "sum",
        apply_at_eval: bool = True,
        bits: int = 4,
        bound: float = 1.0,
    ) -> None:
        super().__init__(num_parties, fusion, apply_at_eval)
        if not 1 <= int(bits) <= 16:
            raise ValueError(f"mechanism.bits must be in [1, 16], got {bits}")
        if not bound > 0:
            raise ValueError(f"mechanism.bound must be > 0, got {bound}")
        self.bits_per_element = int(bits)
        self.bound = float(bound)
        self.levels = 2 ** int(bits) - 1

    def encode_party(self, party, embedding, *, generator=None, round=0) -> torch.Tensor:
        clipped = embedding.detach().clamp(-self.bound, self.bound)
        return torch.round((clipped + self.bound) / (2 * self.bound) * self.levels)

    def encode(self, embeddings, *, generator=None, round=0) -> list[torch.Tensor]:
        return [self.encode_party(m, h) for m, h in enumerate(embeddings)]

    def fuse(self, messages: Sequence[torch.Tensor]) -> torch.Tensor:
        values = [q / self.levels * (2 * self.bound) - self.bound for q in messages]
        return fuse_tensors(values, self.fusion)
