"""FedVS clients as Ray actors (``runtime=ray``): data and model shares travel actor to actor, each
client sleeps its modelled delays for real, and the server decodes from the first R arrivals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
import ray
import torch

from vfl_lightning.algorithms.fedvs_parties import FedVSParties
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.algorithms.party_rules import ReleaseNoise, release_rows
from vfl_lightning.mechanisms.analytic_gaussian import WaitDP
from vfl_lightning.mechanisms.fedvs import FedVSCodec, data_bound
from vfl_lightning.mechanisms.field import field_matmul
from vfl_lightning.runtime.fedvs_eval import (
    CodedEvaluationActor,
    CodedEvaluationParties,
    start_coded_evaluation,
)
from vfl_lightning.runtime.party_actors import embed_release, wire_message
from vfl_lightning.runtime.party_trust import PartyTrust
from vfl_lightning.runtime.ray_parties import PartyActor, RayParties
from vfl_lightning.runtime.share_channel import Mailbox
from vfl_lightning.runtime.transport import serialized_bytes


def code_parameters(codec: FedVSCodec) -> dict:
    """The public code parameters a client builds its :class:`FedVSCodec` from."""
    names = ("num_clients", "K", "T", "l_x", "l_w", "prime", "weight_bound")
    return {name: getattr(codec, name) for name in names}


class FedVSPartyActor(CodedEvaluationActor, PartyActor):
    """Client ``party`` of FedVS: besides what :class:`PartyActor` holds (its own columns, its PN
    model and optimizer, its generators) it keeps the data shares the other clients sent it and,
    per exchange, the model shares they sent it. ``code``: the public code parameters
    (:class:`FedVSCodec` keyword arguments); ``dp``: Wait-DP's noise, which the client adds to
    what it sends (training: its ``train`` stream; evaluation with ``at_eval``: that stage's).

    An async actor: a modelled network delay is an ``await asyncio.sleep`` after the message is
    computed, so while a late coded embedding is still "in flight" the client already takes the
    next request (its model update), as the simulated clock assumes. Its requests still take
    effect in the server's order: the server waits for every reply of a phase before the next
    phase, except the coded embeddings past the first R (they only read the exchange's shares,
    which they were computed from before sleeping) and the plain embeddings Ignore leaves out.
    Masks and stochastic rounding use the client's own seeded generators: the ``train`` stream
    (checkpointed) for model shares, ``fedvs_data`` (replayed from its seed, kept in the party's
    state under ``party_seeds=private``, so a resumed run re-sends the very same data shares) for
    data shares.
    """

    def __init__(
        self,
        factory: PartyFactory,
        party: int,
        num_threads: int,
        trust: PartyTrust,
        code: dict,
        dp: WaitDP | None,
        *,
        coded: bool = True,
        policy: PartyPolicy | None = None,
    ) -> None:
        noise = ReleaseNoise(dp=dp, coded=coded)
        super().__init__(factory, party, num_threads, trust, policy=policy, noise=noise)
        self.codec = FedVSCodec(**code)
        self.dp = dp
        self.num_clients = self.codec.num_clients
        self.mail = Mailbox(self.party)
        self.data_inbox: dict[int, torch.Tensor] = {}
        self.model_inbox: dict[int, dict[int, torch.Tensor]] = {}
        self.data_shares: torch.Tensor | None = None
        self.plain: int | None = None
        start_coded_evaluation(self)
        self.own.project_weights(self.codec.weight_bound)

    def agree(self, run_id: str, identities: list[bytes], relayed: list) -> None:
        """The key agreement, then a private channel with every other client: its shares are
        sealed under the pair's key (:class:`~vfl_lightning.runtime.share_channel.Mailbox`)."""
        super().agree(run_id, identities, relayed)
        self.mail.set_channel_keys(self.keys.channel_keys)

    def set_peers(self, peers: list) -> None:
        """The other clients' actor handles: shares go to them directly, never via the server,
        sealed for the client each is meant for (a handle that is not that client reads
        nothing)."""
        self.mail.peers = list(peers)

    def power_info(self) -> tuple[int, int, int, int, float]:
        """(power features F_n, embedding width h, PN degree, raw features, max |x| of the
        training slice): public sizes and what the server's overflow pre-check needs."""
        x = self.features["train"]
        model = self.own.model
        return (
            model.num_power_features,
            model.embedding_dim,
            model.degree,
            x[0].numel(),
            (data_bound(x)),
        )

    def send(self, idx: torch.Tensor, stage: str, round: int | None):
        """(embedding of rows ``idx``, serialized bytes) for the server's evaluation of the plain
        baselines, with Wait-DP's noise when ``at_eval`` (its guard refuses a coded client)."""
        dp = self.dp if self.dp is not None and (stage == "train" or self.dp.at_eval) else None
        noise = None if dp is None else dp.noise_multiplier
        out, commit = embed_release(self, "send", idx, stage, round, noise)
        if dp is not None:
            out = dp(out, self.own.generators.get(stage))
        commit()
        return wire_message(self, out)

    # ------------------------------------------------------------- data shares (once)
    async def share_data(self) -> tuple[int, int]:
        """Algorithm 1 lines 2-7: one share of this client's quantized power features to every
        other client; returns (bits of one share, serialized bytes sent)."""
        with torch.no_grad():
            features = self.own.model.power_features(self.features["train"])
        generator = self.own.generators.replay("fedvs_data")
        shares = self.codec.client_data_shares(features, generator=generator).cpu()
        sent = self.mail.send("receive_data_share", shares)
        await self.mail.keep(self.data_inbox, self.party, shares[self.party])
        return shares[0].numel() * self.codec.element_bits, sent

    async def receive_data_share(self, sender: int, sealed) -> None:
        await self.mail.receive(self.data_inbox, "receive_data_share", (), sender, sealed)

    async def collect_data_shares(self) -> None:
        """Line 10: every client's share arrived; keep them side by side in client order,
        (S, F_total) field elements."""
        await self.mail.wait_for(lambda: len(self.data_inbox) == self.num_clients)
        self.data_shares = torch.cat([self.data_inbox[n] for n in range(self.num_clients)], 1)
        self.data_inbox = {}

    # ------------------------------------------------------------- one round
    async def share_model(self, exchange: int, delay_s: float) -> int:
        """Lines 14-20: quantize (stochastic rounding), share, and after ``delay_s`` real
        seconds send one share to every other client; returns the serialized bytes sent.
        Exchanges strictly increase."""
        self.own.guard.step("share_model", "exchange", exchange)
        shares = self.codec.client_model_shares(
            self.own.model.weight, generator=self.own.generators.get("train")
        ).cpu()
        await self.mail.keep(
            self.model_inbox.setdefault(exchange, {}), self.party, shares[self.party]
        )
        await asyncio.sleep(delay_s)
        return self.mail.send("receive_model_share", shares, exchange)

    async def receive_model_share(self, exchange, sender: int, sealed) -> None:
        inbox = self.model_inbox.setdefault(exchange, {})
        await self.mail.receive(inbox, "receive_model_share", (exchange,), sender, sealed)

    async def coded_embedding(
        self, exchange: int, positions: torch.Tensor, delay_s: float
    ) -> torch.Tensor:
        """Lines 21-24: once every client's model share of ``exchange`` is here, the coded
        embedding (eq. 5) of the batch ``positions``, (|B|, h) field elements, returned after
        ``delay_s`` real seconds: once per exchange, exchanges strictly increasing."""
        guard = self.own.guard
        if self.data_shares is None:
            raise guard.refusal("coded_embedding", "it has shared no data to code")
        guard.step("coded_embedding", "coded exchange", exchange)
        segment = len(self.data_shares)
        rows = torch.arange(self.codec.K)[:, None] * segment + positions.to("cpu")
        guard.coded_release("coded_embedding", "train", release_rows(rows))
        await self.mail.wait_for(
            lambda: len(self.model_inbox.get(exchange, ())) == self.num_clients
        )
        received = self.model_inbox.pop(exchange)
        model = torch.cat([received[n] for n in range(self.num_clients)]).long()
        rows = self.data_shares[positions.to(self.data_shares.device)].long()
        coded = field_matmul(rows, model, self.codec.prime).to(self.codec.storage_dtype)
        await asyncio.sleep(delay_s)
        return coded

    def update(self, idx: torch.Tensor, gradient: torch.Tensor) -> None:
        """Lines 32-35: back-propagate (1/N) dL/dH through the plaintext embedding of rows
        ``idx``, step, project."""
        self.own.guard.check_rows("update", "train", release_rows(idx))
        self.own.model.train()
        x = self.features["train"][idx.to(self.device)]
        self.own.keep(x, self.own.forward(x))
        self.own.apply_gradient(gradient.to(self.device) / self.num_clients)
        self.own.project_weights(self.codec.weight_bound)

    # ------------------------------------------------------------- Wait / Ignore
    async def plain_embedding(self, exchange: int, idx: torch.Tensor, delay_s: float):
        """The plain embedding of rows ``idx`` (with Wait-DP's noise for Wait-DP; kept for
        :meth:`update_plain`), returned after ``delay_s`` real seconds. A coded client's guard
        refuses it; exchanges strictly increase."""
        guard, rows = self.own.guard, release_rows(idx)
        noise = None if self.dp is None else self.dp.noise_multiplier
        guard.check_release("plain_embedding", "train", None, rows, noise)
        guard.step("plain_embedding", "exchange", exchange)
        self.own.model.train()
        x = self.features["train"][idx.to(self.device)]
        h = self.own.forward(x)
        if self.dp is not None:
            h = self.dp(h, self.own.generators.get("train"))
        guard.commit("plain_embedding", "train", None, rows, noise)
        self.own.keep(x, h)
        self.plain = exchange
        await asyncio.sleep(delay_s)
        return h.detach().cpu()

    def update_plain(self, exchange: int, gradient: torch.Tensor, used: int) -> None:
        """Back-propagate dL/dH / ``used`` through the embedding sent in ``exchange``, step,
        project."""
        if isinstance(used, bool) or not isinstance(used, int) or not 1 <= used <= self.num_clients:
            raise self.own.guard.refusal(
                "update_plain", f"the clients used are 1..{self.num_clients}, got {used!r}"
            )
        kept = self.plain
        if kept != exchange:
            raise RuntimeError(
                f"client {self.party} got the gradient of exchange {exchange} but last sent an "
                f"embedding in exchange {kept}"
            )
        self.plain = None
        self.own.apply_gradient(gradient.to(self.device) / used)
        self.own.project_weights(self.codec.weight_bound)


class RayFedVSParties(CodedEvaluationParties, RayParties, FedVSParties):
    """The FedVS clients as :class:`FedVSPartyActor` handles; the server's ``codec`` holds only
    the public points (it decodes, it never holds a share).

    The round's delays are drawn on the server's simulated clock (so ``time/simulated_s`` is the
    local runtime's, to the bit) and each client is told its own, which it sleeps for real,
    scaled by ``time_scale``. The server relays no share: it tells each client which exchange to
    share, and the clients send their shares to each other. It takes the first R coded
    embeddings that arrive (``ray.wait``, one at a time, so the responders are in arrival order;
    replies that were already in when it looked count in submission order) and never reads the
    rest. ``ledger.serialized_bytes`` counts every share, every coded or plain embedding the
    server used, and every gradient, as Ray serializes them. ``dp`` (Wait-DP's noise) goes to
    every actor, which adds it to what it sends.
    """

    EXCHANGE = False  # its calls are its own (and taken as they arrive)

    def __init__(
        self,
        factory: PartyFactory,
        num_parties: int,
        *,
        codec: FedVSCodec,
        dp: WaitDP | None,
        coded_eval: bool = False,
        **options,
    ) -> None:
        self.codec = codec
        self.dp = dp
        self.coded_eval = bool(coded_eval)
        self.start_coded_evaluation()
        self.exchange = 0
        self._share_replies: list = []
        super().__init__(factory, num_parties, **options)
        self._gather([a.set_peers.remote(self.actors) for a in self.actors], "peer setup")
        self.info = self._gather([a.power_info.remote() for a in self.actors], "setup")

    def start_actor(self, factory, party, threads, options):
        actor = ray.remote(FedVSPartyActor).options(**options)
        code = code_parameters(self.codec)
        return actor.remote(
            factory,
            party,
            threads,
            self.trust,
            code,
            self.dp,
            coded=self.coded_eval,
            policy=self.policy,
        )

    def _gather(self, refs: list, what: str, parties: Sequence[int] | None = None) -> list:
        """Every reply, in order, each taken as it arrives: a dead actor is named at once even
        while the others still wait for its shares."""
        parties = list(range(len(refs)) if parties is None else parties)
        position = {ref: i for i, ref in enumerate(refs)}
        replies: list = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = position[ready[0]]
            replies[i] = self._get(ready, what, [parties[i]])[0]
        return replies

    def _count(self, nbytes: int) -> None:
        if self.ledger is not None:
            self.ledger.record_serialized(nbytes)

    def _scaled(self, delays: np.ndarray) -> list[float]:
        return [float(d) * self.time_scale for d in delays]

    def power_feature_counts(self):
        return [info[0] for info in self.info]

    def share_data(self, train_xs=()):
        """Each actor shares the columns it holds (``train_xs``, the server's, holds none)."""
        _, _, degrees, raw, bounds = zip(*self.info, strict=True)
        self.codec.check_bounds(feature_counts=raw, degrees=degrees, data_bounds=bounds)
        replies = self._gather([a.share_data.remote() for a in self.actors], "data shares")
        self._gather([a.collect_data_shares.remote() for a in self.actors], "data shares")
        self._count(sum(sent for _, sent in replies))
        return [bits for bits, _ in replies]

    def share_models(self, share_delays):
        self.exchange += 1
        self._share_replies = [
            a.share_model.remote(self.exchange, delay)
            for a, delay in zip(self.actors, self._scaled(share_delays), strict=True)
        ]
        element_bits = self.codec.element_bits
        return [features * width * element_bits for features, width, *_ in self.info]

    def coded_embeddings(self, positions, upload_delays, modelled):
        positions = positions.to("cpu")
        refs = [
            a.coded_embedding.remote(self.exchange, positions, delay)
            for a, delay in zip(self.actors, self._scaled(upload_delays), strict=True)
        ]
        self._count(sum(self._gather(self._share_replies, "model shares")))
        responders, coded = self.first_arrivals(refs, "coded embedding")
        self._count(sum(serialized_bytes(c) for c in coded))
        return responders, torch.stack(coded).to(self.device_fn(), torch.int64)

    def update(self, xs, idx, gradient):
        payload = gradient.detach().to("cpu")
        self._count(len(self.actors) * serialized_bytes(payload))
        idx = idx.to("cpu")
        self._gather([a.update.remote(idx, payload) for a in self.actors], "gradient")

    def plain_round(self, xs, idx, upload_delays, modelled, deadline_s):
        self.exchange += 1
        idx = idx.to("cpu")
        start = time.perf_counter()
        refs = [
            a.plain_embedding.remote(self.exchange, idx, delay)
            for a, delay in zip(self.actors, self._scaled(upload_delays), strict=True)
        ]
        arrived = refs
        if deadline_s is not None:
            arrived, pending = ray.wait(refs, num_returns=1)
            left = deadline_s * self.time_scale - (time.perf_counter() - start)
            if pending and left > 0:
                more, _ = ray.wait(pending, num_returns=len(pending), timeout=left)
                arrived = arrived + more
        owner = {ref: n for n, ref in enumerate(refs)}
        used = sorted(owner[ref] for ref in arrived)
        embeddings = self._gather([refs[n] for n in used], "embedding", used)
        self._count(sum(serialized_bytes(h) for h in embeddings))
        device = self.device_fn()
        return used, [h.to(device) for h in embeddings]

    def eval_embeddings(self, xs, idx, stage):
        if self.coded_eval:
            raise RuntimeError(
                "FedVS under runtime=ray evaluates through the coded path (eval_average): no "
                "client sends its plain embedding"
            )
        return self.send(xs, idx, stage=stage, round=None)

    def eval_average(self, xs, idx, stage):
        """FedVS: decoded from the coded evaluation embeddings; the plain baselines (whose
        training already sends plain embeddings): the average of what the clients send."""
        if self.coded_eval:
            return self.coded_average(idx, stage)
        return super().eval_average(xs, idx, stage)

    def clean_embeddings(self, xs):
        """None: a Wait-DP client sends only its noisy embedding (``acc_clean`` is not logged)."""
        return None

    def update_plain(self, used, gradient):
        payload = gradient.detach().to("cpu")
        self._count(len(used) * serialized_bytes(payload))
        refs = [self.actors[n].update_plain.remote(self.exchange, payload, len(used)) for n in used]
        self._gather(refs, "gradient", used)
