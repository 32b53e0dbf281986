"""The parties in the server's process (``runtime=local``): the module's own party models and
Lightning optimizers, every party's backward in one autograd pass."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vfl_lightning.algorithms.parties import Parties, PartyGenerators, tensor_digest
from vfl_lightning.algorithms.party_updates import (
    PartyOptimization,
    client_update,
    cut_layer_update,
)
from vfl_lightning.algorithms.zoo import ZooQuery, ZooSettings, client_query
from vfl_lightning.optim import scale_lr, zero_together


class LocalParties(Parties):
    """The in-process simulation: the module's own party models and Lightning optimizers,
    one autograd pass for every party's backward (:meth:`VFLModule.backward_parties`)."""

    name = "local"

    def __init__(self, module) -> None:
        self.module = module
        self.generators = [PartyGenerators(module.seed, m) for m in range(module.num_parties)]
        self._last_xs: Sequence[torch.Tensor] | None = None
        self._last_embeddings: list[torch.Tensor] | None = None
        self._anchors: list[list[torch.Tensor]] | None = None
        self._queries: dict[int, ZooQuery] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._zoo: ZooSettings | None = None

    def stage_generators(self, stage: str) -> list[torch.Generator]:
        device = self.module.device
        for gens in self.generators:
            gens.move(device)
        return [gens.get(stage) for gens in self.generators]

    def send(self, xs, idx, *, stage, round):
        embeddings = self.module.embed(xs)
        if stage == "train":
            self._last_xs, self._last_embeddings = xs, embeddings
        detached = [h.detach() for h in embeddings]
        if round is None:
            return detached
        return self.module.mechanism.encode(
            detached, generator=self.stage_generators(stage), round=round
        )

    def apply_gradients(self, gradients, *, fresh=False, mu=0.0):
        module = self.module
        party_opts, _ = module.split_optimizers()
        embeddings = module.embed(self._last_xs) if fresh else self._last_embeddings
        cut_layer_update(
            module.party_optimization(party_opts),
            embeddings,
            gradients,
            models=module.parties,
            anchors=self._anchors,
            mu=mu,
        )
        self._last_embeddings = None

    def initial_embeddings(self, xs, *, chunk):
        device = self.module.device
        with torch.no_grad():
            return [
                torch.cat(
                    [
                        party(x[start : start + chunk].to(device))
                        for start in range(0, len(x), chunk)
                    ]
                )
                for party, x in zip(self.module.parties, xs, strict=True)
            ]

    def embed_rows(self, party, x, idx):
        with torch.no_grad():
            return self.module.parties[party](x)

    def client_messages(self, clients, xs, idx, *, zoo):
        """Local: in the order of ``clients``, each computed when asked for; ZOO directions come
        from the module's training generator (one stream for every client)."""
        self._zoo = zoo
        for m in clients:
            party = self.module.parties[m]
            if zoo is None:
                self._outputs[m] = party(xs[m])
                yield m, self._outputs[m].detach(), None
                continue
            query = client_query(party, xs[m], zoo, self.module.generator("train"))
            self._queries[m] = query
            yield m, query.embedding, query.perturbed

    def answer_client(self, party, answer):
        module = self.module
        party_opts, _ = module.split_optimizers()
        opt = party_opts[party]
        optimization = PartyOptimization(
            zero=lambda: zero_together([opt.optimizer]),
            backward=module.backward_parties,
            step=lambda: module.step_party(opt),
        )
        query = self._queries.pop(party, None)
        pending = self._outputs.pop(party) if query is None else query
        client_update(optimization, pending, answer, model=module.parties[party], zoo=self._zoo)

    def set_anchor(self):
        self._anchors = [
            [p.detach().clone() for p in party.parameters()] for party in self.module.parties
        ]

    def set_lr_factor(self, factor):
        party_opts, _ = self.module.split_optimizers()
        for opt in party_opts:
            scale_lr(opt.optimizer, factor)

    def restart_stream(self, stage, release):
        for gens in self.generators:
            gens.restart(stage, release)

    def party_digests(self):
        return [tensor_digest(list(p.named_parameters())).hexdigest() for p in self.module.parties]

    def state_dict(self):
        return {"generators": [gens.state_dict() for gens in self.generators]}

    def load_state_dict(self, state):
        if "generators" not in state:
            raise ValueError(
                "this checkpoint was written by runtime=ray (its parties' models live in the "
                "checkpoint's actor states): resume it with runtime=ray"
            )
        for gens, saved in zip(self.generators, state["generators"], strict=True):
            gens.load_state_dict(saved)

    def close(self):
        """Nothing to release: the party models belong to the module."""
