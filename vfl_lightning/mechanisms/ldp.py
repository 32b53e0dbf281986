"""Gaussian local differential privacy: the PBM-VFL paper's LDP baseline (§7).

Each party clips its embedding to [−C, C], adds N(0, σ²) and sends it in the clear; the server sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vfl_lightning.mechanisms.base import Mechanism, fuse_tensors, party_generator
from vfl_lightning.privacy.parameters import check_pbm_parameters


def positive_number(key: str, value) -> float:
    """``value`` as a float > 0, or one ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{key} must be > 0, got {value!r}")
    return float(value)


def matched_sigma(*, b: int, beta: float, num_parties: int) -> float:
    """σ = sqrt(2M / (b β²)): the paper's LDP noise matched to PBM's feature privacy at (b, β)."""
    b, beta, _ = check_pbm_parameters(b, beta, 1.0)
    return math.sqrt(2.0 * num_parties / (b * beta**2))


class GaussianLDP(Mechanism):
    """Every party sends clip(h_m, −C, C) + N(0, σ² I); the server adds the noisy embeddings.

    ``sigma`` sets the noise directly and then takes precedence over (``b``, ``beta``); without it,
    (``b``, ``beta``) give the paper's matched baseline σ² = 2M/(b β²). Noise comes only from the
    generator passed in. Messages are float32 and
    unmasked, so the server sees every party's noisy embedding (local DP).
    """

    noisy = True

    def __init__(
        self,
        num_parties: int,
        b: int | None = None,
        beta: float | None = None,
        sigma: float | None = None,
        C: float = 1.0,
        apply_at_eval: bool = True,
    ) -> None:
        super().__init__(num_parties, fusion="sum", apply_at_eval=apply_at_eval)
        self.C = positive_number("mechanism.C", C)
        if sigma is None:
            if b is None or beta is None:
                raise ValueError(
                    "GaussianLDP needs sigma, or both b and beta for the matched sigma"
                )
            sigma = matched_sigma(b=b, beta=beta, num_parties=self.num_parties)
        self.sigma = positive_number("mechanism.sigma", sigma)

    def encode(
        self,
        embeddings: Sequence[torch.Tensor],
        *,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        round: int = 0,
    ) -> list[torch.Tensor]:
        detached = [h.detach() for h in embeddings]
        clipped_elements = sum((h.abs() > self.C).sum() for h in detached)
        total_elements = sum(h.numel() for h in detached)
        self.stats["ldp/clip_fraction"] = clipped_elements.to(torch.float32) / total_elements
        return [self.perturb(h, party_generator(generator, m)) for m, h in enumerate(detached)]

    def perturb(self, embedding: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """clip(h, −C, C) + N(0, σ²) drawn from ``generator``: one party's message."""
        noise = torch.randn(
            embedding.shape, generator=generator, dtype=embedding.dtype, device=embedding.device
        )
        return embedding.clamp(-self.C, self.C) + self.sigma * noise

    @property
    def noise_multiplier(self) -> float:
        """σ/C: the Gaussian noise over the clipping bound."""
        return self.sigma / self.C

    def encode_party(self, party, embedding, *, generator=None, round=0) -> torch.Tensor:
        return self.perturb(embedding.detach(), generator)

    def fuse(self, messages: Sequence[torch.Tensor]) -> torch.Tensor:
        return fuse_tensors(messages, "sum")

    accounting = "ldp"

    @property
    def clip_bound(self) -> float:
        return self.C

    def parameters_state(self) -> dict:
        return {"sigma": self.sigma, "C": self.C, "num_parties": self.num_parties}

    def state_dict(self) -> dict:
        return self.parameters_state() | super().state_dict()

    def load_state_dict(self, state: dict) -> None:
        mine = self.parameters_state()
        theirs = {key: state.get(key) for key in mine}
        if theirs != mine:
            raise ValueError(
                f"checkpoint was written by GaussianLDP {theirs}, this run uses {mine}"
            )
        super().load_state_dict(state)
