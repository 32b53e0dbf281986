"""Direct label inference (Fu et al., USENIX Security 2022; cascaded-hybrid paper Table I), run
from what one client observed on the wire. Plain torch: the Lightning side is in ``callback.py``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ClientObservation:
    """What client m saw in one exchange with the server.

    ``kind`` is ``"gradient"`` (first-order protocols: dL/dc_m for its batch, shape (B, P)) or
    ``"loss"`` (zeroth-order protocols: the losses h, h_hat_1..h_hat_q the server returned).
    ``displacements`` (zeroth-order only) are c_hat_k - c, shape (q, B, P): the client computed
    both outputs, so it knows them; an eavesdropper on the downlink does not.
    """

    kind: str
    received: torch.Tensor
    displacements: torch.Tensor | None = None


def labels_from_gradient(gradient: torch.Tensor) -> torch.Tensor:
    """Fu et al.'s direct attack: with a sum-fusion server and softmax cross-entropy,
    dL/dc = (softmax - onehot(y)) / B, whose only negative entry is at the label."""
    return gradient.argmin(dim=-1)


def estimate_output_gradient(losses: torch.Tensor, displacements: torch.Tensor) -> torch.Tensor:
    """A zeroth-order estimate of dL/dc from one exchange (paper §VI-B), up to a positive scale.

    ``losses`` = [h, h_hat_1, ..., h_hat_q] (scalars, or per-sample rows of shape (B,)),
    ``displacements`` the q output displacements c_hat_k - c, shape (q, B, P). Each query gives
    the directional derivative along its displacement: sum_k (h_hat_k - h) D_k / ||D_k||^2.
    """
    differences = (losses[1:] - losses[0]).to(displacements.dtype)
    q = displacements.shape[0]
    if differences.dim() == 1:
        norms = displacements.reshape(q, -1).pow(2).sum(1)
        weights = (differences / norms.clamp_min(torch.finfo(norms.dtype).tiny)).reshape(q, 1, 1)
    else:
        norms = displacements.pow(2).sum(-1)
        weights = (differences / norms.clamp_min(torch.finfo(norms.dtype).tiny)).unsqueeze(-1)
    return (weights * displacements).sum(0)


def infer_labels(
    observation: ClientObservation,
    *,
    knows_perturbation: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Labels of the batch as inferred from ``observation``.

    ``knows_perturbation=False`` is the eavesdropper of the paper: it sees the same downlink but
    not the client's perturbation, so for zeroth-order exchanges it draws its own Gaussian
    displacements (``generator``). A gradient on the wire needs no perturbation: both attackers
    read its signs.
    """
    if observation.kind == "gradient":
        return labels_from_gradient(observation.received)
    if observation.kind != "loss":
        raise ValueError(f"observation kind must be 'gradient' or 'loss', got {observation.kind!r}")
    if observation.displacements is None:
        raise ValueError("a 'loss' observation needs the client's displacements")
    displacements = observation.displacements
    if not knows_perturbation:
        displacements = torch.randn(
            displacements.shape,
            generator=generator,
            dtype=displacements.dtype,
            device=displacements.device,
        )
    return labels_from_gradient(estimate_output_gradient(observation.received, displacements))
