"""``runtime=grpc`` for the asynchronous family (cascade, zoo_vfl, syn_zoo_vfl, vafl): the party
program's side of the initial pass, a refreshed entry, a client message (a ZOO query or an
embedding) and its answer, and the server's side, which takes the clients' messages in the order
they arrive.

A ZOO client's directions come from its own training generator (``seeds: private``). With
``seeds: derived`` they come, as in the local simulation, from the one stream every client
shares there: the server holds that stream and passes its state with each query, the client
draws from it and returns the new state, and the server asks the clients one at a time in the
schedule's order (the local runtime's order), so the run is the local run bit for bit. A
private party refuses a stream state from the server."""

from __future__ import annotations

import queue

import torch

from vfl_lightning.algorithms.party_rules import release_rows
from vfl_lightning.algorithms.zoo import ZooSettings
from vfl_lightning.runtime.grpc_parties import GrpcParties, packed_rows
from vfl_lightning.runtime.grpc_party import PartySession


def zoo_settings(protocol: dict) -> ZooSettings | None:
    """The ZOO query a client of ``protocol`` (its own configuration's node) answers, or None
    for first-order clients."""
    if protocol.get("client_update", "zoo") != "zoo":
        return None
    return ZooSettings(
        int(protocol.get("num_directions", 1)),
        float(protocol.get("mu", 0.001)),
        str(protocol.get("direction", "gaussian")),
        str(protocol.get("zoo_space", "params")),
    )


class AsyncPartySession(PartySession):
    """A client of the asynchronous family in its own program: its plain embeddings (the
    family's protocols refuse any other mechanism), its ZOO queries with the settings of its own
    configuration, and its updates from the server's answers. The initial pass is sent once."""

    def __init__(self, config, credentials, data, proposal) -> None:
        super().__init__(config, credentials, data, proposal)
        self.zoo = zoo_settings(config.protocol)
        self.initial_pass_done = False

    def initial_embeddings(self, fields: dict) -> dict:
        if self.initial_pass_done:
            raise self.refuse("it already sent its initial pass: it sends it once a run")
        rows = release_rows(torch.arange(len(self.features["train"])))
        self.own.guard.check_release("initial_embeddings", "train", None, rows, None)
        self.initial_pass_done = True
        self.own.model.train(True)
        chunk = max(1, int(fields["chunk"]))
        embedding = self.own.embedding(self.features["train"], chunk)
        self.own.guard.commit("initial_embeddings", "train", None, rows, None)
        return {"embedding": embedding}

    def embed_rows(self, fields: dict) -> dict:
        rows = release_rows(self.indices(fields["idx"]))
        self.own.guard.check_release("embed_rows", "train", None, rows, None)
        self.own.model.train(True)
        embedding = self.own.embedding(self.rows("train", fields["idx"]))
        self.own.guard.commit("embed_rows", "train", None, rows, None)
        return {"embedding": embedding}

    def client_message(self, fields: dict) -> dict:
        """(c, c_hat) for training rows ``idx``: a ZOO query in float64 (its directions from its
        own ``train`` stream, or under derived seeds from the relayed simulation stream), or its
        embedding c (c_hat None) whose forward it keeps."""
        if fields["zoo"] != (self.zoo is not None):
            raise self.refuse(
                f"its configuration makes it a {'ZOO' if self.zoo else 'first-order'} client"
            )
        relayed = fields["stream"]
        if (relayed is not None) != (self.config.seeds == "derived" and self.zoo is not None):
            raise self.refuse(
                "a generator state from the server: its directions come from its own entropy"
                if relayed is not None
                else "a ZOO query without the simulation's stream (seeds: derived)"
            )
        rows = release_rows(self.indices(fields["idx"]))
        self.own.guard.check_release("client_message", "train", None, rows, None)
        x = self.rows("train", fields["idx"])
        self.own.model.train(True)
        generator = None
        if self.zoo is not None:
            if relayed is None:
                generator = self.own.generators.get("train")
            else:
                generator = torch.Generator()
                generator.set_state(relayed.to(torch.uint8))
        embedding, perturbed = self.own.client_message(x, self.zoo, generator)
        self.own.guard.commit("client_message", "train", None, rows, None)
        stream = generator.get_state() if relayed is not None else None
        return {"embedding": embedding, "perturbed": perturbed, "stream": stream}

    def answer(self, fields: dict) -> dict:
        """Its update from the server's answer (its guard checks the losses or dL/dc)."""
        if self.own.h is None and self.own.query is None:
            raise self.refuse("an answer without a message it answers")
        self.own.answer(fields["answer"])
        return {}

    METHODS = {
        call: name
        for call, name in PartySession.METHODS.items()
        if call not in PartySession.SYNC_UPDATES
    } | {
        "InitialEmbeddings": "initial_embeddings",
        "EmbedRows": "embed_rows",
        "ClientMessage": "client_message",
        "Answer": "answer",
    }


