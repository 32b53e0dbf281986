"""runtime=ray for the asynchronous family (:class:`~vfl_lightning.algorithms.HybridVFL`): the party actor's
side of a ZOO query or embedding (with a real work delay) and the server's side, which takes the
clients' messages in the order they arrive (``ray.wait``), so the table's staleness is real."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import ray
import torch

from vfl_lightning.algorithms.party_rules import release_rows
from vfl_lightning.algorithms.zoo import ZooSettings
from vfl_lightning.runtime.transport import serialized_bytes

DELAY_STREAM = "delays"
"""The party generator stream its work delays are drawn from (checkpointed with the actor)."""


def work_delay(mean_s: float, generator: torch.Generator) -> None:
    """Sleep a party's next work delay, Exp with mean ``mean_s`` seconds drawn from its
    ``delays`` stream ``generator``."""
    uniform = torch.rand((), generator=generator, dtype=torch.float64)
    time.sleep(-math.log1p(-float(uniform)) * mean_s)


class AsyncPartyMethods:
    """The asynchronous family's calls on a party actor (mixed into
    :class:`~vfl_lightning.runtime.ray_parties.AsyncPartyActor`, which holds ``features``,
    ``device`` and its ``own`` :class:`~vfl_lightning.algorithms.party.Party`, whose
    ``client_message`` and ``answer`` the local parties run too). The family sends plain
    embeddings (its protocols refuse any mechanism but ``plain``): the initial pass, a refreshed
    entry and a message are the embeddings the protocol releases. The initial pass runs once per
    actor (a resumed run restores the server's table from its checkpoint).

    A query's directions come from the party's own training generator (seeded by ``party_seed``),
    so ZOO runs differ from ``runtime=local`` (one module generator for every client). With a
    work delay set, the party sleeps Exp(rate = speed) × ``time_scale`` seconds, drawn from its
    own ``delays`` stream, before computing each message: the real time a slower client takes.
    """

    work_mean_s: float | None = None
    """Mean work delay in seconds (None: no delay, the default with equal client speeds)."""
    initial_pass_done = False
    """Whether this party already sent its initial pass (it sends it once)."""

    def set_work_delay(self, speed: float, time_scale: float) -> None:
        self.work_mean_s = float(time_scale) / float(speed)

    def initial_embeddings(self, chunk: int):
        """(embedding of the whole training split, serialized bytes), ``chunk`` rows at a time:
        the initial pass that fills the server's table, sent once."""
        if self.initial_pass_done:
            raise PermissionError(
                f"party {self.party} already sent its initial pass: it sends it once a run"
            )
        rows = release_rows(torch.arange(len(self.features["train"])))
        self.own.guard.check_release("initial_embeddings", "train", None, rows, None)
        self.initial_pass_done = True
        self.own.model.train(True)
        column = self.own.embedding(self.features["train"], chunk).to("cpu")
        self.own.guard.commit("initial_embeddings", "train", None, rows, None)
        return column, serialized_bytes(column)

    def embed_rows(self, idx: torch.Tensor):
        """(embedding of training rows ``idx`` without gradient, serialized bytes): a refresh."""
        rows = release_rows(idx)
        self.own.guard.check_release("embed_rows", "train", None, rows, None)
        self.own.model.train(True)
        out = self.own.embedding(self.features["train"][idx.to(self.device)]).to("cpu")
        self.own.guard.commit("embed_rows", "train", None, rows, None)
        return out, serialized_bytes(out)

    def client_message(self, idx: torch.Tensor, zoo: ZooSettings | None):
        """((c, c_hat), serialized bytes) for training rows ``idx``: a ZOO query in float64
        (c_hat None for a FOO client, whose forward is kept)."""
        generators = self.own.generators
        rows = release_rows(idx)
        self.own.guard.check_release("client_message", "train", None, rows, None)
        if self.work_mean_s is not None:
            work_delay(self.work_mean_s, generators.get(DELAY_STREAM))
        x = self.features["train"][idx.to(self.device)]
        self.own.model.train(True)
        generator = None if zoo is None else generators.get("train")
        embedding, perturbed = self.own.client_message(x, zoo, generator)
        self.own.guard.commit("client_message", "train", None, rows, None)
        if perturbed is None:
            message = (embedding.to("cpu"), None)
        else:
            # copies: c and c_hat are views of one (1 + q, B, P) tensor, and Ray would serialize
            # its whole storage with each of them
            message = (embedding.to("cpu", copy=True), perturbed.to("cpu", copy=True))
        return message, serialized_bytes(message)

    def answer(self, answer: torch.Tensor) -> None:
        """Finish the update of the last message: eq. 3 from the losses, or backprop of dL/dc."""
        self.own.answer(answer.to(self.device))


class AsyncRayMethods:
    """The asynchronous family's calls on the party actors, mixed into
    :class:`~vfl_lightning.runtime.ray_parties.RayParties` (``actors``, ``ledger``,
    ``device_fn``, ``updates``, ``_get``, ``lost``).

    :meth:`client_messages` submits the batch to every active actor at once and yields the
    replies in arrival order (``ray.wait``, one at a time). :meth:`answer_client` submits the
    client's update without waiting: an actor runs its requests in submission order, so its next
    message starts after its update; the update's reference is checked when that next message
    arrives (or before any call to every actor), so a failed update is not lost.
    """

    def set_work_delays(self, speeds: Sequence[float], time_scale: float) -> None:
        """Party m sleeps Exp(rate = speeds[m]) × ``time_scale`` seconds before each message
        (``speeds`` as validated by :class:`~vfl_lightning.algorithms.staleness.ClientActivation`)."""
        actors = zip(self.actors, speeds, strict=True)
        refs = [actor.set_work_delay.remote(speed, time_scale) for actor, speed in actors]
        self._get(refs, "work delays")

    def initial_embeddings(self, xs, *, chunk):
        replies = self._get([a.initial_embeddings.remote(chunk) for a in self.actors], "initial")
        self.record(sum(nbytes for _, nbytes in replies))
        device = self.device_fn()
        return [column.to(device) for column, _ in replies]

    def embed_rows(self, party, x, idx):
        ref = self.actors[party].embed_rows.remote(idx.to("cpu", copy=True))
        embedding, nbytes = self.get_party(party, ref, "refresh")
        self.record(nbytes)
        return embedding.to(self.device_fn())

    def client_messages(self, clients, xs, idx, *, zoo):
        idx = idx.to("cpu", copy=True)  # a batch's indices are a view of the epoch's permutation
        what = "embedding" if zoo is None else "query"
        owner = {self.actors[m].client_message.remote(idx, zoo): m for m in clients}
        pending = list(owner)
        device = self.device_fn()
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            m = owner[ready[0]]
            (embedding, perturbed), nbytes = self.get_party(m, ready[0], what)
            self.settle(m)
            self.record(nbytes)
            yield m, embedding.to(device), None if perturbed is None else perturbed.to(device)

    def answer_client(self, party, answer):
        payload = answer.detach().to("cpu", copy=True)
        self.record(serialized_bytes(payload))
        self.updates[party] = self.actors[party].answer.remote(payload)

    def settle(self, party: int | None = None) -> None:
        """Check the submitted updates (of ``party``, or of every party) have finished well."""
        parties = list(self.updates) if party is None else [party]
        for m in parties:
            ref = self.updates.pop(m, None)
            if ref is not None:
                self.get_party(m, ref, "update")

    def record(self, nbytes: int) -> None:
        if self.ledger is not None:
            self.ledger.record_serialized(nbytes)
