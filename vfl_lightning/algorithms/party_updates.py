"""The party side of an update, one implementation for every transport: the cut-layer step
(backward of the received gradient, FedPBCD's proximal term) and an asynchronous client's step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vfl_lightning.algorithms.zoo import ZooQuery, ZooSettings, client_estimate, set_gradient

Backward = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]


@dataclass(frozen=True)
class PartyOptimization:
    """How one side zeroes, back-propagates and steps its party models: the local parties do all
    of theirs at once (one autograd pass, one foreach step), a Ray actor its own one.

    ``backward(embeddings, gradients)`` runs h_m.backward(g_m) for every pair.
    """

    zero: Callable[[], None]
    backward: Backward
    step: Callable[[], None]


def plain_backward(embeddings: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]) -> None:
    """h_m.backward(g_m) for every pair, as one engine call."""
    torch.autograd.backward(list(embeddings), list(gradients))


def proximal_term(
    parameters: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], mu: float
) -> torch.Tensor:
    """μ/2 · ‖θ − θ^{r0}‖², whose gradient μ(θ − θ^{r0}) FedPBCD (eq. 13) adds to every update."""
    squares = [(p - a).pow(2).sum() for p, a in zip(parameters, anchors, strict=True)]
    return 0.5 * mu * torch.stack(squares).sum()


def cut_layer_update(
    optimization: PartyOptimization,
    embeddings: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor | None],
    *,
    models: Sequence[nn.Module],
    anchors: Sequence[Sequence[torch.Tensor]] | None = None,
    mu: float = 0.0,
) -> None:
    """Each party m of ``models``: h_m.backward(g_m) with the gradient g_m it received, plus the
    proximal gradient μ(θ_m − θ_anchor) when ``mu`` > 0 (FedPBCD), then its optimizer steps."""
    optimization.zero()
    optimization.backward(embeddings, gradients)
    if mu > 0:
        penalties = [
            proximal_term(list(model.parameters()), anchor, mu)
            for model, anchor in zip(models, anchors, strict=True)
        ]
        torch.autograd.backward(torch.stack(penalties).sum())
    optimization.step()


def client_update(
    optimization: PartyOptimization,
    pending: ZooQuery | torch.Tensor,
    answer: torch.Tensor,
    *,
    model: nn.Module,
    zoo: ZooSettings | None,
) -> None:
    """An asynchronous client finishes the update its last message started (``pending``: its ZOO
    query, or the forward of a first-order message) from the server's ``answer``: the two-point
    estimate of eq. 3 from the query's losses (set on the parameters, or back-propagated through
    the model when the query perturbed its output), or the backward of dL/dc; then it steps."""
    optimization.zero()
    if isinstance(pending, ZooQuery):
        estimate = client_estimate(pending, answer, zoo)
        if pending.output is None:
            set_gradient(model, estimate)
        else:
            optimization.backward([pending.output], [estimate])
    else:
        optimization.backward([pending], [answer])
    optimization.step()
