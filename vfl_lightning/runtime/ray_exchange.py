"""The synchronous family's per-batch calls on the party actors as one request per party and
round: each actor's ``exchange`` runs a short sequence of its own calls. Calls without a reply
(an update, a learning-rate factor, an anchor, an evaluation restart) wait in the server's queue
and go with the next call that has one, in the order they were made, so a round is one request
to and one reply from each party. The actor runs each call through its own method, so its guard
checks every one of them.

A request travels as an ordinary Ray actor task (``tasks``), or on a Ray Compiled Graph
(``compiled``: ``ray.dag``, compiled once per run at the first batch, one shared-memory input
channel per party, so a party reads only the calls addressed to it). Ray's channels wait by
polling (each reader spins on ``sched_yield``), so a compiled graph pays off only where every
party and the server have a core of their own (docs/runtime.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import ray
from ray.exceptions import RayActorError, RayChannelError, RayTaskError

EXCHANGES = ("tasks", "compiled")

Call = tuple[str, tuple]


class ActorLost(RuntimeError):
    """A party's actor died during an exchange (``party``: which, None when Ray did not say)."""

    def __init__(self, party: int | None, message: str) -> None:
        super().__init__(message)
        self.party = party


class PartyExchange:
    """The per-batch exchange with ``actors`` (handles of actors with an ``exchange(calls)``
    method) by ``how`` (one of :data:`EXCHANGES`): :meth:`queue` calls without a reply,
    :meth:`call` a call with one (the queued calls go first). ``refusal`` turns an actor's
    failed call into what the server raises."""

    def __init__(
        self, actors: Sequence, refusal: Callable[[RayTaskError], Exception], how: str = "tasks"
    ) -> None:
        if how not in EXCHANGES:
            raise ValueError(f"an exchange runs as one of {EXCHANGES}, not {how!r}")
        self.actors = list(actors)
        self.refusal = refusal
        self.how = how
        self.graph = None
        self.queued: list[list[Call]] = [[] for _ in self.actors]

    def compiled(self):
        """The run's compiled graph (compiled at its first use): party m's ``exchange`` reads
        attribute m of the input."""
        if self.graph is None:
            from ray.dag import InputNode, MultiOutputNode

            logging.getLogger("ray.dag.compiled_dag_node").setLevel(logging.WARNING)
            with InputNode() as calls:
                replies = [a.exchange.bind(calls[m]) for m, a in enumerate(self.actors)]
                self.graph = MultiOutputNode(replies).experimental_compile(_submit_timeout=-1)
        return self.graph

    def queue(self, calls: Sequence[Call]) -> None:
        """Party m's ``calls[m]``, sent with the next exchange."""
        for queued, call in zip(self.queued, calls, strict=True):
            queued.append(call)

    def pending(self) -> bool:
        return any(self.queued)

    def call(self, calls: Sequence[Call | None]) -> list:
        """Every party's queued calls, then ``calls[m]`` (None: only the queued ones); the reply
        of each party's last call. A refused call raises the refusal of the lowest-numbered
        refusing party (every reply is read first); a dead actor raises :class:`ActorLost`."""
        requests = [
            tuple(queued) + (() if call is None else (call,))
            for queued, call in zip(self.queued, calls, strict=True)
        ]
        self.queued = [[] for _ in self.actors]
        if self.how == "compiled":
            try:
                refs = self.compiled().execute(*requests)
            except (RayActorError, RayChannelError) as error:
                raise ActorLost(None, str(error)) from error
        else:
            refs = [a.exchange.remote(r) for a, r in zip(self.actors, requests, strict=True)]
        replies, failures = [], []
        for party, ref in enumerate(refs):
            try:
                replies.append(ray.get(ref, timeout=-1 if self.how == "compiled" else None))
            except RayTaskError as error:
                failures.append(error)
                replies.append(None)
            except (RayActorError, RayChannelError) as error:
                raise ActorLost(party if self.how == "tasks" else None, str(error)) from error
        if failures:
            raise self.refusal(failures[0]) from None
        return replies

    def flush(self) -> None:
        if self.pending():
            self.call([None] * len(self.actors))

    def close(self) -> None:
        """Tear a compiled graph down (its actors stop reading their channels); the actors live
        on."""
        graph, self.graph = self.graph, None
        if graph is not None:
            graph.teardown()
