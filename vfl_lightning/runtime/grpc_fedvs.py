"""The FedVS clients as party programs (``runtime=grpc``), the server's side: it asks for shares,
relays every sealed share to the client it is sealed for (reading none), decodes the average
embedding from the first R coded embeddings that really arrive, and evaluates FedVS through the
coded path too. Nothing is slept: the simulated clock (``time/simulated_s``) is the local
runtime's, and Ignore uses the clients that clock says arrived in time.

With derived seeds the clients draw their model shares from the simulation's one stream, which
this side holds (``streams``): each round it passes the stream's state with the clients' row
offsets in the all-client stack, and advances the stream past that round's draws itself."""

from __future__ import annotations

import queue

import torch

from vfl_lightning.algorithms.fedvs_parties import FedVSParties
from vfl_lightning.errors import PartyLost
from vfl_lightning.mechanisms.fedvs import FedVSCodec, segment_rows
from vfl_lightning.mechanisms.lcc import check_no_wraparound
from vfl_lightning.runtime.grpc_parties import GrpcParties, packed_rows
from vfl_lightning.wire.codecs import Codec, RingCodec


def relay(sent: list[list], receiver: int) -> list[list]:
    """Of every client's sealed shares ([receiver, shape, dtype, nonce, ciphertext] per client
    sent), those for ``receiver``, as [sender, shape, dtype, nonce, ciphertext]."""
    return [
        [sender, *entry[1:]]
        for sender, entries in enumerate(sent)
        for entry in entries
        if entry[0] == receiver
    ]


