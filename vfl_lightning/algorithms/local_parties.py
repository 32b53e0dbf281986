"""The parties in the server's process (``runtime=local``): one
:class:`~vfl_lightning.algorithms.party.Party` per party (its model a submodule of the protocol's
LightningModule, its optimizer, generators and what it keeps between a message and its update),
updated as a group: every party's backward in one autograd pass, every step as one foreach
update."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from vfl_lightning.algorithms.parties import Parties, PartyGenerators, ServerStreams
from vfl_lightning.algorithms.party import Party, PartyOptimization, step_one, update_parties
from vfl_lightning.algorithms.party_budget import PartyBudget
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.algorithms.party_rules import (
    PartyGuard,
    ReleaseNoise,
    mechanism_noise,
    release_rows,
)
from vfl_lightning.algorithms.release_canaries import release_canaries
from vfl_lightning.models.batched import GroupedParties, groupable
from vfl_lightning.optim import step_together, zero_together
from vfl_lightning.parallel.rows import RowShares


class LocalParties(Parties):
    """The in-process simulation of the parties: ``members``, one
    :class:`~vfl_lightning.algorithms.party.Party` per model of ``models`` (party m's model at m;
    the protocol keeps them as its submodules, so Lightning moves and checkpoints them), with its
    optimizer (:meth:`make_optimizers`, which the trainer checkpoints), its generators and what it
    keeps between a message and its update. Party m reads slice m of a batch (an active server's
    own slice, the last, is never read here). The update rules, the single-party steps and the
    state are the :class:`Party` code a Ray actor runs; this class adds the grouping: every
    party's forward, backward and step at once.

    ``batch_parties``: parties of one fully connected (or polynomial network) architecture and
    input shape are evaluated as one grouped computation
    (:class:`~vfl_lightning.models.batched.GroupedParties`); they stay separate modules with
    separate optimizers and checkpoint keys. Data parallelism (:meth:`use_rows`): each rank's
    parties embed the rank's rows, the embeddings are gathered into the global batch, and the
    party gradients are summed across ranks before any step.
    ``streams``: the server's generators, shared by the simulation (:class:`ServerStreams`).

    Every member enforces its own rules (its :class:`~vfl_lightning.algorithms.party_rules.
    PartyGuard`, the code a party actor runs): a release is admitted by every member's guard
    before any member computes it, a gradient is checked before any is applied, a state is loaded
    only before the first release. ``noise``: what the parties' protocol adds to their releases
    (default: the mechanism's, :class:`ReleaseNoise`).
    """

    name = "local"

    def __init__(
        self,
        models: nn.ModuleList,
        mechanism,
        seed: int,
        streams: ServerStreams,
        *,
        batch_parties: bool = True,
        noise: ReleaseNoise | None = None,
    ) -> None:
        self.models = models
        self.mechanism = mechanism
        self.streams = streams
        self.noise = noise or ReleaseNoise(mechanism)
        self.members = [
            Party(m, model, PartyGenerators(seed, m), guard=PartyGuard(m, self.noise))
            for m, model in enumerate(models)
        ]
        self.use_policy(PartyPolicy())
        grouped = bool(batch_parties) and groupable(models)
        self.grouped = GroupedParties(models) if grouped else None
        self.rows = RowShares()
        self.optimizers: list[torch.optim.Optimizer] = []
        self.optimization = PartyOptimization(
            zero=lambda: self.zero_gradients(),
            backward=lambda hs, gs: self.backward(hs, gs),
            step=lambda: self.step(),
        )
        self._last_grouped: tuple[torch.Tensor | None, tuple[torch.Tensor, ...]] = (None, ())

    @property
    def device(self) -> torch.device:
        """Where the party models are (Lightning moves the protocol's module after building it)."""
        return next(self.models.parameters()).device

    def make_optimizers(self, factory) -> list[torch.optim.Optimizer]:
        for party in self.members:
            party.optimizer = factory(party.model.parameters())
        self.optimizers = [party.optimizer for party in self.members]
        return self.optimizers

    def use_rows(self, rows: RowShares) -> None:
        self.rows = rows

    def use_policy(self, policy: PartyPolicy) -> None:
        """Every member counts its releases under ``policy`` from now on (the config's
        ``policy``: locally every party takes it)."""
        for party in self.members:
            party.guard.budget = PartyBudget(
                party.index, policy, self.mechanism, embedding_dim=party.model.embedding_dim
            )

    def privacy_spent(self) -> list[dict]:
        return [party.guard.budget.spent() for party in self.members]

    def admit(self, call, stage, round, idx, noise, members=None) -> Callable[[], None]:
        """Every member's guard (of ``members``, default all) checks the release before any is
        computed; returns what counts it once computed: every member's budget is asked before
        any counts, so a refusal leaves no count changed and the message is never returned."""
        members = self.members if members is None else members
        rows = release_rows(idx)
        for party in members:
            party.guard.check_release(call, stage, round, rows, noise)

        def record() -> None:
            for party in members:
                party.guard.check_budget(call, stage, rows, noise)
            for party in members:
                party.guard.record_release(stage, round, rows, noise)

        return record

    # ----------------------------------------------------------------- forward
    def embed(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each party's embedding of its slice, h_m = party_m(x_m), with its gradient path.

        Grouped parties: views of one (M, B, P) tensor, each with its own gradient path to its
        own party's parameters. Data-parallel: this rank's rows, gathered into the global batch
        (gradients flow back to the rank's own rows)."""
        xs = list(xs[: len(self.models)])
        shares = self.rows.take(xs)
        if self.grouped is not None and len({x.shape[0] for x in shares}) == 1:
            stacked = self.grouped(shares)
            local = list(stacked.unbind(0))
            if stacked.requires_grad:
                self._last_grouped = (stacked, tuple(local))
        else:
            local = [party(x) for party, x in zip(self.models, shares, strict=True)]
        return self.rows.gather(local, int(xs[0].shape[0]))

    def stage_generators(
        self, stage: str, device: torch.device | None = None
    ) -> list[torch.Generator]:
        """Every party's generator of ``stage`` on ``device`` (by default the models'; the
        caller passes it when a tensor from the models is at hand, which is cheaper to ask)."""
        device = self.device if device is None else device
        for party in self.members:
            party.generators.move(device)
        return [party.generators.get(stage) for party in self.members]

    def send(self, xs, idx, *, stage, round):
        noise = None if round is None else mechanism_noise(self.mechanism)
        record = self.admit("send", stage, round, idx, noise)
        embeddings = self.embed(xs)
        detached = [h.detach() for h in embeddings]
        if stage == "train":
            detached = [
                party.training_release(idx, h)
                for party, h in zip(self.members, detached, strict=True)
            ]
        if round is not None:
            generators = self.stage_generators(stage, detached[0].device)
            detached = self.mechanism.encode(detached, generator=generators, round=round)
        record()
        if stage == "train":
            for party, x, h in zip(self.members, xs, embeddings, strict=False):
                party.keep(x, h)
        return detached

    def use_canaries(self, records, train_size: int) -> None:
        """Give every party its message canaries from the data's canary ``records``
        (:func:`~vfl_lightning.algorithms.release_canaries.release_canaries`); parties in their
        own processes build theirs from the data they read."""
        for m, party in enumerate(self.members):
            party.canaries = release_canaries(records, m, self.mechanism, train_size)

    def clean_embeddings(self, xs):
        return self.embed(xs)

    # ----------------------------------------------------------------- backward and steps
    def backward(
        self, embeddings: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor | None]
    ) -> None:
        """Every party's cut-layer backward, ``h_m.backward(gradient=g_m)``, in one engine call.

        The surrogate sum_m <h_m, g_m> (g_m constant) has gradient J_m^T g_m for party m's
        parameters, exactly what M separate backward calls compute (d<h, g>/dh = g bit for bit),
        at the cost of one autograd pass instead of M. Parties whose gradient is ``None`` are
        skipped. The gradient g_m arrived over the wire as plain values, so no loss scaling
        applies to it. Data-parallel ranks each hold their rows' part of the party gradients;
        they are summed across ranks here, before any party optimizer steps.
        """
        stacked, views = self._last_grouped
        if (
            len(embeddings) == len(views)
            and all(h is v for h, v in zip(embeddings, views, strict=True))
            and all(g is not None for g in gradients)
        ):
            # grouped parties: one backward from the stacked (M, B, P) output, the same
            # gradient stack(g_m) reaches it as through the M views
            self._last_grouped = (None, ())
            torch.autograd.backward(stacked, grad_tensors=torch.stack(list(gradients)))
            self._sum_gradients()
            return
        terms = [(h * g).sum() for h, g in zip(embeddings, gradients, strict=True) if g is not None]
        if terms:
            torch.autograd.backward(torch.stack(terms).sum())
            self._sum_gradients()

    def _sum_gradients(self) -> None:
        """Data-parallel: sum the party gradients across ranks (the grouped parties' stacked
        gradients handed to the parties first)."""
        if not self.rows.parallel:
            return
        if self.grouped is not None:
            self.grouped.distribute_gradients()
        self.rows.sum_gradients(self.models.parameters())

    def zero_gradients(self) -> None:
        """Every party optimizer's ``zero_grad()`` (gradients set to None), and the grouped
        parties' stacked gradients."""
        zero_together(self.optimizers)
        if self.grouped is not None:
            self.grouped.zero_grad()

    def step(self) -> None:
        """Step every party optimizer. Grouped parties with plain SGD optimizers of one set of
        hyperparameters: one foreach update of the stacked parameters (:meth:`GroupedParties.step`);
        otherwise the stacked gradients go to the parties, then one foreach update over every
        party's parameters (:func:`~vfl_lightning.optim.step_together`) or one step per party."""
        if self.grouped is not None:
            if self.grouped.step(self.optimizers):
                return
            self.grouped.distribute_gradients()
        if not step_together(self.optimizers):
            for optimizer in self.optimizers:
                step_one(optimizer)

    def apply_gradients(self, gradients, *, fresh=False, mu=0.0):
        """Every party's update (:func:`~vfl_lightning.algorithms.party.update_parties`) as one
        group: a fresh forward of the kept inputs grouped like :meth:`embed`."""
        embeddings = self.embed([party.x for party in self.members]) if fresh else None
        update_parties(self.members, gradients, self.optimization, embeddings=embeddings, mu=mu)

    # ----------------------------------------------------------------- asynchronous family
    def initial_embeddings(self, xs, *, chunk):
        device = self.device
        record = self.admit("initial_embeddings", "train", None, torch.arange(len(xs[0])), None)
        columns = [
            party.embedding(x.to(device), chunk) for party, x in zip(self.members, xs, strict=True)
        ]
        record()
        return columns

    def embed_rows(self, party, x, idx):
        self.admit("embed_rows", "train", None, idx, None, [self.members[party]])()
        return self.members[party].embedding(x)

    def client_messages(self, clients, xs, idx, *, zoo):
        """Local: in the order of ``clients``, each computed when asked for; ZOO directions come
        from the server's training stream (one stream for every client, :class:`ServerStreams`)."""
        for m in clients:
            self.admit("client_message", "train", None, idx, None, [self.members[m]])()
            # the client's batch slice is where its model is (the module's device)
            generator = None if zoo is None else self.streams.get("train", xs[m].device)
            yield m, *self.members[m].client_message(xs[m], zoo, generator)

    def answer_client(self, party, answer):
        """Party ``party``'s :meth:`~vfl_lightning.algorithms.party.Party.answer`, its backward
        through :meth:`backward` (the data-parallel gradient sum) and its foreach step."""
        optimizer = self.members[party].optimizer
        optimization = PartyOptimization(
            zero=lambda: zero_together([optimizer]),
            backward=self.backward,
            step=lambda: step_one(optimizer),
        )
        self.members[party].answer(answer, optimization)

    # ----------------------------------------------------------------- schedule and state
    def set_anchor(self):
        for party in self.members:
            party.set_anchor()

    def set_lr_factor(self, factor):
        for party in self.members:
            party.set_lr_factor(factor)

    def restart_stream(self, stage, release):
        for party in self.members:
            party.guard.restart(stage, release)
        for party in self.members:
            party.generators.restart(stage, release)

    def party_digests(self):
        return [party.digest() for party in self.members]

    def state_dict(self):
        """The parties' generator and guard states (their models and optimizers are in the
        trainer's checkpoint, as the protocol's submodules and optimizers)."""
        return {
            "generators": [party.generators.state_dict() for party in self.members],
            "guards": [party.guard.state_dict() for party in self.members],
        }

    def load_state_dict(self, state):
        if "generators" not in state:
            raise ValueError(
                "this checkpoint was written by runtime=ray (its parties' models live in the "
                "checkpoint's actor states): resume it with runtime=ray"
            )
        for party in self.members:
            party.guard.check_load()
        guards = state.get("guards", [None] * len(self.members))
        for party, saved, guard in zip(self.members, state["generators"], guards, strict=True):
            party.generators.load_state_dict(saved)
            party.guard.load_state_dict(guard)

    def close(self, status: str = "ended"):
        """Nothing to release: the party models belong to the protocol's module."""
