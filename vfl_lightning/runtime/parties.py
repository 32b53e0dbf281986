"""The parties as the server reaches them: one small interface (send a batch's messages, apply a
received gradient and step, answer the asynchronous family's queries, state) with the local
implementation; Ray actors are the other one."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import torch

from vfl_lightning.algorithms.party_steps import zero_together
from vfl_lightning.algorithms.zoo import (
    ZooQuery,
    ZooSettings,
    client_estimate,
    client_query,
    set_gradient,
)
from vfl_lightning.mechanisms.secure_agg import splitmix64_int

STAGE_OFFSETS = {"train": 0, "val": 1, "test": 2, "fedvs_data": 4, "delays": 5}
"""Stream offsets; ``fedvs_data``: FedVS data-share masks, re-drawn from the seed on resume;
``delays``: an asynchronous client's real work delays under ``runtime=ray`` (checkpointed)."""


def party_seed(seed: int, stage: str, party: int) -> int:
    """The seed of party ``party``'s generator for ``stage`` (its own noise: PBM counts, LDP, ZOO
    directions under Ray; ``delays``: its simulated work delays under Ray)."""
    base = int(seed) * 1_000_003 + 7919 * STAGE_OFFSETS.get(stage, 3) + 17
    return splitmix64_int(splitmix64_int(base) ^ splitmix64_int(int(party) + 1)) & (2**63 - 1)


CONTINUING_STREAMS = ("train", "delays")
"""Party streams that continue across checkpoints (the others restart at every evaluation)."""


class PartyGenerators:
    """One party's generators: ``train`` (and ``delays``, Ray's work delays, once used) continue
    across checkpoints, every evaluation stage restarts from its seed at :meth:`restart`
    (evaluation never shifts training randomness)."""

    def __init__(self, seed: int, party: int, device: torch.device | str = "cpu") -> None:
        self.seed, self.party, self.device = int(seed), int(party), torch.device(device)
        self.streams: dict[str, torch.Generator] = {}
        self._pending_states: dict[str, torch.Tensor] = {}

    def get(self, stage: str) -> torch.Generator:
        gen = self.streams.get(stage)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(party_seed(self.seed, stage, self.party))
            pending = self._pending_states.pop(stage, None)
            if pending is not None:
                gen.set_state(pending)
            self.streams[stage] = gen
        return gen

    def move(self, device: torch.device) -> None:
        """Use ``device`` from now on (Lightning moves the module after building it)."""
        if device != self.device:
            self.device = device
            self.streams.clear()

    def restart(self, stage: str) -> None:
        self.streams.pop(stage, None)

    def state_dict(self) -> dict:
        state = {"train": self.get("train").get_state()}
        for stage in CONTINUING_STREAMS[1:]:
            if stage in self.streams or stage in self._pending_states:
                state[stage] = self.get(stage).get_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        for stage in CONTINUING_STREAMS:
            self.streams.pop(stage, None)
            self._pending_states.pop(stage, None)
            if stage in state:
                self._pending_states[stage] = state[stage]


def tensor_digest(named: Sequence[tuple[str, torch.Tensor]]):
    """SHA-256 over (name, dtype, shape, bytes) of every tensor, in the order given."""
    digest = hashlib.sha256()
    for name, tensor in named:
        value = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{value.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest


class Parties(ABC):
    """What a protocol may ask of the parties; it never learns where they run.

    ``send`` makes every party embed its rows of a batch and return the message it puts on the
    wire (the mechanism's party side, with the party's own generator of ``stage``); a training
    send keeps the party's forward for :meth:`apply_gradients`, which finishes every party's
    backward with the gradient it received and steps its optimizer.
    """

    name = "parties"

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
    def embed_rows(self, party: int, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Party ``party``'s embedding, without gradient, of training rows ``idx`` (``x``: its
        slice of them): a refreshed table entry."""

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
    def restart_stream(self, stage: str) -> None:
        """Restart every party's generator of evaluation ``stage`` from its seed."""

    @abstractmethod
    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Every party parameter as (``parties.<m>.<name>``, tensor), party by party."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Party-side state a checkpoint must carry beyond the LightningModule's own."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    @abstractmethod
    def close(self) -> None:
        """Release what the parties hold (their processes)."""


class LocalParties(Parties):
    """Today's in-process simulation: the module's own party models and Lightning optimizers,
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
        module.zero_party_gradients(party_opts)
        module.backward_parties(embeddings, gradients)
        if mu > 0:
            penalties = [
                proximal_term(list(party.parameters()), anchor, mu)
                for party, anchor in zip(module.parties, self._anchors, strict=True)
            ]
            torch.autograd.backward(torch.stack(penalties).sum())
        module.step_parties(party_opts)
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
        from the module's training generator (one stream for every client, as before Ray)."""
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
        zero_together([opt.optimizer])
        query = self._queries.pop(party, None)
        if query is None:
            module.backward_parties([self._outputs.pop(party)], [answer])
        elif query.output is None:
            set_gradient(module.parties[party], client_estimate(query, answer, self._zoo))
        else:
            module.backward_parties([query.output], [client_estimate(query, answer, self._zoo)])
        module.step_party(opt)

    def set_anchor(self):
        self._anchors = [
            [p.detach().clone() for p in party.parameters()] for party in self.module.parties
        ]

    def set_lr_factor(self, factor):
        party_opts, _ = self.module.split_optimizers()
        for opt in party_opts:
            scale_lr(opt.optimizer, factor)

    def restart_stream(self, stage):
        for gens in self.generators:
            gens.restart(stage)

    def named_parameters(self):
        return [(f"parties.{name}", p) for name, p in self.module.parties.named_parameters()]

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


def proximal_term(
    parameters: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], mu: float
) -> torch.Tensor:
    """μ/2 · ‖θ − θ^{r0}‖², whose gradient μ(θ − θ^{r0}) FedPBCD (eq. 13) adds to every update."""
    squares = [(p - a).pow(2).sum() for p, a in zip(parameters, anchors, strict=True)]
    return 0.5 * mu * torch.stack(squares).sum()


def scale_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """lr = initial lr × ``factor`` for every parameter group (the initial lr is kept)."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor
