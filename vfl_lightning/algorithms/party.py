"""One party, the same code in every runtime: :class:`Party` holds its model, optimizer and
generators, what it keeps between a message and its update, and its state; the update rules
(the cut-layer step with FedPBCD's proximal term, an asynchronous client's ZOO or first-order
step) are the functions below. The local parties hold one :class:`Party` per party (their models
are the protocol module's submodules) and update them as a group; every Ray actor wraps one. Each
party's :class:`~vfl_lightning.algorithms.party_rules.PartyGuard` holds the rules it enforces on
the server's calls (its releases, its state, what it applies) and its own privacy budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vfl_lightning.algorithms.gradient_checks import checked_gradients
from vfl_lightning.algorithms.parties import PartyGenerators, tensor_digest
from vfl_lightning.algorithms.party_rules import PartyGuard
from vfl_lightning.algorithms.zoo import (
    ZooQuery,
    ZooSettings,
    client_estimate,
    client_query,
    set_gradient,
)
from vfl_lightning.optim import scale_lr, step_together, zero_together

Backward = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]


@dataclass(frozen=True)
class PartyOptimization:
    """How a group of parties zeroes, back-propagates and steps: one party alone
    (:attr:`Party.optimization`), or the local parties all at once (one autograd pass, one
    foreach step, the data-parallel gradient sum).

    ``backward(embeddings, gradients)`` runs h_m.backward(g_m) for every pair.
    """

    zero: Callable[[], None]
    backward: Backward
    step: Callable[[], None]


def plain_backward(embeddings: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]) -> None:
    """h_m.backward(g_m) for every pair, as one engine call."""
    torch.autograd.backward(list(embeddings), list(gradients))


def step_one(optimizer: torch.optim.Optimizer) -> None:
    """One party optimizer's step; a plain SGD one as a foreach update (:func:`step_together`,
    the same values as its own ``step``)."""
    if not step_together([optimizer]):
        optimizer.step()


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
            set_gradient(model, estimate, pending.parameters)
        else:
            optimization.backward([pending.output], [estimate])
    else:
        optimization.backward([pending], [answer])
    optimization.step()


class Party:
    """Party ``index``: its ``model``, ``optimizer`` (set by whoever builds the optimizers),
    ``generators`` and FedPBCD's ``anchor``; what it keeps between a message and its update (the
    training input ``x`` and its forward ``h``, or an asynchronous client's ZOO ``query``); its
    state (:meth:`state_dict`); its ``guard`` (:class:`PartyGuard`: a plain protocol under the
    default policy when None). Every update goes through :func:`update_parties` or
    :func:`client_update`, whether the party is one of the local group or alone in an actor, and
    every gradient or answer it applies is checked by its guard first."""

    def __init__(
        self,
        index: int,
        model: nn.Module,
        generators: PartyGenerators,
        optimizer: torch.optim.Optimizer | None = None,
        guard: PartyGuard | None = None,
    ) -> None:
        self.index = int(index)
        self.guard = guard or PartyGuard(index)
        self.model = model
        self.generators = generators
        self.optimizer = optimizer
        self.anchor: list[torch.Tensor] | None = None
        self.x: torch.Tensor | None = None
        self.h: torch.Tensor | None = None
        self.query: ZooQuery | None = None
        self.zoo: ZooSettings | None = None
        self.canaries: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    @property
    def optimization(self) -> PartyOptimization:
        """This party alone: its gradients set to None, h.backward(g), its optimizer's step."""
        optimizer = self.optimizer
        return PartyOptimization(
            zero=lambda: zero_together([optimizer]),
            backward=plain_backward,
            step=lambda: step_one(optimizer),
        )

    # ----------------------------------------------------------------- messages
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """h = model(x), with its gradient path where autograd records."""
        return self.model(x)

    def keep(self, x: torch.Tensor, h: torch.Tensor) -> None:
        """Keep a training message's input ``x`` and the forward ``h`` it sent (with its gradient
        path) for the update its gradient brings."""
        self.x, self.h = x, h

    def training_release(self, idx: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """What the party hands its mechanism of training rows ``idx``: the (detached) embedding,
        with its message canaries' rows replaced (``canaries``, an audit's;
        :mod:`~vfl_lightning.algorithms.release_canaries`)."""
        return embedding if self.canaries is None else self.canaries(idx, embedding)

    def embedding(self, x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """model(x) without gradient, ``chunk`` rows at a time (all at once when None)."""
        step = len(x) if chunk is None else int(chunk)
        with torch.no_grad():
            if step >= len(x):
                return self.model(x)
            return torch.cat([self.model(x[s : s + step]) for s in range(0, len(x), step)])

    def client_message(
        self, x: torch.Tensor, zoo: ZooSettings | None, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An asynchronous client's message (c, c_hat): a ZOO query with directions from
        ``generator`` (:func:`~vfl_lightning.algorithms.zoo.client_query`; the party keeps it),
        or, without ``zoo``, its embedding c (c_hat None; the party keeps the forward); an
        empty batch is refused (a query needs a row to take its batch mean over)."""
        if len(x) == 0:
            raise self.guard.refusal("client_message", "a client message embeds at least one row")
        self.zoo = zoo
        if zoo is None:
            self.h = self.model(x)
            return self.h.detach(), None
        self.query = client_query(self.model, x, zoo, generator)
        return self.query.embedding, self.query.perturbed

    # ----------------------------------------------------------------- updates
    def apply_gradient(self, gradient: torch.Tensor, *, fresh: bool = False, mu: float = 0.0):
        """h.backward(g) of the kept message (``fresh``: recomputed on the kept input with the
        current parameters, a FedBCD local step), FedPBCD's proximal term when ``mu`` > 0, step."""
        if fresh and self.x is None:
            raise self.guard.refusal("apply_gradient", "it has no training input to step on")
        self.guard.check_update("apply_gradient", fresh)
        embeddings = [self.model(self.x)] if fresh else None
        update_parties([self], [gradient], self.optimization, embeddings=embeddings, mu=mu)
        self.guard.count_update()

    def answer(self, answer: torch.Tensor, optimization: PartyOptimization | None = None) -> None:
        """Finish the update of the last :meth:`client_message` from the server's ``answer``
        (:func:`client_update`; ``optimization``: the group's, by default this party's own),
        checked first: dL/dc like the embedding sent, or a ZOO query's 1 + q float64 losses."""
        pending = self.h if self.zoo is None else self.query
        if self.zoo is None:
            (answer,) = checked_gradients([self.guard], [answer], [pending], "answer")
        else:
            expected = (
                None
                if pending is None
                else pending.perturbed.new_empty(1 + pending.perturbed.shape[0])
            )
            (answer,) = checked_gradients([self.guard], [answer], [expected], "answer")
        self.h, self.query = None, None
        client_update(
            optimization or self.optimization, pending, answer, model=self.model, zoo=self.zoo
        )

    def project_weights(self, bound: float) -> None:
        """|w| <= ``bound`` for the model's weight (FedVS's projection, Assumption 4)."""
        with torch.no_grad():
            self.model.weight.clamp_(-bound, bound)

    # ----------------------------------------------------------------- schedule and state
    def set_anchor(self) -> None:
        """θ_anchor = the current parameters (FedPBCD's θ^{r0})."""
        self.anchor = [p.detach().clone() for p in self.model.parameters()]

    def set_lr_factor(self, factor: float) -> None:
        self.guard.check_lr_factor(factor)
        scale_lr(self.optimizer, factor)

    def digest(self) -> str:
        """:func:`tensor_digest` (hex) of the model's named parameters."""
        return tensor_digest(list(self.model.named_parameters())).hexdigest()

    def state_dict(self) -> dict:
        """Model tensors (on the CPU), optimizer state, generator states and its guard's state
        (last rounds, its budget's counts)."""
        return {
            "model": {k: v.cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "generators": self.generators.state_dict(),
            "guard": self.guard.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state``: refused once the party released anything in this process."""
        self.guard.check_load()
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generators.load_state_dict(state["generators"])
        self.guard.load_state_dict(state.get("guard"))


def update_parties(
    parties: Sequence[Party],
    gradients: Sequence[torch.Tensor | None],
    optimization: PartyOptimization,
    *,
    embeddings: Sequence[torch.Tensor] | None = None,
    mu: float = 0.0,
) -> None:
    """The cut-layer update of every party in ``parties`` from the gradient it received
    (:func:`cut_layer_update` with each party's anchor): through its kept forward, or through
    ``embeddings`` (a fresh forward of the kept inputs); each party then forgets its forward.
    Every gradient is checked by its party's guard first (:func:`checked_gradients`)."""
    if embeddings is None:
        embeddings = [party.h for party in parties]
    if mu != 0:
        parties[0].guard.check_mu(mu)
    gradients = checked_gradients([party.guard for party in parties], gradients, embeddings)
    anchors = [party.anchor for party in parties] if mu > 0 else None
    models = [party.model for party in parties]
    cut_layer_update(optimization, embeddings, gradients, models=models, anchors=anchors, mu=mu)
    for party in parties:
        party.h = None
