"""The party side of ``runtime=ray``: one actor per party, wrapping one
:class:`~vfl_lightning.algorithms.party.Party` (its model, optimizer, generators, updates, state
and guard, the code the local parties run), encoding its messages with the same ``mechanisms/``
code; an actor class per protocol family, whose methods are exactly the calls that family
makes."""

from __future__ import annotations

import functools
import inspect
import threading

import numpy as np
import ray
import torch

from vfl_lightning.algorithms.parties import PartyGenerators, private_seed
from vfl_lightning.algorithms.party import Party
from vfl_lightning.algorithms.party_budget import PartyBudget
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.algorithms.party_rules import (
    PartyGuard,
    ReleaseNoise,
    mechanism_noise,
    release_rows,
)
from vfl_lightning.algorithms.release_canaries import release_canaries
from vfl_lightning.data.psi import PsiError, PsiParty
from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms.identity import SignedPublicKey
from vfl_lightning.runtime.party_state import (
    load_party_state,
    party_state_path,
    resumable_rounds,
    resume_refusal,
    save_party_state,
)
from vfl_lightning.runtime.party_trust import PartyKeys, PartyTrust, check_agreement
from vfl_lightning.runtime.ray_alignment import PsiActorMethods
from vfl_lightning.runtime.ray_async import AsyncPartyMethods
from vfl_lightning.runtime.transport import array_bytes, serialized_bytes, wire_dtype
from vfl_lightning.wire.codecs import decode_form
from vfl_lightning.wire.frames import FrameError, decode_frame

SPLITS = ("train", "val", "test")
BEFORE_ALIGNMENT = "it releases nothing before the PSI aligned its rows"


