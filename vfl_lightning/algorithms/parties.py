"""The parties as the server reaches them: one small interface (send a batch's messages, apply a
received gradient and step, answer the asynchronous family's queries, state) and each party's
generators; the local parties and the Ray transport implement it."""

from __future__ import annotations

import hashlib
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import torch

from vfl_lightning.algorithms.zoo import ZooSettings
from vfl_lightning.parallel.rows import RowShares
from vfl_lightning.seeding import derive_seed, seeded_generator

CONTINUING_STREAMS = ("train", "delays")
"""Party streams that continue across checkpoints (the others restart at every evaluation)."""

PARTY_SEEDS = ("private", "derived")
"""Where a party's stream seeds come from: ``private``, entropy drawn inside the party's process
(``secrets``) that never leaves it; ``derived``, :func:`~vfl_lightning.seeding.derive_seed` of the
run's seed (reproducible, and known to whoever holds the config)."""


def private_seed() -> int:
    """A 63-bit generator seed from the operating system's randomness (``secrets``)."""
    return secrets.randbits(63)


class PartyGenerators:
    """One party's generators: ``train`` (and ``delays``, Ray's work delays, once used) continue
    across checkpoints; an evaluation stage's stream starts afresh at every :meth:`restart`
    (evaluation never shifts training randomness, and never repeats its noise).

    ``party_seeds='derived'``: every seed is ``derive_seed(seed, 'party', stream, party)``, an
    evaluation's with its first release round mixed in; the continuing streams' states are part
    of :meth:`state_dict`, so a resumed run draws what the uninterrupted one would (a simulation:
    whoever holds the config knows every draw). ``'private'``: every seed is :func:`private_seed`,
    drawn here (a fresh one per evaluation) and never sent anywhere; only the replayed streams'
    seeds (:meth:`replay`: FedVS's data shares, re-sent identical) are part of :meth:`state_dict`,
    and a party resumed from it draws its continuing streams from fresh seeds, so it never repeats
    noise it drew before it stopped (releases it made after its last save included).
    """

    def __init__(
        self,
        seed: int,
        party: int,
        device: torch.device | str = "cpu",
        *,
        party_seeds: str = "derived",
    ) -> None:
        if party_seeds not in PARTY_SEEDS:
            raise ValueError(f"party_seeds must be one of {PARTY_SEEDS}, got {party_seeds!r}")
        self.seed, self.party, self.device = int(seed), int(party), torch.device(device)
        self.private = party_seeds == "private"
        self.streams: dict[str, torch.Generator] = {}
        self._pending_states: dict[str, torch.Tensor] = {}
        self._releases: dict[str, int] = {}
        self._replay_seeds: dict[str, int] = {}

    def stream_seed(self, stage: str, release: int | None = None) -> int:
        if self.private:
            return private_seed()
        return derive_seed(self.seed, "party", stage, self.party, release=release)

    def get(self, stage: str) -> torch.Generator:
        gen = self.streams.get(stage)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.stream_seed(stage, self._releases.get(stage)))
            pending = self._pending_states.pop(stage, None)
            if pending is not None:
                gen.set_state(pending)
            self.streams[stage] = gen
        return gen

    def replay(self, stage: str) -> torch.Generator:
        """A new generator of ``stage`` from the same seed at every call, for the whole run
        (FedVS's data shares, re-sent identical after a resume)."""
        if stage not in self._replay_seeds:
            self._replay_seeds[stage] = self.stream_seed(stage)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self._replay_seeds[stage])
        return gen

    def move(self, device: torch.device) -> None:
        """Use ``device`` from now on (Lightning moves the module after building it)."""
        if device != self.device:
            self.device = device
            self.streams.clear()

    def restart(self, stage: str, release: int) -> None:
        """Start evaluation ``stage`` afresh: the evaluation whose first release round is
        ``release`` (unique in the run) gets its own seed."""
        self.streams.pop(stage, None)
        self._releases[stage] = int(release)

    def state_dict(self) -> dict:
        if self.private:
            return {"replay_seeds": dict(self._replay_seeds)}
        state = {"train": self.get("train").get_state()}
        for stage in CONTINUING_STREAMS[1:]:
            if stage in self.streams or stage in self._pending_states:
                state[stage] = self.get(stage).get_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (private: its replay seeds; every other stream from a fresh
        seed); a state written under the other ``party_seeds`` (a private state carries
        ``replay_seeds``) is refused: derived streams resumed as private would stay known to
        whoever holds the config."""
        saved = "private" if "replay_seeds" in state else "derived"
        if saved != ("private" if self.private else "derived"):
            raise ValueError(
                f"this checkpoint's party streams were drawn with runtime.party_seeds={saved}: "
                f"resume it with runtime.party_seeds={saved}"
            )
        for stage in CONTINUING_STREAMS:
            self.streams.pop(stage, None)
            self._pending_states.pop(stage, None)
            if stage in state and not self.private:
                self._pending_states[stage] = state[stage]
        if self.private:
            self._replay_seeds = dict(state.get("replay_seeds", {}))


class ServerStreams:
    """The server's generators, one per stage: ``train`` continues across checkpoints (its state
    is :meth:`state`), an evaluation stage's starts afresh at every :meth:`restart` from a seed of
    its first release round (unique in the run), so evaluation never shifts training randomness
    and never repeats its noise.

    The local simulation hands the same object to its parties (:class:`LocalParties`): there ZOO
    directions, FedVS model masks and Wait-DP noise come from the server's ``train`` (or
    evaluation) stream, one stream for every party, so a local run is reproducible from ``seed``;
    parties in their own processes draw from their own :class:`PartyGenerators`.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.streams: dict[str, torch.Generator] = {}
        self.releases: dict[str, int] = {}
        self._pending_train: torch.Tensor | None = None

    def get(self, stage: str, device: torch.device) -> torch.Generator:
        """The seeded generator of ``stage`` on ``device``."""
        gen = self.streams.get(stage)
        if gen is None or gen.device != device:
            release = self.releases.get(stage)
            gen = seeded_generator(self.seed, "server", stage, device=device, release=release)
            if stage == "train" and self._pending_train is not None:
                gen.set_state(self._pending_train)
                self._pending_train = None
            self.streams[stage] = gen
        return gen

    def restart(self, stage: str, release: int) -> None:
        """Start evaluation ``stage`` afresh for the evaluation whose first release is ``release``."""
        self.releases[stage] = int(release)
        self.streams.pop(stage, None)

    def state(self) -> torch.Tensor | None:
        """The ``train`` stream's state (None before its first use)."""
        gen = self.streams.get("train")
        return None if gen is None else gen.get_state()

    def load(self, state: torch.Tensor | None) -> None:
        """Continue the ``train`` stream from ``state`` at its next use."""
        self.streams.pop("train", None)
        self._pending_train = state


