"""A protocol outside the library: synchronous split training whose server sends each party the
sign of its gradient times the gradient's mean absolute value (1 bit per element plus one
float32 scale per party), as signSGD compresses the downlink."""

from __future__ import annotations

import torch

from vfl_lightning.algorithms.sync import SyncVFL
from vfl_lightning.wire import DOWNLINK


class SignDownlinkVFL(SyncVFL):
    """:class:`SyncVFL` with a compressed downlink: party m receives mean(|g_m|) · sign(g_m)."""

    DATA_PARALLEL = False
    RUNTIMES = ("local",)

    def send_gradients(self, fused_grad: torch.Tensor) -> list[torch.Tensor]:
        gradients = self.mechanism.party_gradients(fused_grad, self.widths)
        scales = [g.abs().mean().reshape(1) for g in gradients]
        for m, scale in enumerate(scales):
            self.wire.send(DOWNLINK, m, scale, kind="gradient_scale")
        signs = self.wire.downlink([g.sign() for g in gradients], bits_per_element=1)
        return [scale * sign for scale, sign in zip(scales, signs, strict=True)]
