"""The fixed schema of every message of ``runtime=grpc``. Two unary calls start a run (``Hello``,
``Propose``); the run itself is one stream per party (``Session``), opened with the session the
party issued for the accepted proposal, on which the server sends calls and the party answers
those that have a reply, in order. For each method: the fields of its request and of its reply
(None: the call has no reply) and their kinds (:data:`~vfl_lightning.wire.frames.KINDS`; ``?``
allows None). A frame with any other field, a missing one or another kind is refused."""

from __future__ import annotations

UNARY: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "Hello": ({}, {"party": "int", "name": "str"}),
    "Propose": ({"proposal": "json"}, {"session": "str", "party": "int", "width": "int"}),
}
"""method -> (request fields, reply fields) of the calls outside a session."""

SESSION: dict[str, tuple[dict[str, str], dict[str, str] | None]] = {
    "Open": ({"session": "str"}, {}),
    "Close": ({"status": "str"}, None),
    # ------------------------------------------------------------------ start of a run
    "PublishKey": (
        {"run_id": "str"},
        {"public_key": "bytes", "certificate": "bytes", "signature": "bytes"},
    ),
    "Agree": ({"run_id": "str", "keys": "list"}, {}),
    "Psi": ({"message": "bytes"}, {"message": "bytes"}),
    # ------------------------------------------------------------------ every protocol
    "Send": ({"idx": "tensor", "stage": "str", "round": "int?"}, {"message": "list"}),
    "RestartStream": ({"stage": "str", "release": "int"}, None),
    "Digest": ({}, {"digest": "str"}),
    "PrivacySpent": ({}, {"spent": "list"}),
    "SaveState": ({"round": "int"}, {}),
    "LoadState": ({"run": "str", "round": "int"}, {"problem": "str"}),
    # ------------------------------------------------------------------ the synchronous family
    "ApplyGradient": ({"gradient": "list", "fresh": "bool", "mu": "float"}, None),
    "SetAnchor": ({}, None),
    "SetLrFactor": ({"factor": "float"}, None),
    # ------------------------------------------------------------------ the asynchronous family
    "InitialEmbeddings": ({"chunk": "int"}, {"embedding": "tensor"}),
    "EmbedRows": ({"idx": "tensor"}, {"embedding": "tensor"}),
    "ClientMessage": (
        {"idx": "tensor", "zoo": "bool", "stream": "tensor?"},
        {"embedding": "tensor", "perturbed": "tensor?", "stream": "tensor?"},
    ),
    "Answer": ({"answer": "tensor"}, None),
    # ------------------------------------------------------------------ FedVS (shares: sealed)
    "PowerInfo": (
        {},
        {"features": "int", "width": "int", "degree": "int", "raw": "int", "bound": "float"},
    ),
    "ShareData": ({}, {"bits": "int", "shares": "list"}),
    "CollectData": ({"shares": "list"}, None),
    "ShareModel": (
        {"exchange": "int", "stream": "tensor?", "offset": "int", "rows": "int"},
        {"shares": "list"},
    ),
    "CodedEmbedding": (
        {"exchange": "int", "positions": "tensor", "shares": "list"},
        {"coded": "list"},
    ),
    "Update": ({"idx": "tensor", "gradient": "list"}, None),
    "PlainEmbedding": ({"exchange": "int", "idx": "tensor"}, {"embedding": "tensor"}),
    "UpdatePlain": ({"exchange": "int", "gradient": "list", "used": "int"}, None),
    "ShareEvalData": ({"stage": "str"}, {"segment": "int", "bound": "float", "shares": "list"}),
    "CollectEvalData": ({"stage": "str", "shares": "list"}, None),
    "ShareEvalModel": ({"stage": "str", "exchange": "int"}, {"shares": "list"}),
    "CodedEvalEmbedding": (
        {"stage": "str", "exchange": "int", "positions": "tensor", "shares": "list"},
        {"coded": "list"},
    ),
}
"""method -> (request fields, reply fields or None) of the calls on a session's stream."""
