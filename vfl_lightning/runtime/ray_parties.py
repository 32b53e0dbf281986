"""Parties as Ray actors (``runtime=ray``), the server's side: the actor handles
(:mod:`~vfl_lightning.runtime.party_actors`: each actor holds only its own feature slice and wraps
one :class:`~vfl_lightning.algorithms.party.Party`), every call to all of them, a dead actor or a
party's refusal reported in one line."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError

from vfl_lightning.algorithms.parties import Parties
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.errors import ConfigError, PartyLost, PartyRefusal, resume_advice
from vfl_lightning.mechanisms.identity import KeyAuthenticationError, SignedPublicKey
from vfl_lightning.runtime.party_actors import (
    SPLITS,
    AsyncPartyActor,
    PartyActor,
    SyncPartyActor,
)
from vfl_lightning.runtime.party_trust import PartyTrust
from vfl_lightning.runtime.ray_alignment import RayAlignment
from vfl_lightning.runtime.ray_async import AsyncRayMethods
from vfl_lightning.runtime.ray_exchange import ActorLost, PartyExchange
from vfl_lightning.runtime.transport import blob_bytes
from vfl_lightning.wire.codecs import Codec
from vfl_lightning.wire.frames import encode_frame

__all__ = ["AsyncPartyActor", "PartyActor", "RayParties", "SyncPartyActor", "party_options"]

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")


def refusal(error: RayTaskError) -> Exception:
    """What a failed actor call raises at the server: a party's refusal, or its own setting it
    cannot use, as itself (one line); anything else as Ray reports it."""
    return error.cause if isinstance(error.cause, PartyRefusal | ConfigError) else error


def party_options(party_resources, num_parties: int) -> list[dict]:
    """Ray actor options of each party from ``runtime.party_resources``: one mapping for every
    party, or a list with one mapping per party (keys in ``RESOURCE_KEYS``)."""
    if party_resources is None:
        party_resources = {}
    if isinstance(party_resources, dict):
        per_party = [dict(party_resources)] * num_parties
    else:
        per_party = [dict(item or {}) for item in party_resources]
        if len(per_party) != num_parties:
            raise ConfigError(
                f"runtime.party_resources lists {len(per_party)} entries, the run has "
                f"{num_parties} parties: give one mapping for all or one per party"
            )
    for options in per_party:
        unknown = sorted(set(options) - set(RESOURCE_KEYS))
        if unknown:
            raise ConfigError(
                f"runtime.party_resources has unknown key(s) {unknown}; allowed: {RESOURCE_KEYS}"
            )
    return [{"num_cpus": 0} | options for options in per_party]


class RayParties(AsyncRayMethods, RayAlignment, Parties):
    """The parties as Ray actor handles: every call goes to all actors at once and waits for
    every reply; each party keeps its own state in its own directory (files keyed by the run and
    the server checkpoint's training round; the checkpoint holds both, no path) (the asynchronous family's calls, in
    :class:`~vfl_lightning.runtime.ray_async.AsyncRayMethods`, take replies as they arrive). The
    server relays the parties' public keys and never holds a pair seed. Every training message is
    counted in ``ledger.serialized_bytes`` as Ray serializes it. ``trust``
    (:class:`~vfl_lightning.runtime.party_trust.PartyTrust`) goes to every actor; the key
    agreement is bound to a fresh run id (:meth:`exchange_keys`). ``asynchronous``: the parties
    are :class:`AsyncPartyActor` (the asynchronous family), else :class:`SyncPartyActor`.
    Gradients cross in their downlink codec's form (``codec_fn``: the wire's), a frame the actor
    decodes. ``policy``: the server's proposed privacy policy, which each party's own can only tighten. A
    party's refusal (:class:`~vfl_lightning.errors.PartyRefusal`) reaches the server as itself,
    one line. ``label_holder_ids`` (the label holder's sample ids per stage, when the parties'
    rows await the PSI): after the key agreement the server runs the PSI with every actor
    (:meth:`align`); ``alignment`` is its report (None without).

    The synchronous family's per-batch calls (``send``, ``apply_gradients``, ``set_anchor``,
    ``set_lr_factor``, ``restart_stream``) go as one request per party
    (:class:`~vfl_lightning.runtime.ray_exchange.PartyExchange`, by ``exchange``: Ray tasks, or
    a Ray Compiled Graph): the calls without a reply wait and go with the next call that has
    one, and every other call first sends what waits (:meth:`settle`)."""

    name = "ray"
    EXCHANGE = True
    """Whether the synchronous family's per-batch calls go as one request per party."""

    def __init__(
        self,
        factory: PartyFactory,
        num_parties: int,
        *,
        time_scale: float = 1.0,
        party_resources=None,
        trust: PartyTrust,
        asynchronous: bool = False,
        ledger=None,
        round_fn: Callable[[], int] = lambda: 0,
        checkpoint_fn: Callable[[], str | None] = lambda: None,
        device_fn: Callable[[], torch.device] = lambda: torch.device("cpu"),
        codec_fn: Callable[[], Codec] = Codec,
        policy: PartyPolicy | None = None,
        label_holder_ids: dict | None = None,
        exchange: str = "tasks",
    ) -> None:
        self.factory = factory
        self.codec_fn = codec_fn
        self.time_scale = float(time_scale)
        self.trust = trust
        self.policy = policy
        self.round_fn, self.checkpoint_fn = round_fn, checkpoint_fn
        self.run = trust.run
        self.actor_class = AsyncPartyActor if asynchronous else SyncPartyActor
        options = party_options(party_resources, num_parties)
        threads = torch.get_num_threads()
        self.actors = [
            self.start_actor(factory, m, threads, options[m]) for m in range(num_parties)
        ]
        self.ledger = ledger
        self.device_fn = device_fn
        self.updates: dict[int, ray.ObjectRef] = {}
        self.batches: PartyExchange | None = None
        if self.EXCHANGE and not asynchronous:
            self.batches = PartyExchange(self.actors, refusal, exchange)
        self.exchange_keys()
        self.alignment = None if label_holder_ids is None else self.align(label_holder_ids)

    def exchange_keys(self) -> None:
        """Relay every party's identity and signed X25519 key to all parties for a fresh run id;
        each verifies its peers before deriving pair seeds. A refused key stops the run with
        :class:`KeyAuthenticationError`: the refusal of the lowest-numbered refusing party,
        naming the party whose key it refused."""
        run_id = secrets.token_hex(16)
        published = self._get([a.publish_key.remote(run_id) for a in self.actors], "key setup")
        identities, relayed = self.relay([i for i, _ in published], [k for _, k in published])
        refs = [a.agree.remote(run_id, identities, relayed) for a in self.actors]
        refusals = []
        for party, ref in enumerate(refs):
            try:
                self.get_party(party, ref, "key agreement")
            except RayTaskError as error:
                if not isinstance(error.cause, KeyAuthenticationError):
                    raise
                refusals.append(str(error.cause))
        if refusals:
            raise KeyAuthenticationError(refusals[0])

    def relay(
        self, identities: list[bytes], keys: list[SignedPublicKey]
    ) -> tuple[list[bytes], list[SignedPublicKey]]:
        """What the server passes on of the published keys: all of them, unchanged."""
        return identities, keys

    def start_actor(self, factory: PartyFactory, party: int, threads: int, options: dict):
        """Party ``party``'s actor handle (a protocol's subclass starts its own actor class)."""
        actor = ray.remote(self.actor_class).options(**options)
        return actor.remote(factory, party, threads, self.trust, policy=self.policy)

    def settle(self, party: int | None = None) -> None:
        """Send the synchronous family's waiting calls, then check the asynchronous family's
        submitted updates."""
        if self.batches is not None and self.batches.pending():
            self.batch_exchange([None] * len(self.actors), "update")
        super().settle(party)

    def batch_exchange(self, calls: list, what: str) -> list:
        """Every party's waiting calls, then ``calls[m]``, in one request per party; each party's
        last reply (a dead actor: :class:`PartyLost` naming it)."""
        try:
            return self.batches.call(calls)
        except ActorLost as error:
            if error.party is not None:
                died = error.__cause__ if isinstance(error.__cause__, RayActorError) else None
                raise self.lost(error.party, what, died) from error
            for party, actor in enumerate(self.actors):
                try:
                    ray.get(actor.__ray_ready__.remote())
                except RayActorError as died:
                    raise self.lost(party, what, died) from error
            raise

    def _get(self, refs: list, what: str, parties: Sequence[int] | None = None) -> list:
        """Every reply, or :class:`PartyLost` naming the first party whose actor died
        (``parties[i]``: the party that answers ``refs[i]``; default: party i). The asynchronous
        family's submitted updates are checked first (:meth:`settle`)."""
        self.settle()
        try:
            return ray.get(refs)
        except RayActorError as error:
            for party, ref in zip(parties or range(len(refs)), refs, strict=True):
                try:
                    ray.get(ref)
                except RayActorError as died:
                    raise self.lost(party, what, died) from error
            raise
        except RayTaskError as error:
            raise refusal(error) from None

    def get_party(self, party: int, ref, what: str):
        """Party ``party``'s reply, or :class:`PartyLost` if its actor died."""
        try:
            return ray.get(ref)
        except RayActorError as error:
            raise self.lost(party, what, error) from error
        except RayTaskError as error:
            raise refusal(error) from None

    def lost(self, party: int, what: str, error: RayActorError | None = None) -> PartyLost:
        """The one line for a party whose actor died: the error that stopped it when it failed
        to start, and resuming only from a checkpoint the run has (``checkpoint_fn``)."""
        round = self.round_fn()
        cause = ""
        if error is not None and error.actor_init_failed:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            cause = f": it failed to start ({lines[-1]})" if lines else ": it failed to start"
        checkpoint = self.checkpoint_fn()
        if checkpoint is None and round == 0:
            advice = "the run stopped before training: run the same command again"
        else:
            advice = resume_advice(checkpoint)
        return PartyLost(
            f"party {party}'s Ray actor died at training round {round} ({what}){cause}; {advice}"
        )

    def send(self, xs, idx, *, stage, round):
        if stage not in SPLITS:
            raise ValueError(
                f"runtime=ray embeds rows of the train, val or test split by index, not {stage!r}"
            )
        idx = idx.to("cpu", copy=True)  # a batch's indices are a view of the epoch's permutation
        if self.batches is not None:  # rows and releases cross as arrays (cheap for Ray)
            call = ("send", (idx.numpy(), stage, round))
            replies = [
                (torch.tensor(message), nbytes)
                for message, nbytes in self.batch_exchange([call] * len(self.actors), "send")
            ]
        else:
            replies = self._get([a.send.remote(idx, stage, round) for a in self.actors], "send")
        if stage == "train" and self.ledger is not None:
            self.ledger.record_serialized(sum(nbytes for _, nbytes in replies))
        device = self.device_fn()
        return [
            message.to(device) if message.is_floating_point() else message.to(device, torch.int64)
            for message, _ in replies
        ]

    def apply_gradients(self, gradients: Sequence[torch.Tensor], *, fresh=False, mu=0.0):
        """Without waiting for the replies: the update goes with the next request to the party
        (the next round's send, an evaluation, or any other call, :meth:`settle`), which runs it
        first. A round costs one request/reply exchange with each actor instead of two."""
        codec = self.codec_fn()
        payloads = [
            encode_frame({"gradient": codec.encode(g.detach().to("cpu"))}) for g in gradients
        ]
        if self.ledger is not None:
            self.ledger.record_serialized(sum(blob_bytes(g) for g in payloads))
        if self.batches is not None:
            self.batches.queue([("apply_gradient", (g, fresh, mu)) for g in payloads])
            return
        self.settle()
        for party, (actor, gradient) in enumerate(zip(self.actors, payloads, strict=True)):
            self.updates[party] = actor.apply_gradient.remote(gradient, fresh, mu)

    def set_anchor(self):
        if self.batches is not None:
            self.batches.queue([("set_anchor", ())] * len(self.actors))
            return
        self._get([a.set_anchor.remote() for a in self.actors], "anchor")

    def set_lr_factor(self, factor):
        if self.batches is not None:
            self.batches.queue([("set_lr_factor", (factor,))] * len(self.actors))
            return
        self._get([a.set_lr_factor.remote(factor) for a in self.actors], "learning rate")

    def restart_stream(self, stage, release):
        if self.batches is not None:
            self.batches.queue([("restart_stream", (stage, release))] * len(self.actors))
            return
        self._get([a.restart_stream.remote(stage, release) for a in self.actors], "evaluation")

    def party_digests(self):
        return self._get([a.party_digest.remote() for a in self.actors], "digest")

    def use_policy(self, policy):
        """The actors took the server's proposed policy when they started (``policy``)."""
        raise ValueError(
            "Ray parties take the server's proposed policy when they start (RayParties(policy=))"
        )

    def privacy_spent(self):
        return self._get([a.privacy_spent.remote() for a in self.actors], "privacy")

    def state_dict(self):
        """Every party saves its own state for this round in its own directory; the server's
        checkpoint keeps the round only."""
        round = int(self.round_fn())
        self._get([a.save_state.remote(round) for a in self.actors], "checkpoint")
        return {"round": round, "run": self.run}

    def load_state_dict(self, state):
        if "round" not in state or "run" not in state:
            raise ConfigError(
                "this checkpoint names no Ray parties' run and round (its party models are part "
                "of the checkpoint, or it names where they are): resume it with the code and "
                "runtime that wrote it"
            )
        run, round = str(state["run"]), int(state["round"])
        refs = [a.load_state.remote(run, round) for a in self.actors]
        problems = [problem for problem in self._get(refs, "resume") if problem]
        if problems:
            raise ConfigError(problems[0])
        self.run = run

    def close(self, status: str = "ended"):
        if self.batches is not None:
            self.batches.close()
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