class PartyActor(PsiActorMethods):
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
    identity key). Rows that await the PSI (its own party file, or simulated partial overlap)
    stay in the actor with their ids, and its PSI state (:class:`PsiParty`: its secret scalar
    and ids) never leaves it: :meth:`psi` answers the label holder's messages, and the aligned
    rows become its columns of every split; its guard refuses every release before.

    Its ``own`` party's :class:`~vfl_lightning.algorithms.party_rules.PartyGuard` enforces the
    party's rules on every call (rows of its own splits only) and its own privacy policy: the
    ``policy.yaml`` in its own directory (:meth:`PartyPolicy.of_party`), which ``policy``, the
    server's proposal, can only tighten. ``noise``: what its protocol adds to its releases
    (default: its mechanism's).
    """

    def __init__(
        self,
        factory: PartyFactory,
        party: int,
        num_threads: int,
        trust: PartyTrust,
        *,
        policy: PartyPolicy | None = None,
        noise: ReleaseNoise | None = None,
    ) -> None:
        torch.set_num_threads(num_threads)
        self.party = int(party)
        self.trust = trust
        self.lock = threading.RLock()
        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        self.device = torch.device("cuda" if gpus else "cpu")
        kit = factory.party(self.party, self.device)
        self.aligned_features, self.table = kit.features, kit.table
        self.mechanism = kit.mechanism
        if self.mechanism.uses_pair_masks:
            self.mechanism.set_pair_seeds({})
        generators = PartyGenerators(
            factory.seed, self.party, self.device, party_seeds=trust.party_seeds
        )
        self.unusable: ConfigError | None = None
        self.alignment: PsiParty | None = None
        if kit.table is not None:
            try:
                self.alignment = PsiParty(kit.table.ids, self.party)
            except PsiError as error:  # answered to the server's first call, in one line
                self.unusable = ConfigError(str(error))
        try:
            own_policy = PartyPolicy.of_party(trust.folder(self.party), policy)
        except ConfigError as error:  # answered to the server's first call, in one line
            own_policy, self.unusable = PartyPolicy(allow_clean=False), error
        budget = PartyBudget(
            self.party, own_policy, self.mechanism, embedding_dim=kit.model.embedding_dim
        )
        guard = PartyGuard(
            self.party,
            noise or ReleaseNoise(self.mechanism),
            budget,
            split_sizes=split_sizes(kit.features),
        )
        self.own = Party(self.party, kit.model, generators, kit.optimizer, guard)
        train_rows = 0 if kit.features is None else len(kit.features["train"])
        self.own.canaries = release_canaries(  # none while the rows await the PSI
            kit.canary_records, self.party, self.mechanism, train_rows
        )
        if generators.private:
            torch.manual_seed(private_seed())
        self.keys = PartyKeys(trust, self.party)
        self.agreed = False
        self.run = trust.run
        self.bits = self.mechanism.bits_per_element

    @property
    def features(self) -> dict[str, torch.Tensor]:
        """Its columns of every split; before its rows are aligned its guard refuses any call
        that reads them."""
        if self.aligned_features is None:
            raise self.own.guard.refusal("a call", BEFORE_ALIGNMENT)
        return self.aligned_features

    def publish_key(self, run_id: str) -> tuple[bytes, SignedPublicKey]:
        """(identity public key, X25519 public key signed for ``run_id``); a party whose own
        policy file cannot be used refuses here, naming it."""
        if self.unusable is not None:
            raise self.unusable
        return self.keys.publish(run_id)

    def agree(self, run_id: str, identities: list[bytes], relayed: list[SignedPublicKey]) -> None:
        """Verify every peer's relayed key against its pinned identity, then derive this party's
        pair seeds (secure aggregation); a substituted key raises, naming its party. Once per
        actor, with one key per party (:func:`check_agreement`)."""
        check_agreement(self.own.guard, self.agreed, relayed, self.mechanism.num_parties)
        seeds = self.keys.pair_seeds(run_id, identities, relayed)
        if self.mechanism.uses_pair_masks:
            self.mechanism.set_pair_seeds(seeds)
        self.agreed = True

    def send(self, idx: torch.Tensor, stage: str, round: int | None):
        """(message, serialized bytes): this party's release of rows ``idx`` of the stage, encoded
        by its mechanism at release ``round``, as its guard allows (``round`` None, the plain
        embedding, only where its protocol adds no noise at that stage)."""
        return wire_message(self, encoded_release(self, idx, stage, round))

    def restart_stream(self, stage: str, release: int) -> None:
        self.own.guard.restart(stage, release)
        self.own.generators.restart(stage, release)

    def party_digest(self) -> str:
        """SHA-256 (hex) of this party's own named parameters: what the server learns of them
        (results.json's ``model_digest``), no parameter."""
        return self.own.digest()

    def privacy_spent(self) -> dict:
        """What this party counted of its own releases (its feature ε at its policy's δ, its
        most-released rows): numbers, no row."""
        return self.own.guard.budget.spent()

    def save_state(self, round: int) -> None:
        """Write this party's state (model, optimizer, generators, guard) for the server
        checkpoint of ``round``, its current round (its guard refuses another), into its own
        directory (its root, the run's folder)."""
        self.own.guard.check_save(round)
        save_party_state(self.trust.root(), self.party, self.run, round, self.own.state_dict())

    def load_state(self, run: str, round: int) -> str:
        """Restore the state this party saved in its own directory for ``round`` of run ``run``
        (a run key: 32 hex digits naming a folder of its own, no path), tensors and plain values
        only (``weights_only``), and save into that run's folder from then on; "" or why it
        cannot. Its guard refuses a load after its first release, and any round but the newest
        it saved for that run or the one before it (:func:`resumable_rounds`)."""
        root = self.trust.root()
        self.own.guard.check_load()
        try:
            rounds = resumable_rounds(root, self.party, run)
            path = party_state_path(root, self.party, run, round)
        except ValueError as error:
            return f"party {self.party} refuses to resume: {error}"
        if rounds and path.is_file() and int(round) not in rounds:
            raise self.own.guard.refusal("load_state", resume_refusal(run, rounds, round))
        state, problem = load_party_state(root, self.party, run, round)
        if state is not None:
            self.own.load_state_dict(state)
            self.run = run
        return problem


def encoded_release(actor: PartyActor, idx, stage: str, round: int | None) -> torch.Tensor:
    """``actor``'s release of rows ``idx`` of ``stage``, encoded by its mechanism at release
    ``round`` (None: its plain embedding), checked and recorded by its guard."""
    noise = None if round is None else mechanism_noise(actor.mechanism)
    out, commit = embed_release(actor, "send", idx, stage, round, noise)
    if round is not None:
        out = actor.mechanism.encode_party(
            actor.party, out, generator=actor.own.generators.get(stage), round=round
        )
    commit()
    return out


def embed_release(actor: PartyActor, call: str, idx, stage: str, round, noise):
    """(``actor``'s embedding of rows ``idx`` (a tensor or an array) of ``stage``, what records
    the release): its guard checks the release first; a training forward is kept for its update
    once recorded. A function, not a method: Ray would expose a method to every handle."""
    if stage not in SPLITS:
        raise ValueError(f"party {actor.party} embeds rows of {SPLITS}, not {stage!r}")
    if not isinstance(idx, torch.Tensor):
        idx = torch.tensor(np.asarray(idx))
    rows = release_rows(idx)
    own = actor.own
    if actor.aligned_features is None:
        raise own.guard.refusal(call, BEFORE_ALIGNMENT)
    own.guard.check_release(call, stage, round, rows, noise)
    x = actor.features[stage][idx.to(actor.device)]
    training = stage == "train"
    if own.model.training != training:
        own.model.train(training)
    if training:
        h = own.forward(x)
        out = own.training_release(idx, h.detach())
    else:
        out = own.embedding(x)

    def commit() -> None:
        own.guard.commit(call, stage, round, rows, noise)
        if training:
            own.keep(x, h)

    return out, commit


def split_sizes(features: dict[str, torch.Tensor] | None) -> dict[str, int]:
    """The rows of each split a party's guard admits: none before its rows are aligned."""
    if features is None:
        return {stage: 0 for stage in SPLITS}
    return {stage: int(x.shape[0]) for stage, x in features.items()}


def wire_message(actor: PartyActor, out: torch.Tensor, *, array: bool = False):
    """(``out`` as it travels, serialized bytes): ring elements in their smallest dtype; as a
    NumPy array with ``array`` (cheaper for Ray to serialize than a tensor)."""
    dtype = wire_dtype(actor.bits) if out.dtype == torch.int64 else None
    out = out.to("cpu", dtype) if dtype is not None else out.to("cpu")
    if array:
        out = out.numpy()
        return out, array_bytes(out)
    return out, serialized_bytes(out)


def one_call_at_a_time(cls: type) -> type:
    """Run every public method of actor class ``cls`` (its own and inherited) under the actor's
    ``lock``: Ray runs a compiled graph's calls on a thread of their own, beside the thread of
    the ordinary calls, and a party answers one call at a time (its guard checks each against
    the state the previous one left)."""

    def locked(method):
        @functools.wraps(method)
        def serialized(self, *args, **kwargs):
            with self.lock:
                return method(self, *args, **kwargs)

        return serialized

    for name, method in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            setattr(cls, name, locked(method))
    return cls


@one_call_at_a_time
class SyncPartyActor(PartyActor):
    """A party of the synchronous family (splitnn, fedsgd, the FedBCD family, pbm, ldp, npq):
    besides the common calls, the backward of its last training message, FedPBCD's anchor and
    the FedBCD family's learning-rate schedule. :meth:`exchange` carries the per-batch calls,
    one request a round (:mod:`~vfl_lightning.runtime.ray_exchange`)."""

    EXCHANGE_CALLS = ("send", "apply_gradient", "set_anchor", "set_lr_factor", "restart_stream")
    """The calls :meth:`exchange` carries: the per-batch ones."""

    def exchange(self, calls: tuple) -> object:
        """Run ``calls``, a sequence of (name, arguments) of :attr:`EXCHANGE_CALLS`, in order,
        each through its own method (so its guard checks it); the last one's reply. A name
        outside them, or a malformed call, is refused before any runs."""
        try:
            plan = [(str(name), tuple(args)) for name, args in calls]
        except (TypeError, ValueError):
            plan = None
        if plan is None or any(name not in self.EXCHANGE_CALLS for name, _ in plan):
            raise self.own.guard.refusal(
                "exchange", f"it carries only {self.EXCHANGE_CALLS}, each as (name, arguments)"
            )
        reply = None
        for name, args in plan:
            if name == "send":  # the release as an array, which Ray serializes cheaply
                reply = wire_message(self, encoded_release(self, *args), array=True)
            else:
                reply = getattr(self, name)(*args)
        return reply

    def apply_gradient(self, gradient: bytes, fresh: bool, mu: float) -> None:
        """Decode the gradient's downlink form (a frame: float32, or a sparsified gradient's
        top-k entries) in this process, then the update (its guard checks it)."""
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
