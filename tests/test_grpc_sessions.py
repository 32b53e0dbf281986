"""A party session under runtime=grpc answers its family's calls only, and refuses, in one line,
what its own configuration forbids: a call of another family, a generator state from the server
when its seeds are private, a plain embedding from a coded (FedVS) client, a malformed gradient.
The sessions are built here as the party program builds them, without a network."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("grpc")

from conftest import compose_config  # noqa: E402

from vfl_lightning.data.alignment import align_with_parties  # noqa: E402
from vfl_lightning.data.export import export  # noqa: E402
from vfl_lightning.mechanisms.certificates import write_development_ca  # noqa: E402
from vfl_lightning.party import write_party_config  # noqa: E402
from vfl_lightning.run.assemble import build  # noqa: E402
from vfl_lightning.run.grpc_session import make_proposal  # noqa: E402
from vfl_lightning.runtime.grpc_channel import PartyRefusal  # noqa: E402
from vfl_lightning.runtime.grpc_schema import SESSION, UNARY  # noqa: E402
from vfl_lightning.runtime.party_config import read_party_config  # noqa: E402
from vfl_lightning.runtime.party_program import PartyProgram  # noqa: E402


def session_of(root, overrides: list[str], seeds: str = "private"):
    """Party 0's program and its session for the run ``overrides`` describe."""
    write_development_ca(root / "certs", 1)
    manifest = export(overrides, root / "data")
    config = write_party_config(
        root / "party.yaml",
        overrides,
        party=0,
        listen="127.0.0.1:0",
        certs=root / "certs",
        data=root / "data" / "party_0.npz",
        state_dir=root / "state",
        seeds=seeds,
    )
    program = PartyProgram(read_party_config(config))
    cfg = compose_config(root / "server", *overrides)
    datamodule, module = build(cfg)
    proposing = compose_config(root / "server", *overrides, "runtime=grpc")
    proposing.runtime.party_seeds = seeds
    proposal = make_proposal(proposing, module, datamodule, "0" * 32)[0]
    program.propose({"proposal": proposal})
    assert manifest.num_parties == module.num_parties
    session = program.session
    before = "it releases nothing before the PSI aligned its rows (Psi)"
    assert refusal(session.rows, "train", torch.arange(2)).endswith(before)  # every release's
    if getattr(session, "strategy", None) != "fedvs":  # a coded client refuses every Send
        send = {"idx": torch.arange(2), "stage": "train", "round": 0}
        assert refusal(session.send, send).endswith(before)
    # the PSI of the label holder with this party (the server's code), through Psi calls of the
    # session's runner: a call of the authenticated session stream, never a unary call
    assert "Psi" in SESSION and "Psi" not in UNARY
    assert "Psi" not in program.handlers().unary
    ids = {stage: datamodule.split_index[stage] for stage in ("train", "val", "test")}
    run, sent = program.open_session(session.session), []

    def exchange(messages: list[bytes]) -> list[bytes]:
        sent.append(messages[0])
        return [run("Psi", {"message": messages[0]})["message"]]

    report = align_with_parties(ids, exchange, 1)
    assert report.aligned_rows == sum(len(rows) for rows in ids.values())
    # a replayed message of the finished alignment (a new ALIGN too) is refused, rows unchanged
    aligned = {stage: x.clone() for stage, x in session.features.items()}
    for message in sent:
        assert "its alignment is finished" in refusal(run, "Psi", {"message": message})
    assert all(torch.equal(aligned[s], session.features[s]) for s in aligned)
    return program, session


def refusal(call, *args) -> str:
    with pytest.raises(PartyRefusal) as refused:
        call(*args)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("party 0 refuses")
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
    assert "a gradient of shape (5, 16) for its message of shape (4, 16)" in refusal(
        session.apply_gradient, wrong
    )
    bad = {"gradient": ["dense", torch.full((4, 16), float("nan"))], "fresh": False, "mu": 0.0}
    assert "non-finite" in refusal(session.apply_gradient, bad)
    assert "malformed gradient" in refusal(
        session.apply_gradient,
        {"gradient": ["ring", torch.zeros(4, 16)], "fresh": False, "mu": 0.0},
    )
    outside = {"idx": torch.tensor([10**6]), "stage": "train", "round": 1}
    assert "row indices lie in [0," in refusal(session.send, outside)


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
    assert "a coded client never sends its plain embedding" in refusal(session.send, send)
    plain = {"exchange": 1, "idx": torch.arange(4)}
    assert "never sends its plain embedding" in refusal(session.plain_embedding, plain)
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
