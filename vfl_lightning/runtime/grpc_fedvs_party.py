"""A FedVS client in its own program (``runtime=grpc``): its polynomial network, its data and model
shares (Algorithm 1), its coded embeddings, its updates from the broadcast dL/dH, and the coded
evaluation. Every share it sends another client is sealed for that client
(:mod:`~vfl_lightning.runtime.sealed_shares`) and relayed by the server, which reads nothing;
under FedVS itself it never sends its own embedding in the clear (training and evaluation are
coded); the Wait / Ignore / Wait-DP baselines send their plain (Wait-DP: noisy) embeddings.

With ``seeds: derived`` its model shares are drawn, as in the local simulation, from the one
stream all clients share there (the server passes its state): the client makes the whole stack's
draws and takes its own rows (:meth:`~vfl_lightning.mechanisms.fedvs.FedVSCodec.stacked_model_shares`),
so the decoded sums, hence the run, are the local run's bit for bit."""

from __future__ import annotations

import torch
from hydra.utils import instantiate

from vfl_lightning.algorithms.party_rules import ReleaseNoise, release_rows
from vfl_lightning.mechanisms.fedvs import CODE_SETTINGS, FedVSCodec, data_bound
from vfl_lightning.mechanisms.field import field_matmul
from vfl_lightning.runtime.grpc_party import PartySession
from vfl_lightning.runtime.sealed_shares import SealedShare, ShareSeal
from vfl_lightning.wire.codecs import RingCodec


def sealed_list(seal: ShareSeal, method: str, head: tuple, shares: torch.Tensor) -> list:
    """Every other client's share sealed for it: [receiver, shape, dtype, nonce, ciphertext]."""
    out = []
    for n in range(len(shares)):
        if n != seal.party:
            sealed = seal.seal(method, head, n, shares[n])
            out.append([n, list(sealed.shape), sealed.dtype, sealed.nonce, sealed.ciphertext])
    return out