class GrpcAsyncParties(GrpcParties):
    """The asynchronous family's clients behind their streams. ``derived``: the server's
    ``streams`` (:class:`~vfl_lightning.algorithms.parties.ServerStreams`) hold the simulation's
    stream the clients draw their directions from, and the clients are asked one at a time in
    the schedule's order; otherwise every client of a batch is asked at once and their messages
    are taken as they arrive."""

    def __init__(self, channels, proposals, *, streams=None, **options) -> None:
        super().__init__(channels, proposals, **options)
        self.server_streams = streams
        self.derived = proposals[0].get("party_seeds") == "derived"

    def initial_embeddings(self, xs, *, chunk):
        replies = self.call_all("InitialEmbeddings", {"chunk": int(chunk)}, training=True)
        device = self.device_fn()
        return [reply["embedding"].to(device) for reply in replies]

    def embed_rows(self, party, x, idx):
        self.traffic.enter(True)
        stream = self.streams[party]
        stream.send("EmbedRows", {"idx": packed_rows(idx.to("cpu", torch.int64))})
        return self.reply(party, "refresh")["embedding"].to(self.device_fn())

    def query(self, party: int, idx: torch.Tensor, zoo) -> None:
        state = None
        if self.derived and zoo is not None:
            state = self.server_streams.get("train", torch.device("cpu")).get_state()
        fields = {"idx": packed_rows(idx), "zoo": zoo is not None, "stream": state}
        self.streams[party].send("ClientMessage", fields)

    def client_reply(self, party: int, zoo) -> tuple[int, torch.Tensor, torch.Tensor | None]:
        reply = self.reply(party, "query" if zoo is not None else "embedding")
        if reply["stream"] is not None:
            self.server_streams.get("train", torch.device("cpu")).set_state(reply["stream"])
        device = self.device_fn()
        perturbed = reply["perturbed"]
        return (
            party,
            reply["embedding"].to(device),
            None if perturbed is None else perturbed.to(device),
        )

    def client_messages(self, clients, xs, idx, *, zoo):
        self.traffic.enter(True)
        idx = idx.to("cpu", torch.int64, copy=True)
        if self.derived:
            for m in clients:
                self.query(m, idx, zoo)
                yield self.client_reply(m, zoo)
            return
        while not self.arrivals.empty():  # arrivals of earlier calls' replies
            self.arrivals.get_nowait()
        waiting = list(clients)
        for m in waiting:
            self.query(m, idx, zoo)
        while waiting:
            try:
                party = self.arrivals.get(timeout=self.channels[0].timeout_s)
            except queue.Empty:
                party = waiting[0]  # its reply raises the timeout
            if party in waiting and (self.streams[party].ready() or party == waiting[0]):
                waiting.remove(party)
                yield self.client_reply(party, zoo)

    def answer_client(self, party, answer):
        self.traffic.enter(True)
        payload = answer.detach().to("cpu", copy=True)
        self.streams[party].send("Answer", {"answer": payload})
