"""A party session under runtime=grpc answers its family's calls only, and refuses, in one line,
what its own configuration forbids: a call of another family, a generator state from the server
when its seeds are private, a plain embedding from a coded (FedVS) client, a malformed gradient.
The sessions are built here as the party program builds them, without a network."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("grpc")

from grpc_parties import session_of  # noqa: E402

from vfl_lightning.errors import PartyRefusal  # noqa: E402


def refusal(call, *args) -> str:
    with pytest.raises(PartyRefusal) as refused:
        call(*args)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("party 0 refuse")
    return line


def test_a_synchronous_party_answers_no_call_of_another_family(tmp_path):
    program, session = session_of(
        tmp_path, ["algo=pbm", "data=breast_cancer", "data.num_parties=2"]
    )
    run = program.open_session(session.session)
    line = refusal(run, "ClientMessage", {"idx": torch.arange(3), "zoo": True, "stream": None})
    assert (
        line == "party 0 refuses ClientMessage: it runs pbm, whose parties answer no ClientMessage"
    )
    refusal(program.open_session, "f" * 32)
    # a noisy (PBM) party sends no clean embedding
    send = {"idx": torch.arange(4), "stage": "val", "round": None}
    assert "it sends no clean embedding" in refusal(session.send, send)


def test_a_party_checks_the_rows_and_gradients_it_receives(tmp_path):
    _, session = session_of(tmp_path, ["algo=npq", "data=breast_cancer", "data.num_parties=2"])
    session.send({"idx": torch.arange(4), "stage": "train", "round": 0})
    wrong = {"gradient": ["dense", torch.zeros(5, 16)], "fresh": False, "mu": 0.0}
    assert "must match its embedding ((4, 16), floating point), got ((5, 16)" in refusal(
        session.apply_gradient, wrong
    )
    bad = {"gradient": ["dense", torch.full((4, 16), float("nan"))], "fresh": False, "mu": 0.0}
    assert "must be finite, got NaN or infinity" in refusal(session.apply_gradient, bad)
    assert "malformed gradient" in refusal(
        session.apply_gradient,
        {"gradient": ["ring", torch.zeros(4, 16)], "fresh": False, "mu": 0.0},
    )
    huge = ["topk", [10**6, 10**6], torch.zeros(1, dtype=torch.long), torch.zeros(1)]
    assert "a topk gradient of shape [1000000, 1000000]" in refusal(
        session.apply_gradient, {"gradient": huge, "fresh": False, "mu": 0.0}
    )
    outside = {"idx": torch.tensor([10**6]), "stage": "train", "round": 1}
    assert "its train split has rows 0..396, got others" in refusal(session.send, outside)


def test_a_private_zoo_client_refuses_a_generator_state_from_the_server(tmp_path):
    overrides = ["experiment=cascade_digits", "data=breast_cancer", "data.num_parties=2"]
    _, session = session_of(tmp_path, overrides)
    state = torch.Generator().manual_seed(0).get_state()
    query = {"idx": torch.arange(4), "zoo": True, "stream": state}
    assert "a generator state from the server" in refusal(session.client_message, query)
    reply = session.client_message(query | {"stream": None})
    assert reply["embedding"].dtype == torch.float64 and reply["stream"] is None
    assert "first-order client" not in refusal(session.client_message, query | {"zoo": False})
    assert "initial pass" not in str(session.initial_embeddings({"chunk": 64}).keys())
    assert "it sends it once a run" in refusal(session.initial_embeddings, {"chunk": 64})


def test_a_coded_client_never_sends_its_plain_embedding(tmp_path):
    _, session = session_of(tmp_path / "fedvs", ["experiment=fedvs_digits"])
    send = {"idx": torch.arange(4), "stage": "val", "round": None}
    coded = "a coded party releases only coded shares of the sum, never its own embedding"
    assert coded in refusal(session.send, send)
    plain = {"exchange": 1, "idx": torch.arange(4)}
    assert coded in refusal(session.plain_embedding, plain)
    state = torch.Generator().manual_seed(0).get_state()
    share = {"exchange": 1, "stream": state, "offset": 0, "rows": 8}
    assert "a generator state from the server" in refusal(session.share_model, share)


def test_a_local_step_reuses_the_gradient_the_party_received(tmp_path):
    """FedBCD's local steps: the server sends ["cached"], the party steps again with the
    gradient it received at the exchange, exactly as if it had been sent again."""
    import copy

    _, session = session_of(tmp_path, ["algo=fedbcd", "data=breast_cancer", "data.num_parties=2"])
    cached = {"gradient": ["cached"], "fresh": True, "mu": 0.0}
    assert "a cached gradient outside a local step" in refusal(session.apply_gradient, cached)
    twin = copy.deepcopy(session)
    for party in (session, twin):
        party.send({"idx": torch.arange(4), "stage": "train", "round": 0})
    gradient = torch.randn(4, 16)
    session.apply_gradient({"gradient": ["dense", gradient], "fresh": False, "mu": 0.0})
    twin.apply_gradient({"gradient": ["dense", gradient], "fresh": False, "mu": 0.0})
    session.apply_gradient(cached)
    twin.apply_gradient({"gradient": ["dense", gradient], "fresh": True, "mu": 0.0})
    assert session.own.digest() == twin.own.digest()
    again = cached | {"fresh": False}
    assert "a cached gradient outside a local step" in refusal(session.apply_gradient, again)
