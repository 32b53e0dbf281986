"""Plain mechanism: float32 embeddings, fused by sum, mean, element-wise max or concatenation (no
privacy)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vfl_lightning.mechanisms.base import Mechanism, fuse_tensors, max_winners, split_gradient


class Plain(Mechanism):
    """Each party sends its embedding in float32; the server sums, averages, takes the element-wise
    maximum (FedVS Fig. 1's third aggregation) or concatenates.

    Under ``fusion=max`` the gradient is the subgradient of the maximum: :meth:`fuse` remembers,
    per element, which party won (the lowest index among ties), and :meth:`party_gradients` sends
    dL/d(fused) to that party and zero to the others for that element, exactly what autograd
    gives through :func:`~vfl_lightning.mechanisms.base.fuse_tensors`.
    """

    winners: torch.Tensor | None = None
    """Per element of the last fused input, the index of the party that won the maximum."""

    def encode(self, embeddings, *, generator=None, round=0) -> list[torch.Tensor]:
        return list(embeddings)

    def fuse(self, messages: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.fusion == "max":
            self.winners = max_winners(messages)
        return fuse_tensors(messages, self.fusion)

    def party_gradients(self, grad: torch.Tensor, widths: Sequence[int]) -> list[torch.Tensor]:
        return split_gradient(grad, self.fusion, widths, self.winners)
