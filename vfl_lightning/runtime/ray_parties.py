"""Parties as Ray actors (``runtime=ray``): each actor holds only its own feature slice and wraps
one :class:`~vfl_lightning.algorithms.party.Party` (its model, optimizer, generators, updates and
state, the code the local parties run), and encodes its messages with the same ``mechanisms/``
code."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError

from vfl_lightning.algorithms.parties import Parties, PartyGenerators, private_seed
from vfl_lightning.algorithms.party import Party
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.algorithms.release_canaries import release_canaries
from vfl_lightning.errors import ConfigError, PartyLost
from vfl_lightning.mechanisms.identity import KeyAuthenticationError, SignedPublicKey
from vfl_lightning.runtime.party_state import load_party_state, save_party_state
from vfl_lightning.runtime.party_trust import PartyKeys, PartyTrust
from vfl_lightning.runtime.ray_async import AsyncPartyMethods, AsyncRayMethods
from vfl_lightning.runtime.transport import serialized_bytes, wire_dtype
from vfl_lightning.wire.codecs import Codec, decode_form
from vfl_lightning.wire.frames import FrameError, decode_frame, encode_frame

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")
SPLITS = ("train", "val", "test")


class PartyActor:
    """Party ``party`` of the run, built by the run's picklable :class:`PartyFactory`: the calls
    every protocol family makes of a party (key agreement, messages for a batch, evaluation
    streams, parameter digest, its own state files). A family's own calls are in its subclass
    (:class:`SyncPartyActor`, :class:`~vfl_lightning.runtime.ray_async.AsyncPartyActor`,
    :class:`~vfl_lightning.runtime.ray_fedvs.FedVSPartyActor`): Ray exposes every method of an
    actor class to whoever holds its handle, so an actor has no method its protocol does not call,
    and none returns a clean embedding behind a noisy release, a generator state or a parameter.

    The factory loads only this party's columns of each split (its own party file, or its slice
    of the built-in data module: no labels, no other party's columns); builds the party models in
    the local run's order under the run's seed and keeps its own (so initial parameters equal the
    local runtime's); builds its optimizer and mechanism. The actor wraps them in its ``own``
    :class:`~vfl_lightning.algorithms.party.Party` (the class the local parties hold) and passes
    on only the calls below: the party's other methods and its kept forward stay inside. A
    masking mechanism starts with no pair seed (never the ones derived from the run's seed): the
    party masks nothing, so sends nothing, before :meth:`agree`. ``trust``: where its stream seeds
    come from (``party_seeds=private``: drawn here, never sent; then torch's global generator is
    reseeded the same way once the model is built), its own directory ``trust.folder(party)`` (its state files,
    :mod:`~vfl_lightning.runtime.party_state`, and identity key) and its keys
    (:class:`~vfl_lightning.runtime.party_trust.PartyKeys`: a fresh X25519 key signed by its
    identity key).
    """

    def __init__(
        self, factory: PartyFactory, party: int, num_threads: int, trust: PartyTrust
    ) -> None:
        torch.set_num_threads(num_threads)
        self.party = int(party)
        self.trust = trust
        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        self.device = torch.device("cuda" if gpus else "cpu")
        kit = factory.party(self.party, self.device)
        self.features, self.mechanism = kit.features, kit.mechanism
        if self.mechanism.uses_pair_masks:
            self.mechanism.set_pair_seeds({})
        generators = PartyGenerators(
            factory.seed, self.party, self.device, party_seeds=trust.party_seeds
        )
        self.own = Party(self.party, kit.model, generators, kit.optimizer)
        self.own.canaries = release_canaries(
            kit.canary_records, self.party, self.mechanism, len(self.features["train"])
        )
        if generators.private:
            torch.manual_seed(private_seed())
        self.keys = PartyKeys(trust, self.party)
        self.run = trust.run
        self.bits = self.mechanism.bits_per_element

    def publish_key(self, run_id: str) -> tuple[bytes, SignedPublicKey]:
        """(identity public key, X25519 public key signed for ``run_id``)."""
        return self.keys.publish(run_id)

    def agree(self, run_id: str, identities: list[bytes], relayed: list[SignedPublicKey]) -> None:
        """Verify every peer's relayed key against its pinned identity, then derive this party's
        pair seeds (secure aggregation); a substituted key raises, naming its party."""
        seeds = self.keys.pair_seeds(run_id, identities, relayed)
        if self.mechanism.uses_pair_masks:
            self.mechanism.set_pair_seeds(seeds)

    def send(self, idx: torch.Tensor, stage: str, round: int | None):
        """(message, serialized bytes): this party's release of rows ``idx`` of the stage, encoded
        by its mechanism at release ``round``. ``round`` None (an evaluation without the mechanism)
        only where the mechanism adds no noise, so its release is the embedding anyway: a noisy
        mechanism's party never sends its clean embedding."""
        if stage not in SPLITS:
            raise ValueError(f"party {self.party} embeds rows of {SPLITS}, not {stage!r}")
        if round is None and self.mechanism.noisy:
            raise PermissionError(
                f"party {self.party} releases only through its {type(self.mechanism).__name__} "
                "mechanism: a release round is required, it sends no clean embedding"
            )
        x = self.features[stage][idx.to(self.device)]
        training = stage == "train"
        self.own.model.train(training)
        if training:
            h = self.own.forward(x)
            self.own.keep(x, h)
            out = self.own.training_release(idx, h.detach())
        else:
            out = self.own.embedding(x)
        if round is not None:
            out = self.mechanism.encode_party(
                self.party, out, generator=self.own.generators.get(stage), round=round
            )
        dtype = wire_dtype(self.bits) if out.dtype == torch.int64 else None
        out = out.to("cpu", dtype) if dtype is not None else out.to("cpu")
        return out, serialized_bytes(out)

    def restart_stream(self, stage: str, release: int) -> None:
        self.own.generators.restart(stage, release)

    def party_digest(self) -> str:
        """SHA-256 (hex) of this party's own named parameters: what the server learns of them
        (results.json's ``model_digest``), no parameter."""
        return self.own.digest()

    def save_state(self, round: int) -> None:
        """Write this party's state (model, optimizer, generators) for the server checkpoint of
        ``round`` into its own directory (its root, the run's folder)."""
        save_party_state(self.trust.root(), self.party, self.run, round, self.own.state_dict())

    def load_state(self, run: str, round: int) -> str:
        """Restore the state this party saved in its own directory for ``round`` of run ``run``
        (a run key: 32 hex digits naming a folder of its own, no path), tensors and plain values
        only (``weights_only``), and save into that run's folder from then on; "" or why it
        cannot."""
        try:
            state, problem = load_party_state(self.trust.root(), self.party, run, round)
        except ValueError as error:
            return f"party {self.party} refuses to resume: {error}"
        if state is not None:
            self.own.load_state_dict(state)
            self.run = run
        return problem


class SyncPartyActor(PartyActor):
    """A party of the synchronous family (splitnn, fedsgd, the FedBCD family, pbm, ldp, npq):
    besides the common calls, the backward of its last training message, FedPBCD's anchor and
    the FedBCD family's learning-rate schedule."""

    def apply_gradient(self, gradient: bytes, fresh: bool, mu: float) -> None:
        """Decode the gradient's downlink form (a frame: float32, or a sparsified gradient's
        top-k entries) in this process, then the update."""
        try:
            form = decode_frame(gradient, {"gradient": "list"}, "gradient")["gradient"]
            decoded = decode_form(form, ("dense", "topk"))
        except FrameError as error:
            raise PermissionError(
                f"party {self.party} refuses a malformed gradient: {error}"
            ) from None
        self.own.apply_gradient(decoded.to(self.device), fresh=fresh, mu=mu)

    def set_anchor(self) -> None:
        self.own.set_anchor()

    def set_lr_factor(self, factor: float) -> None:
        self.own.set_lr_factor(factor)


class AsyncPartyActor(AsyncPartyMethods, PartyActor):
    """A party of the asynchronous family (cascade, zoo_vfl, syn_zoo_vfl, vafl): the common calls
    and the family's (:class:`~vfl_lightning.runtime.ray_async.AsyncPartyMethods`)."""


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


class RayParties(AsyncRayMethods, Parties):
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
    decodes."""

    name = "ray"

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
        device_fn: Callable[[], torch.device] = lambda: torch.device("cpu"),
        codec_fn: Callable[[], Codec] = Codec,
    ) -> None:
        self.factory = factory
        self.codec_fn = codec_fn
        self.time_scale = float(time_scale)
        self.trust = trust
        self.run = trust.run
        self.actor_class = AsyncPartyActor if asynchronous else SyncPartyActor
        options = party_options(party_resources, num_parties)
        threads = torch.get_num_threads()
        self.actors = [
            self.start_actor(factory, m, threads, options[m]) for m in range(num_parties)
        ]
        self.ledger = ledger
        self.round_fn = round_fn
        self.device_fn = device_fn
        self.updates: dict[int, ray.ObjectRef] = {}
        self.exchange_keys()

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
        return actor.remote(factory, party, threads, self.trust)

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
                except RayActorError:
                    raise self.lost(party, what) from error
            raise

    def get_party(self, party: int, ref, what: str):
        """Party ``party``'s reply, or :class:`PartyLost` if its actor died."""
        try:
            return ray.get(ref)
        except RayActorError as error:
            raise self.lost(party, what) from error

    def lost(self, party: int, what: str) -> PartyLost:
        return PartyLost(
            f"party {party}'s Ray actor died at training round {self.round_fn()} ({what}); the "
            "run stopped, its last checkpoint is intact (resume with "
            "ckpt_path=<run dir>/checkpoints/last.ckpt)"
        )

    def send(self, xs, idx, *, stage, round):
        if stage not in SPLITS:
            raise ValueError(
                f"runtime=ray embeds rows of the train, val or test split by index, not {stage!r}"
            )
        idx = idx.to("cpu", copy=True)  # a batch's indices are a view of the epoch's permutation
        replies = self._get([a.send.remote(idx, stage, round) for a in self.actors], "send")
        if stage == "train" and self.ledger is not None:
            self.ledger.record_serialized(sum(nbytes for _, nbytes in replies))
        device = self.device_fn()
        return [
            message.to(device) if message.is_floating_point() else message.to(device, torch.int64)
            for message, _ in replies
        ]

    def apply_gradients(self, gradients: Sequence[torch.Tensor], *, fresh=False, mu=0.0):
        """Submitted without waiting for the replies: an actor runs its requests in submission
        order, so its next one (the next round's send, evaluation, a checkpoint) starts after the
        update, and every call checks the submitted updates first (:meth:`settle`). A round
        costs one request/reply exchange with each actor instead of two."""
        self.settle()
        codec = self.codec_fn()
        payloads = [
            encode_frame({"gradient": codec.encode(g.detach().to("cpu"))}) for g in gradients
        ]
        if self.ledger is not None:
            self.ledger.record_serialized(sum(serialized_bytes(g) for g in payloads))
        for party, (actor, gradient) in enumerate(zip(self.actors, payloads, strict=True)):
            self.updates[party] = actor.apply_gradient.remote(gradient, fresh, mu)

    def set_anchor(self):
        self._get([a.set_anchor.remote() for a in self.actors], "anchor")

    def set_lr_factor(self, factor):
        self._get([a.set_lr_factor.remote(factor) for a in self.actors], "learning rate")

    def restart_stream(self, stage, release):
        self._get([a.restart_stream.remote(stage, release) for a in self.actors], "evaluation")

    def party_digests(self):
        return self._get([a.party_digest.remote() for a in self.actors], "digest")

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

    def close(self):
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
