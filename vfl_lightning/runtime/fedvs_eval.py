"""FedVS evaluation under ``runtime=ray`` through the coded path: each client secret-shares its
evaluation split once, its model at every evaluation; the server decodes the average embedding."""

from __future__ import annotations

import ray
import torch

from vfl_lightning.algorithms.party_rules import release_rows
from vfl_lightning.mechanisms.fedvs import data_bound, segment_rows
from vfl_lightning.mechanisms.field import field_matmul
from vfl_lightning.mechanisms.lcc import check_no_wraparound


def start_coded_evaluation(actor) -> None:
    """Give a FedVS client actor the (empty) inboxes and shares of the coded evaluation."""
    actor.eval_inbox = {}
    actor.eval_shares = {}
    actor.eval_models = {}
    actor.eval_generator = None
    actor.eval_data_shared = set()


class CodedEvaluationActor:
    """A FedVS client's part (mixed into :class:`~vfl_lightning.runtime.ray_fedvs.FedVSPartyActor`).

    An evaluation split of n rows is zero-padded to K segments of S = ceil(n / K) rows; sample i is
    row i mod S of segment i // S. Its data shares are drawn once per run and split from the
    client's own ``fedvs_eval_data`` stream; its model shares at every evaluation from the stage's
    stream. No client ever sends an embedding of its own in the clear.
    """

    async def share_eval_data(self, stage: str) -> tuple[int, float]:
        """Share this client's power features of split ``stage`` with every other client;
        returns (S, max |x| of the split) for the server's overflow check and row map. Once
        per split."""
        if stage in self.eval_data_shared or stage not in ("val", "test"):
            raise self.own.guard.refusal(
                "share_eval_data", f"it shares the data of an evaluation split once, got {stage!r}"
            )
        self.eval_data_shared.add(stage)
        x = self.features[stage]
        segment = -(-x.shape[0] // self.codec.K)
        padded = x.new_zeros((self.codec.K * segment, *x.shape[1:]))
        padded[: x.shape[0]] = x
        with torch.no_grad():
            features = self.own.model.power_features(padded)
        if self.eval_generator is None:  # one stream for the run's splits, private or derived
            self.eval_generator = self.own.generators.replay("fedvs_eval_data")
        shares = self.codec.client_data_shares(features, generator=self.eval_generator).cpu()
        self.mail.send("receive_eval_data_share", shares, stage)
        await self.mail.keep(self.eval_inbox.setdefault(stage, {}), self.party, shares[self.party])
        return segment, data_bound(x)

    async def receive_eval_data_share(self, stage: str, sender: int, sealed) -> None:
        inbox = self.eval_inbox.setdefault(stage, {})
        await self.mail.receive(inbox, "receive_eval_data_share", (stage,), sender, sealed)

    async def collect_eval_data_shares(self, stage: str) -> None:
        inbox = self.eval_inbox.setdefault(stage, {})
        await self.mail.wait_for(lambda: len(inbox) == self.num_clients)
        self.eval_shares[stage] = torch.cat([inbox[n] for n in range(self.num_clients)], 1)
        del self.eval_inbox[stage]

    async def share_eval_model(self, stage: str, exchange: int) -> None:
        """Share the current model for evaluation ``exchange`` of ``stage`` (fresh masks and
        stochastic rounding from the stage's stream, never the training stream); its exchanges
        strictly increase."""
        self.own.guard.step("share_eval_model", f"{stage} evaluation exchange", exchange)
        shares = self.codec.client_model_shares(
            self.own.model.weight, generator=self.own.generators.get(stage)
        ).cpu()
        key = (stage, exchange)
        await self.mail.keep(self.model_inbox.setdefault(key, {}), self.party, shares[self.party])
        self.mail.send("receive_model_share", shares, key)

    async def coded_eval_embedding(
        self, stage: str, exchange: int, positions: torch.Tensor
    ) -> torch.Tensor:
        """Eq. 5 on the evaluation shares: (|positions|, h) field elements, once every client's
        model share of the exchange is here (kept for the evaluation's other batches): the
        stage's current exchange only; its budget counts the rows whose sum it codes."""
        guard, counter = self.own.guard, f"{stage} evaluation exchange"
        if exchange != guard.counters.get(counter) or stage not in self.eval_shares:
            raise guard.refusal(
                "coded_eval_embedding",
                f"it codes only its shared {stage} data at its current exchange "
                f"{guard.counters.get(counter)}, got {exchange}",
            )
        segment = len(self.eval_shares[stage])
        rows = (torch.arange(self.codec.K)[:, None] * segment + positions.to("cpu")).reshape(-1)
        rows = rows[rows < len(self.features[stage])]
        guard.coded_release("coded_eval_embedding", stage, release_rows(rows))
        key = (stage, exchange)

        def ready() -> bool:
            cached = self.eval_models.get(stage)
            return (cached is not None and cached[0] == exchange) or len(
                self.model_inbox.get(key, ())
            ) == self.num_clients

        await self.mail.wait_for(ready)
        cached = self.eval_models.get(stage)
        if cached is None or cached[0] != exchange:
            received = self.model_inbox.pop(key)
            model = torch.cat([received[n] for n in range(self.num_clients)]).long()
            self.eval_models[stage] = cached = (exchange, model)
        rows = self.eval_shares[stage][positions.to(self.eval_shares[stage].device)].long()
        return field_matmul(rows, cached[1], self.codec.prime).to(self.codec.storage_dtype)


class CodedEvaluationParties:
    """The server's part (mixed into :class:`~vfl_lightning.runtime.ray_fedvs.RayFedVSParties`):
    it asks for the shares, takes the first R coded embeddings of each batch and decodes the
    average embedding of the batch's samples. Evaluation traffic is not counted in
    ``ledger.serialized_bytes`` (training messages only, as for every protocol)."""

    def start_coded_evaluation(self) -> None:
        self.eval_segments: dict[str, int] = {}
        self.eval_exchanges: dict[str, int] = {}
        self.eval_count = 0

    def restart_stream(self, stage: str, release: int) -> None:
        """A new evaluation of ``stage`` starts (its first release round ``release``): its first
        batch shares the current models, with masks from the stage's fresh stream."""
        super().restart_stream(stage, release)
        self.eval_exchanges.pop(stage, None)

    def coded_average(self, idx: torch.Tensor, stage: str) -> torch.Tensor:
        """The decoded average embedding (float32) of evaluation rows ``idx`` of ``stage``."""
        segment = self.eval_segments.get(stage)
        if segment is None:
            segment = self._share_eval_data(stage)
        exchange = self.eval_exchanges.get(stage)
        if exchange is None:
            self.eval_count += 1
            exchange = self.eval_count
            refs = [a.share_eval_model.remote(stage, exchange) for a in self.actors]
            self._gather(refs, "evaluation model shares")
            self.eval_exchanges[stage] = exchange
        positions, rows = segment_rows(idx.to("cpu"), segment)
        refs = [a.coded_eval_embedding.remote(stage, exchange, positions) for a in self.actors]
        responders, coded = self.first_arrivals(refs, "coded evaluation embedding")
        stacked = torch.stack(coded).to(self.device_fn(), torch.int64)
        average = self.codec.decode_average(stacked, responders)
        return average[rows].to(self.device_fn(), torch.float32)

    def _share_eval_data(self, stage: str) -> int:
        replies = self._gather(
            [a.share_eval_data.remote(stage) for a in self.actors], "evaluation data shares"
        )
        self._gather(
            [a.collect_eval_data_shares.remote(stage) for a in self.actors],
            "evaluation data shares",
        )
        segments, bounds = zip(*replies, strict=True)
        _, _, degrees, raw, _ = zip(*self.info, strict=True)
        check_no_wraparound(
            feature_counts=list(raw),
            degrees=list(degrees),
            data_bounds=list(bounds),
            weight_bound=self.codec.weight_bound,
            l_x=self.codec.l_x,
            l_w=self.codec.l_w,
            prime=self.codec.prime,
        )
        self.eval_segments[stage] = int(segments[0])
        return self.eval_segments[stage]

    def first_arrivals(self, refs: list, what: str) -> tuple[list[int], list[torch.Tensor]]:
        """(the first R clients to answer ``refs``, in arrival order; their replies)."""
        owner = {ref: n for n, ref in enumerate(refs)}
        responders, replies, pending = [], [], refs
        while len(responders) < self.codec.threshold:
            ready, pending = ray.wait(pending, num_returns=1)
            responders.append(owner[ready[0]])
            replies += self._get(ready, what, responders[-1:])
        return responders, replies