class FedVSPartySession(PartySession):
    """Client ``party`` of FedVS or its baselines. The code parameters and Wait-DP's noise come
    from its own configuration's protocol node (the proposal matched them)."""

    def __init__(self, config, credentials, data, proposal) -> None:
        protocol = config.protocol
        self.strategy = protocol.get("strategy", "fedvs")
        self.dp = None if protocol.get("dp") is None else instantiate(protocol["dp"])
        super().__init__(config, credentials, data, proposal)
        code = {key: protocol[key] for key in CODE_SETTINGS if key in protocol}
        self.codec = FedVSCodec(len(proposal["party_shapes"]), **code)
        self.eval_data_shared: set[str] = set()
        self.seal = ShareSeal(self.party)
        self.inbox: dict = {}
        self.data_shares: torch.Tensor | None = None
        self.models: dict = {}
        self.eval_shares: dict[str, torch.Tensor] = {}
        self.eval_models: dict[str, tuple[int, torch.Tensor]] = {}
        self.eval_generator: torch.Generator | None = None
        self.plain: int | None = None
        self.batch: torch.Tensor | None = None
        """The rows of its last coded embedding's batch, awaiting their update."""
        self.own.project_weights(self.codec.weight_bound)

    def release_noise(self) -> ReleaseNoise:
        """FedVS codes its releases (never its own embedding); Wait-DP adds its noise."""
        return ReleaseNoise(dp=self.dp, coded=self.strategy == "fedvs")

    def agree(self, fields: dict) -> dict:
        super().agree(fields)
        self.seal.set_channel_keys(self.channel_keys)
        return {}

    def received(self, method: str, head: tuple, entries: list) -> dict[int, torch.Tensor]:
        """The shares the server relayed, each opened (sealed by its sender for this client)."""
        shares = {}
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 5):
                raise self.refuse(
                    "a relayed share is not [sender, shape, dtype, nonce, ciphertext]"
                )
            sender, shape, dtype, nonce, ciphertext = entry
            sealed = SealedShare(tuple(shape), str(dtype), nonce, ciphertext)
            if sender in shares or sender == self.party:
                raise self.refuse(f"client {sender}'s share twice")
            try:
                shares[sender] = self.seal.open(method, head, sender, sealed)
            except PermissionError as error:
                raise self.refuse(str(error)) from None
        return shares

    def gathered(self, own: torch.Tensor, method: str, head: tuple, entries: list, dim: int):
        """This client's own share and every other client's, side by side in client order."""
        shares = self.received(method, head, entries) | {self.party: own}
        if sorted(shares) != list(range(self.codec.num_clients)):
            raise self.refuse(f"shares of clients {sorted(shares)}, not of every client")
        return torch.cat([shares[n] for n in range(self.codec.num_clients)], dim)

    # ----------------------------------------------------------------- data shares (once)
    def power_info(self, fields: dict) -> dict:
        model, x = self.own.model, self.features["train"]
        return {
            "features": int(model.num_power_features),
            "width": int(model.embedding_dim),
            "degree": int(model.degree),
            "raw": int(x[0].numel()),
            "bound": data_bound(x),
        }

    def share_data(self, fields: dict) -> dict:
        """Lines 2-7: one sealed share of its quantized power features for every other client."""
        with torch.no_grad():
            features = self.own.model.power_features(self.features["train"])
        generator = self.own.generators.replay("fedvs_data")
        shares = self.codec.client_data_shares(features, generator=generator).cpu()
        self.inbox["data"] = shares[self.party]
        bits = shares[0].numel() * self.codec.element_bits
        return {"bits": int(bits), "shares": sealed_list(self.seal, "data", (), shares)}

    def collect_data(self, fields: dict) -> dict:
        own = self.shared("data", "ShareData")
        self.data_shares = self.gathered(own, "data", (), fields["shares"], 1)
        return {}

    def shared(self, key: str, call: str) -> torch.Tensor:
        """Its own share of what it shared last (``call``), taken once: the other clients'
        shares are collected once for each of its own."""
        own = self.inbox.pop(key, None)
        if own is None:
            raise self.refuse(
                f"shares to collect for {key!r} with no {call} of its own awaiting them (it "
                "collects once after each share)"
            )
        return own

    # ----------------------------------------------------------------- one round
    def share_model(self, fields: dict) -> dict:
        """Lines 14-17: its model quantized (stochastic rounding) and shared; the other clients'
        shares sealed for them."""
        weight, exchange = self.own.model.weight, fields["exchange"]
        self.own.guard.step("share_model", "exchange", exchange)
        relayed = fields["stream"]
        if (relayed is not None) != (self.config.seeds == "derived"):
            raise self.refuse(
                "a generator state from the server: its shares come from its own entropy"
                if relayed is not None
                else "model shares without the simulation's stream (seeds: derived)"
            )
        if relayed is None:
            generator = self.own.generators.get("train")
            shares = self.codec.client_model_shares(weight, generator=generator).cpu()
        else:
            generator = torch.Generator()
            generator.set_state(relayed.to(torch.uint8))
            shares = self.codec.stacked_model_shares(
                weight, generator=generator, offset=fields["offset"], rows=fields["rows"]
            ).cpu()
        self.models[exchange] = shares[self.party]
        return {"shares": sealed_list(self.seal, "model", (exchange,), shares)}

    def coded_embedding(self, fields: dict) -> dict:
        """Lines 21-24: the coded embedding (eq. 5) of the batch ``positions`` from every
        client's model share of the exchange."""
        exchange, guard = fields["exchange"], self.own.guard
        own = self.models.pop(exchange, None)
        if own is None or self.data_shares is None:
            raise self.refuse(f"a coded embedding of exchange {exchange} it holds no shares for")
        guard.step("coded_embedding", "coded exchange", exchange)
        positions = self.positions(fields["positions"], len(self.data_shares))
        segment = len(self.data_shares)
        coded_rows = torch.arange(self.codec.K)[:, None] * segment + positions
        guard.coded_release("coded_embedding", "train", release_rows(coded_rows))
        model = self.gathered(own, "model", (exchange,), fields["shares"], 0).long()
        rows = self.data_shares[positions]
        coded = field_matmul(rows.long(), model, self.codec.prime)
        self.batch = coded_rows.reshape(-1)
        return {"coded": RingCodec(self.codec.element_bits).encode(coded)}

    def positions(self, positions: torch.Tensor, count: int) -> torch.Tensor:
        if positions.dtype != torch.int64 or positions.dim() != 1:
            raise self.refuse("positions are a 1-d int64 tensor")
        if len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= count):
            raise self.refuse(f"positions lie in [0, {count})")
        return positions

    def update(self, fields: dict) -> dict:
        """Lines 32-35: back-propagate (1/N) dL/dH through its plaintext embedding of rows
        ``idx``, step, project: once for each coded embedding, for its batch only (the rows of
        every segment at its positions)."""
        idx, batch, self.batch = self.indices(fields["idx"]), self.batch, None
        if batch is None or not torch.equal(idx, batch):
            raise self.own.guard.refusal(
                "update",
                "it takes one update for each coded embedding, for the rows of that embedding's "
                "batch only (lines 32-35 of FedVS's Algorithm 1)",
            )
        self.own.guard.check_rows("update", "train", release_rows(idx))
        x = self.rows("train", fields["idx"])
        self.own.model.train()
        self.own.keep(x, self.own.forward(x))
        gradient = self.gradient(fields["gradient"], "update")
        self.own.apply_gradient(gradient / self.codec.num_clients)
        self.own.project_weights(self.codec.weight_bound)
        return {}

    # ----------------------------------------------------------------- Wait / Ignore / Wait-DP
    def plain_embedding(self, fields: dict) -> dict:
        """A baseline's plain embedding of rows ``idx`` (Wait-DP: with its noise); a coded
        client's guard refuses it; exchanges strictly increase."""
        guard, rows = self.own.guard, release_rows(self.indices(fields["idx"]))
        noise = None if self.dp is None else self.dp.noise_multiplier
        guard.check_release("plain_embedding", "train", None, rows, noise)
        guard.step("plain_embedding", "exchange", fields["exchange"])
        x = self.rows("train", fields["idx"])
        self.own.model.train()
        h = self.own.forward(x)
        if self.dp is not None:
            h = self.dp(h, self.own.generators.get("train"))
        guard.commit("plain_embedding", "train", None, rows, noise)
        self.own.keep(x, h)
        self.plain = fields["exchange"]
        return {"embedding": h.detach()}

    def update_plain(self, fields: dict) -> dict:
        used = fields["used"]
        if not 1 <= used <= self.codec.num_clients:
            raise self.refuse(f"the clients used are 1..{self.codec.num_clients}, got {used}")
        if self.plain != fields["exchange"]:
            raise self.refuse(
                f"the gradient of exchange {fields['exchange']}, its last embedding was sent "
                f"in exchange {self.plain}"
            )
        self.plain = None
        gradient = self.gradient(fields["gradient"], "update_plain")
        self.own.apply_gradient(gradient / used)
        self.own.project_weights(self.codec.weight_bound)
        return {}

    def send(self, fields: dict) -> dict:
        """A baseline's evaluation embedding (Wait-DP's with its noise when ``at_eval``); a coded
        client's guard refuses it."""
        stage, idx = fields["stage"], fields["idx"]
        dp = self.dp if self.dp is not None and (stage == "train" or self.dp.at_eval) else None
        noise = None if dp is None else dp.noise_multiplier
        out, commit = self.release("send", idx, stage, fields["round"], noise)
        if dp is not None:
            out = dp(out, self.own.generators.get(stage))
        commit()
        return {"message": self.encoded(out)}

    # ----------------------------------------------------------------- coded evaluation
    def share_eval_data(self, fields: dict) -> dict:
        """Its power features of split ``stage``, zero-padded to K segments of S rows, shared;
        returns S and max |x| of the split (the server's overflow check and row map)."""
        stage = fields["stage"]
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
        if self.eval_generator is None:
            self.eval_generator = self.own.generators.replay("fedvs_eval_data")
        shares = self.codec.client_data_shares(features, generator=self.eval_generator).cpu()
        self.inbox[stage] = shares[self.party]
        return {
            "segment": int(segment),
            "bound": data_bound(x),
            "shares": sealed_list(self.seal, "eval_data", (stage,), shares),
        }

    def collect_eval_data(self, fields: dict) -> dict:
        stage = fields["stage"]
        own = self.shared(stage, "ShareEvalData")
        self.eval_shares[stage] = self.gathered(own, "eval_data", (stage,), fields["shares"], 1)
        return {}

    def share_eval_model(self, fields: dict) -> dict:
        """The current model shared for evaluation ``exchange`` of ``stage`` (masks and rounding
        from the stage's stream, never the training stream)."""
        stage, exchange = fields["stage"], fields["exchange"]
        self.own.guard.step("share_eval_model", f"{stage} evaluation exchange", exchange)
        shares = self.codec.client_model_shares(
            self.own.model.weight, generator=self.own.generators.get(stage)
        ).cpu()
        self.models[(stage, exchange)] = shares[self.party]
        head = (stage, exchange)
        return {"shares": sealed_list(self.seal, "eval_model", head, shares)}

    def coded_eval_embedding(self, fields: dict) -> dict:
        """Eq. 5 on the evaluation shares at the stage's current exchange only; its budget counts
        the rows whose sum it codes."""
        stage, exchange, guard = fields["stage"], fields["exchange"], self.own.guard
        counter = f"{stage} evaluation exchange"
        if exchange != guard.counters.get(counter) or stage not in self.eval_shares:
            raise guard.refusal(
                "coded_eval_embedding",
                f"it codes only its shared {stage} data at its current exchange "
                f"{guard.counters.get(counter)}, got {exchange}",
            )
        cached = self.eval_models.get(stage)
        if cached is None or cached[0] != exchange:
            own = self.models.pop((stage, exchange), None)
            if own is None:
                raise self.refuse(f"an evaluation embedding of {stage} exchange {exchange}")
            head = (stage, exchange)
            model = self.gathered(own, "eval_model", head, fields["shares"], 0).long()
            self.eval_models[stage] = cached = (exchange, model)
        shares = self.eval_shares[stage]
        positions = self.positions(fields["positions"], len(shares))
        coded_rows = (torch.arange(self.codec.K)[:, None] * len(shares) + positions).reshape(-1)
        coded_rows = coded_rows[coded_rows < len(self.features[stage])]
        guard.coded_release("coded_eval_embedding", stage, release_rows(coded_rows))
        rows = shares[positions].long()
        coded = field_matmul(rows, cached[1], self.codec.prime)
        return {"coded": RingCodec(self.codec.element_bits).encode(coded)}

    METHODS = {
        call: name
        for call, name in PartySession.METHODS.items()
        if call not in PartySession.SYNC_UPDATES
    } | {
        "PowerInfo": "power_info",
        "ShareData": "share_data",
        "CollectData": "collect_data",
        "ShareModel": "share_model",
        "CodedEmbedding": "coded_embedding",
        "Update": "update",
        "PlainEmbedding": "plain_embedding",
        "UpdatePlain": "update_plain",
        "ShareEvalData": "share_eval_data",
        "CollectEvalData": "collect_eval_data",
        "ShareEvalModel": "share_eval_model",
        "CodedEvalEmbedding": "coded_eval_embedding",
    }