class GrpcFedVSParties(GrpcParties, FedVSParties):
    """FedVS's clients behind their streams; ``codec`` holds the public code (this side decodes,
    it never holds a share), ``dp`` is Wait-DP's noise (the clients add it), ``coded_eval``
    whether evaluation is coded (FedVS itself)."""

    def __init__(
        self,
        channels,
        proposals,
        *,
        codec: FedVSCodec,
        dp=None,
        coded_eval: bool = False,
        streams=None,
        **options,
    ) -> None:
        super().__init__(channels, proposals, **options)
        self.codec, self.dp, self.coded_eval = codec, dp, bool(coded_eval)
        self.server_streams = streams
        self.derived = proposals[0].get("party_seeds") == "derived"
        self.exchange = 0
        self.model_shares: list[list] = []
        self.eval_segments: dict[str, int] = {}
        self.eval_exchanges: dict[str, int] = {}
        self.eval_count = 0
        self.eval_relay: dict[str, list[list]] = {}
        self.info = self.call_all("PowerInfo", {})

    def first_arrivals(self, method: str, count: int) -> tuple[list[int], list[dict]]:
        """(the first ``count`` clients whose reply to ``method`` arrived, in arrival order; their
        replies); the later replies are discarded when they come."""
        got: dict[int, dict] = {}
        order: list[int] = []
        while len(order) < count:
            try:
                party = self.arrivals.get(timeout=self.channels[0].timeout_s)
            except queue.Empty:
                lost = PartyLost(
                    f"fewer than {count} clients answered {method} within "
                    f"runtime.call_timeout_s={self.channels[0].timeout_s:g} s"
                )
                raise self.lost(lost, method) from None
            stream = self.streams[party]
            while stream.skipping and stream.ready():
                stream.skipping -= 1
                self.reply(party, method)  # a reply of an earlier round nobody waited for
            if party in got or stream.skipping or not stream.ready():
                continue
            got[party] = self.reply(party, method)
            order.append(party)
        for m in range(len(self.streams)):
            if m not in got:
                self.streams[m].skip()
        return order, [got[m] for m in order]

    def coded(self, replies: list[dict]) -> torch.Tensor:
        codec = RingCodec(self.codec.element_bits)
        return torch.stack([codec.decode(reply["coded"]) for reply in replies])

    # ----------------------------------------------------------------- FedVSParties
    def power_feature_counts(self):
        return [info["features"] for info in self.info]

    def share_data(self, train_xs=()):
        self.codec.check_bounds(
            feature_counts=[info["raw"] for info in self.info],
            degrees=[info["degree"] for info in self.info],
            data_bounds=[info["bound"] for info in self.info],
        )
        replies = self.call_all("ShareData", {}, training=True)
        sent = [reply["shares"] for reply in replies]
        self.send_all("CollectData", [{"shares": relay(sent, m)} for m in range(len(sent))])
        return [reply["bits"] for reply in replies]

    def share_models(self, share_delays):
        self.exchange += 1
        counts = self.power_feature_counts()
        rows, state = sum(counts), None
        if self.derived:
            stream = self.server_streams.get("train", torch.device("cpu"))
            state = stream.get_state()
            self.codec.skip_model_draws(rows, self.info[0]["width"], stream)
        offsets = [sum(counts[:m]) for m in range(len(counts))]
        fields = [
            {"exchange": self.exchange, "stream": state, "offset": offset, "rows": rows}
            for offset in offsets
        ]
        self.model_shares = [reply["shares"] for reply in self.call_all("ShareModel", fields)]
        return [c * self.info[m]["width"] * self.codec.element_bits for m, c in enumerate(counts)]

    def coded_embeddings(self, positions, upload_delays, modelled):
        self.traffic.enter(True)
        positions = positions.to("cpu", torch.int64)
        fields = [
            {
                "exchange": self.exchange,
                "positions": positions,
                "shares": relay(self.model_shares, m),
            }
            for m in range(len(self.streams))
        ]
        while not self.arrivals.empty():  # arrivals of earlier replies
            self.arrivals.get_nowait()
        for stream, f in zip(self.streams, fields, strict=True):
            stream.send("CodedEmbedding", f)
        responders, replies = self.first_arrivals("CodedEmbedding", self.codec.threshold)
        return responders, self.coded(replies).to(self.device_fn())

    def update(self, xs, idx, gradient):
        form = Codec().encode(gradient.detach().to("cpu"))
        self.send_all(
            "Update", {"idx": packed_rows(idx.to("cpu")), "gradient": form}, training=True
        )

    def plain_round(self, xs, idx, upload_delays, modelled, deadline_s):
        """Every client (Wait, Wait-DP), or those the simulated clock says arrived by the
        deadline (Ignore): their plain (Wait-DP: noisy) embeddings, in client order."""
        self.exchange += 1
        used = sorted(range(len(self.streams)) if deadline_s is None else modelled)
        self.traffic.enter(True)
        fields = {"exchange": self.exchange, "idx": packed_rows(idx.to("cpu"))}
        for m in used:
            self.streams[m].send("PlainEmbedding", fields)
        device = self.device_fn()
        return used, [self.reply(m, "embedding")["embedding"].to(device) for m in used]

    def update_plain(self, used, gradient):
        form = Codec().encode(gradient.detach().to("cpu"))
        self.traffic.enter(True)
        for m in used:
            fields = {"exchange": self.exchange, "gradient": form, "used": len(used)}
            self.streams[m].send("UpdatePlain", fields)

    def eval_embeddings(self, xs, idx, stage):
        if self.coded_eval:
            raise RuntimeError(
                "FedVS under runtime=grpc evaluates through the coded path (eval_average): no "
                "client sends its plain embedding"
            )
        return self.send(xs, idx, stage=stage, round=None)

    def eval_average(self, xs, idx, stage):
        if self.coded_eval:
            return self.coded_average(idx, stage)
        return super().eval_average(xs, idx, stage)

    def clean_embeddings(self, xs):
        """None: a Wait-DP client sends only its noisy embedding (``acc_clean`` is not logged)."""
        return None

    # ----------------------------------------------------------------- coded evaluation
    def restart_stream(self, stage, release):
        super().restart_stream(stage, release)
        self.eval_exchanges.pop(stage, None)

    def coded_average(self, idx: torch.Tensor, stage: str) -> torch.Tensor:
        """The decoded average embedding (float32) of evaluation rows ``idx`` of ``stage``."""
        self.traffic.enter(False)
        segment = self.eval_segments.get(stage)
        if segment is None:
            segment = self.share_eval_data(stage)
        exchange = self.eval_exchanges.get(stage)
        relayed: list[list] = [[] for _ in self.streams]
        if exchange is None:
            self.eval_count += 1
            exchange = self.eval_count
            replies = self.call_all("ShareEvalModel", {"stage": stage, "exchange": exchange})
            sent = [reply["shares"] for reply in replies]
            relayed = [relay(sent, m) for m in range(len(sent))]
            self.eval_exchanges[stage] = exchange
        positions, rows = segment_rows(idx.to("cpu"), segment)
        while not self.arrivals.empty():
            self.arrivals.get_nowait()
        for m, stream in enumerate(self.streams):
            fields = {"stage": stage, "exchange": exchange, "positions": positions}
            stream.send("CodedEvalEmbedding", fields | {"shares": relayed[m]})
        if any(relayed):  # every client needs its shares of this exchange: every reply is read
            responders = list(range(len(self.streams)))
            replies = self.wait_all("coded evaluation embedding")
            responders, replies = (
                responders[: self.codec.threshold],
                replies[: self.codec.threshold],
            )
        else:
            responders, replies = self.first_arrivals("CodedEvalEmbedding", self.codec.threshold)
        average = self.codec.decode_average(self.coded(replies), responders)
        return average[rows].to(self.device_fn(), torch.float32)

    def share_eval_data(self, stage: str) -> int:
        replies = self.call_all("ShareEvalData", {"stage": stage})
        sent = [reply["shares"] for reply in replies]
        fields = [{"stage": stage, "shares": relay(sent, m)} for m in range(len(sent))]
        self.send_all("CollectEvalData", fields)
        check_no_wraparound(
            feature_counts=[info["raw"] for info in self.info],
            degrees=[info["degree"] for info in self.info],
            data_bounds=[reply["bound"] for reply in replies],
            weight_bound=self.codec.weight_bound,
            l_x=self.codec.l_x,
            l_w=self.codec.l_w,
            prime=self.codec.prime,
        )
        self.eval_segments[stage] = int(replies[0]["segment"])
        return self.eval_segments[stage]