def tensor_digest(named: Sequence[tuple[str, torch.Tensor]]):
    """SHA-256 over (name, dtype, shape, bytes) of every tensor, in the order given."""
    digest = hashlib.sha256()
    for name, tensor in named:
        value = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{value.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest


def combined_digest(parts: Sequence[tuple[str, str]]) -> str:
    """SHA-256 (hex) over ``label|hex digest`` lines, one per part, in the order given: the
    model digest from what each holder reports of its own parameters."""
    digest = hashlib.sha256()
    for label, part in parts:
        digest.update(f"{label}|{part}\n".encode())
    return digest.hexdigest()


class Parties(ABC):
    """What a protocol may ask of the parties; it never learns where they run.

    ``send`` makes every party embed its rows of a batch and return the message it puts on the
    wire (the mechanism's party side, with the party's own generator of ``stage``); a training
    send keeps the party's forward for :meth:`apply_gradients`, which finishes every party's
    backward with the gradient it received and steps its optimizer.
    """

    name = "parties"
    canaries_from_run = True
    """Whether each party draws an audit's message canaries from the run's configuration (its
    data and seed), as the local and Ray parties do; a party with its own configuration
    (``runtime=grpc``) takes none from the server."""

    def make_optimizers(self, factory) -> list[torch.optim.Optimizer]:
        """The party optimizers (``factory``: a partial torch optimizer) that the server's trainer
        checkpoints with its own: the local parties'; none where each party keeps its own."""
        return []

    def use_rows(self, rows: RowShares) -> None:
        """Embed only this rank's ``rows`` of every batch (``trainer=ddp``): only the local
        parties can; elsewhere a data-parallel ``rows`` is refused."""
        if rows.parallel:
            raise ValueError(f"{type(self).__name__} cannot embed a rank's share of the rows")

    @abstractmethod
    def use_policy(self, policy) -> None:
        """Every party's privacy policy (:class:`~vfl_lightning.algorithms.party_policy.
        PartyPolicy`) where the parties take it from the server's process; a party in its own
        process takes its own, which this one can only tighten."""

    def privacy_spent(self) -> list[dict]:
        """What each party counted of its own releases
        (:meth:`~vfl_lightning.algorithms.party_budget.PartyBudget.spent`), in party order."""
        return []

    def clean_embeddings(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The noise-free embeddings behind a noisy evaluation (the ``acc_clean`` diagnostic),
        where the parties live in the server's process; None elsewhere (the server must not see
        them)."""
        return None

    @abstractmethod
    def send(
        self, xs: Sequence[torch.Tensor], idx: torch.Tensor, *, stage: str, round: int | None
    ) -> list[torch.Tensor]:
        """Each party's message for the batch (``xs``: local slices; ``idx``: sample indices of
        ``stage``'s split): mechanism-encoded at release ``round``, or the plain embedding when
        ``round`` is None (evaluation without the mechanism)."""

    @abstractmethod
    def apply_gradients(
        self, gradients: Sequence[torch.Tensor], *, fresh: bool = False, mu: float = 0.0
    ) -> None:
        """Party m: h_m.backward(g_m), then its optimizer steps. ``fresh``: first recompute h_m on
        the last training batch with the current parameters (a FedBCD local update); ``mu`` > 0
        adds the proximal gradient μ(θ − θ_anchor) (anchor set by :meth:`set_anchor`)."""

    # ------------------------------------------------------- the asynchronous family
    @abstractmethod
    def initial_embeddings(self, xs: Sequence[torch.Tensor], *, chunk: int) -> list[torch.Tensor]:
        """Each party's embedding of the whole training split (``xs``: the local slices), without
        gradient, computed ``chunk`` rows at a time: the initial pass that fills the server's
        table (the Ray actors embed the slices they hold)."""

    @abstractmethod
    def embed_rows(self, party: int, x: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor:
        """Party ``party``'s embedding, without gradient, of training rows ``idx`` (``x``: its
        slice of them, None where the parties hold their own columns): a refreshed table entry."""

    @abstractmethod
    def client_messages(
        self,
        clients: Sequence[int],
        xs: Sequence[torch.Tensor],
        idx: torch.Tensor,
        *,
        zoo: ZooSettings | None,
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
        """Each client in ``clients`` computes its message for training rows ``idx``; yields
        (client, c, c_hat) in the order the messages arrive.

        With ``zoo``: a ZOO query (:func:`~vfl_lightning.algorithms.zoo.client_query`), c and the
        q perturbed outputs c_hat in float64; the client keeps its directions. Without: a FOO
        client's float32 embedding c (c_hat None); the client keeps its forward. Either way it
        waits for :meth:`answer_client`. Local parties compute the messages one at a time in the
        order of ``clients``, each when the server asks for the next one; Ray actors compute them
        all at once and the server takes them as they finish.
        """

    @abstractmethod
    def answer_client(self, party: int, answer: torch.Tensor) -> None:
        """Client ``party`` finishes the update its last message started, from what the server
        answered: the query's losses [h, h_hat_1..h_hat_q] (eq. 3, back-propagated through its
        model when perturbing its output) or dL/dc; its optimizer steps."""

    @abstractmethod
    def set_anchor(self) -> None:
        """Remember every party's current parameters as θ_anchor (FedPBCD's θ^{r0})."""

    @abstractmethod
    def set_lr_factor(self, factor: float) -> None:
        """Set every party optimizer's lr to its initial lr times ``factor``."""

    @abstractmethod
    def restart_stream(self, stage: str, release: int) -> None:
        """Start every party's generator of evaluation ``stage`` afresh for the evaluation whose
        first release round is ``release`` (see :class:`PartyGenerators`)."""

    @abstractmethod
    def party_digests(self) -> list[str]:
        """Each party's :func:`tensor_digest` (hex) of its own named parameters, in party order:
        computed by the party, so no parameter leaves it."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Party-side state a checkpoint must carry beyond the LightningModule's own."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    @abstractmethod
    def close(self, status: str = "ended") -> None:
        """Release what the parties hold (their processes); ``status``: how the run ended
        (``finished``, ``failed``, ``interrupted``), for parties that are told."""
