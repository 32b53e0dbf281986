"""The parties as the server reaches them under ``runtime=grpc``: one :class:`PartyChannel` per
party program, each call a frame of its method's schema. The protocols talk to the
:class:`~vfl_lightning.algorithms.parties.Parties` interface and do not know they run over gRPC.

A call goes to every party at once and waits for every reply; a gradient is submitted without
waiting (the party runs a session's calls in order, so its next call starts after the update)
and checked before the next call. A party that does not answer is one :class:`PartyLost` line
naming it, its address and the training round. The bytes on the server's sockets to the parties
during training calls go to ``ledger.socket_bytes``, the frames' bytes to
``ledger.serialized_bytes``."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable

import torch

from vfl_lightning.algorithms.parties import Parties
from vfl_lightning.data.alignment import AlignmentReport, align_with_parties
from vfl_lightning.errors import ConfigError, PartyLost, resume_advice
from vfl_lightning.runtime.grpc_channel import PartyChannel, PartyFailure, encode_call
from vfl_lightning.runtime.grpc_stream import Arrivals, PartyStream, StreamLoop
from vfl_lightning.runtime.socket_bytes import SocketBytes
from vfl_lightning.wire.codecs import Codec, decode_form
from vfl_lightning.wire.frames import FrameError, Packed

SPLITS = ("train", "val", "test")
TRAINING_CALLS = ("ApplyGradient", "ClientMessage", "Answer", "EmbedRows", "InitialEmbeddings")
"""Calls whose bytes are training traffic (besides ``Send`` of the training split)."""


class Traffic:
    """Bytes of the training calls: at each switch between training and other calls, the
    sockets' and frames' counts since the last switch go to the phase that ends."""

    def __init__(self, channels: list[PartyChannel], ledger) -> None:
        self.channels, self.ledger = channels, ledger
        self.sockets = SocketBytes([channel.address for channel in channels])
        self.training = False
        self.marks = self.counts()

    def counts(self) -> tuple[int | None, int]:
        frames = sum(channel.sent + channel.received for channel in self.channels)
        return self.sockets.total(), frames

    def enter(self, training: bool) -> None:
        if training == self.training:
            return
        counts = self.counts()
        if self.training and self.ledger is not None:
            (socket_then, frames_then), (socket_now, frames_now) = self.marks, counts
            self.ledger.record_serialized(frames_now - frames_then)
            if socket_then is not None and socket_now is not None:
                self.ledger.record_socket(max(0, socket_now - socket_then))
        self.marks, self.training = counts, training


def packed_rows(idx: torch.Tensor) -> Packed:
    """Row indices packed at the bits of the largest one."""
    top = int(idx.max()) if len(idx) else 0
    return Packed(idx, max(1, top.bit_length()))


class GrpcParties(Parties):
    """The parties as party programs reached over mutual TLS (``channels``, party order), one
    session stream each.

    ``proposals[m]``: what the server proposes to party m; each party checks it against its own
    configuration and answers with a session. Then the certified key agreement: every party
    publishes its X25519 key signed with its certificate, the server relays all of them, every
    party verifies its peers' against its own CA (the server holds no pair seed). ``heartbeat_s``:
    a quiet party is greeted that often, so a party tells a busy server from a gone one.
    ``checkpoint_fn``: the run's checkpoint on disk at this moment (None before the first), which
    a lost party's line offers to resume from."""

    name = "grpc"
    canaries_from_run = False

    def __init__(
        self,
        channels: list[PartyChannel],
        proposals: list[dict],
        *,
        ledger=None,
        round_fn: Callable[[], int] = lambda: 0,
        checkpoint_fn: Callable[[], str | None] = lambda: None,
        device_fn: Callable[[], torch.device] = lambda: torch.device("cpu"),
        codec_fn: Callable[[], Codec] = Codec,
        heartbeat_s: float = 5.0,
        label_holder_ids: dict | None = None,
    ) -> None:
        self.channels = channels
        self.ledger, self.round_fn, self.device_fn = ledger, round_fn, device_fn
        self.checkpoint_fn = checkpoint_fn
        self.codec_fn = codec_fn
        self.run = str(proposals[0]["run"])
        self.streams: list[PartyStream] = []
        self.sent: list[torch.Tensor] = []
        self.stopping = threading.Event()
        self.widths = self.propose(proposals)
        self.traffic = Traffic(channels, ledger)
        self.wait_all("Open")
        self.exchange_keys()
        self.alignment = None if label_holder_ids is None else self.align(label_holder_ids)
        self.heartbeat = threading.Thread(target=self.greet, args=(heartbeat_s,), daemon=True)
        self.heartbeat.start()

    # ----------------------------------------------------------------- calls
    def lost(self, error: Exception, what: str) -> Exception:
        """A lost party's error with the training round and how to go on: resume from the run's
        checkpoint when there is one, else run the command again."""
        if isinstance(error, PartyLost):
            advice = resume_advice(self.checkpoint_fn(), "restart the party program and ")
            return PartyLost(f"{error} at training round {self.round_fn()} ({what}); {advice}")
        return error

    def reply(self, party: int, what: str, timeout_s: float | None = None) -> dict:
        try:
            return self.streams[party].reply(timeout_s)
        except Exception as error:
            raise self.lost(error, what) from None

    def wait_all(self, what: str) -> list[dict]:
        """The next reply of every party, in party order (the first failure in party order):
        the loop runs once until every party answered, or the calls' timeout passed (then the
        first party in order without a reply is lost)."""
        self.flush()
        if not self.streams:
            return []
        timeout_s = self.channels[0].timeout_s
        done = self.loop.until(lambda: all(s.answered() for s in self.streams), timeout_s)
        return [self.reply(m, what, None if done else 0.0) for m in range(len(self.streams))]

    def flush(self) -> None:
        """Send every party's held calls."""
        for stream in self.streams:
            stream.flush()

    def send_all(
        self, method: str, fields: dict | list[dict], *, training: bool = False, hold=False
    ):
        """Send ``method`` to every party (``fields``: the same for all, or one per party);
        ``hold``: a call without a reply goes out with the party's next call (one stream message
        a round: the update, then the next release)."""
        self.traffic.enter(training)
        if isinstance(fields, list):
            for stream, f in zip(self.streams, fields, strict=True):
                stream.send(method, f, hold=hold)
            return
        data = encode_call(method, fields)  # the same bytes to every party, encoded once
        for stream in self.streams:
            stream.send_encoded(method, data, hold=hold)

    def call_all(self, method: str, fields: dict | list[dict], *, training: bool = False):
        """``method`` at every party at once; every reply, in party order."""
        self.send_all(method, fields, training=training)
        return self.wait_all(method)

    def greet(self, heartbeat_s: float) -> None:
        while not self.stopping.wait(heartbeat_s / 2):
            for channel in list(self.channels):
                if time.monotonic() - channel.last_call < heartbeat_s / 2:
                    continue
                with contextlib.suppress(Exception):  # a lost party shows in the next call
                    channel.call("Hello", {}, timeout_s=heartbeat_s)

    # ----------------------------------------------------------------- start of a run
    def propose(self, proposals: list[dict]) -> list[int]:
        replies = []
        for channel, proposal in zip(self.channels, proposals, strict=True):
            try:
                replies.append(channel.call("Propose", {"proposal": proposal}))
            except PartyLost as error:
                raise self.lost(error, "proposal") from None
        for party, reply in enumerate(replies):
            if reply["party"] != party:
                raise ConfigError(
                    f"runtime.parties[{party}]={self.channels[party].address} answers as party "
                    f"{reply['party']}: list the party programs in party order"
                )
        self.loop = StreamLoop()
        self.arrivals = Arrivals(self.loop)
        try:
            self.streams = [
                PartyStream(channel, reply["session"], self.arrivals, self.loop)
                for channel, reply in zip(self.channels, replies, strict=True)
            ]
        except BaseException:
            self.loop.close()
            raise
        return [reply["width"] for reply in replies]

    def exchange_keys(self) -> None:
        run_id = secrets.token_hex(16)
        published = self.call_all("PublishKey", {"run_id": run_id})
        keys = [
            [m, reply["public_key"], reply["certificate"], reply["signature"]]
            for m, reply in enumerate(published)
        ]
        self.call_all("Agree", {"run_id": run_id, "keys": self.relay(keys)})

    def align(self, stage_ids: dict) -> AlignmentReport:
        """The PSI of the label holder (this process: its ids ``stage_ids``, its scalars) with
        every party program, each message a ``Psi`` call on the party's authenticated stream."""

        def exchange(messages: list[bytes]) -> list[bytes]:
            replies = self.call_all("Psi", [{"message": message} for message in messages])
            return [reply["message"] for reply in replies]

        return align_with_parties(stage_ids, exchange, len(self.streams))

    def relay(self, keys: list[list]) -> list[list]:
        """What the server passes on of the published keys: all of them, unchanged."""
        return keys

    # ----------------------------------------------------------------- the Parties interface
    def message(self, party: int, reply: dict, rows: int) -> torch.Tensor:
        try:
            message = decode_form(reply["message"], ("dense", "ring"))
        except FrameError as error:
            raise PartyFailure(f"party {party} sent a malformed message: {error}") from None
        width = self.widths[party]
        if tuple(message.shape) != (rows, width):
            raise PartyFailure(
                f"party {party} sent a message of shape {tuple(message.shape)} for "
                f"{rows} rows of width {width}"
            )
        return message

    def send(self, xs, idx, *, stage, round):
        if stage not in SPLITS:
            raise ValueError(
                f"runtime=grpc embeds rows of the train, val or test split by index, not {stage!r}"
            )
        idx = idx.to("cpu", torch.int64, copy=True)
        fields = {"idx": packed_rows(idx), "stage": stage, "round": round}
        replies = self.call_all("Send", fields, training=stage == "train")
        device = self.device_fn()
        messages = [self.message(m, reply, len(idx)) for m, reply in enumerate(replies)]
        return [
            message.to(device) if message.is_floating_point() else message.to(device, torch.int64)
            for message in messages
        ]

    def apply_gradients(self, gradients, *, fresh=False, mu=0.0):
        """Sent without waiting, with each party's next call: a party runs its session's calls
        in order, so its next call starts after the update, and a failed update breaks its
        stream (seen at the next reply). A fresh local step with the very gradients sent last
        (FedBCD) sends ``["cached"]``: the party steps with the gradient it received."""
        self.traffic.enter(True)
        codec = self.codec_fn()
        cached = fresh and len(self.sent) == len(gradients)
        cached = cached and all(g is s for g, s in zip(gradients, self.sent, strict=True))
        for stream, gradient in zip(self.streams, gradients, strict=True):
            form = ["cached"] if cached else codec.encode(gradient.detach().to("cpu"))
            fields = {"gradient": form, "fresh": bool(fresh), "mu": float(mu)}
            stream.send("ApplyGradient", fields, hold=True)
        self.sent = list(gradients)

    def set_anchor(self):
        self.send_all("SetAnchor", {}, training=True, hold=True)

    def set_lr_factor(self, factor):
        self.send_all("SetLrFactor", {"factor": float(factor)}, training=True, hold=True)

    def restart_stream(self, stage, release):
        self.send_all("RestartStream", {"stage": stage, "release": int(release)})

    def use_policy(self, policy):
        """Each party program keeps the policy of its own configuration; the server's is not
        sent."""

    def party_digests(self):
        return [reply["digest"] for reply in self.call_all("Digest", {})]

    def privacy_spent(self):
        """What each party counted of its own releases, as it reports it."""
        replies = self.call_all("PrivacySpent", {})
        return [{key: value for key, value in reply["spent"]} for reply in replies]

    def state_dict(self):
        """Every party saves its own state for this round in its own state directory; the
        server's checkpoint keeps the run key and the round only."""
        round = int(self.round_fn())
        self.call_all("SaveState", {"round": round})
        return {"round": round, "run": self.run}

    def load_state_dict(self, state):
        if "round" not in state or "run" not in state:
            raise ConfigError(
                "this checkpoint names no party run and round (its party models are part of the "
                "checkpoint): resume it with the runtime that wrote it"
            )
        run, round = str(state["run"]), int(state["round"])
        replies = self.call_all("LoadState", {"run": run, "round": round})
        problems = [reply["problem"] for reply in replies if reply["problem"]]
        if problems:
            raise ConfigError(problems[0])
        self.run = run

    # ----------------------------------------------------------------- the asynchronous family
    def initial_embeddings(self, xs, *, chunk):
        raise NotImplementedError("the synchronous parties answer no asynchronous call")

    def embed_rows(self, party, x, idx):
        raise NotImplementedError("the synchronous parties answer no asynchronous call")

    def client_messages(self, clients, xs, idx, *, zoo):
        raise NotImplementedError("the synchronous parties answer no asynchronous call")

    def answer_client(self, party, answer):
        raise NotImplementedError("the synchronous parties answer no asynchronous call")

    # ----------------------------------------------------------------- end
    def close(self, status: str = "ended"):
        """Close every party's session with the run's ``status`` (a lost party has nothing to
        close)."""
        self.stopping.set()
        self.traffic.enter(False)
        for stream in self.streams:
            with contextlib.suppress(Exception):
                stream.send("Close", {"status": status})
        for stream in self.streams:
            stream.close()
        if hasattr(self, "loop"):
            self.loop.close()
        for channel in self.channels:
            channel.close()
        self.streams, self.channels = [], []
