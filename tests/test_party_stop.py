"""A party program that stops (SIGTERM, Ctrl-C, its server gone): the call it is running
finishes and none runs after it, the replies in hand are sent, the streams still open are cut
at once (no grace period), and its ledger is written; ``python -m vfl_lightning.party serve``
then exits 0 without the interpreter's teardown. How long it takes: ``bench/party_stop.py``."""

from __future__ import annotations

import signal

import pytest
import torch

pytest.importorskip("grpc")

from grpc_parties import ServerContext, make_deployment, session_of  # noqa: E402

from vfl_lightning.errors import PartyRefusal  # noqa: E402
from vfl_lightning.runtime.grpc_channel import bundle, encode_call  # noqa: E402

LDP = ["algo=ldp", "data=breast_cancer", "data.num_parties=2"]
CAPPED = {"max_releases_per_row": 3}


def test_a_stopping_program_runs_no_call_after_it_and_writes_its_ledger(tmp_path):
    program, session = session_of(tmp_path, LDP, policy=CAPPED)
    program.start()
    run = program.open_session(session.session)
    run("Send", {"idx": torch.arange(4), "stage": "train", "round": 0})
    ledger = tmp_path / "state" / "party_0" / "released.pt"
    assert not ledger.exists()
    program.stop(0, "")
    assert program.wait() == 0
    assert ledger.is_file()
    with pytest.raises(PartyRefusal) as refused:
        run("Digest", {})
    assert str(refused.value) == "party 0 refuses Digest: it is stopping"


def test_a_stream_message_counts_as_in_hand_until_its_last_reply_was_taken(tmp_path):
    """The service's count of messages in hand: a stream's handler resumes after a reply only
    once gRPC has sent it, so a message is in hand from its arrival until then."""
    program, session = session_of(tmp_path, LDP)
    service = program.handlers()
    opened = bundle([encode_call("Open", {"session": session.session})])
    digests = bundle([encode_call("Digest", {}), encode_call("Digest", {})])
    stream = service.stream(iter([opened, digests]), ServerContext(program.config.server_name))
    assert service.wait_idle(0.0)
    next(stream)  # Open's reply, handed over and not yet sent
    assert service.handling == 1 and not service.wait_idle(0.0)
    next(stream)  # the first Digest's: the second message is in hand
    assert service.handling == 1
    next(stream)
    assert service.handling == 1
    assert list(stream) == []  # the last reply sent, the requests ended
    assert service.wait_idle(0.0)


def test_sigterm_ends_a_party_program_with_an_open_quiet_session_at_once(tmp_path):
    """Exit code 0 and its ledger written, after SIGTERM while a session's stream is open and
    the server quiet (before: a one-second grace period for that stream, then a second of the
    interpreter's teardown)."""
    from vfl_lightning.mechanisms.certificates import Credentials
    from vfl_lightning.runtime.grpc_channel import PartyChannel
    from vfl_lightning.runtime.grpc_parties import GrpcParties

    deployment = make_deployment(tmp_path, LDP, policy=CAPPED)
    try:
        deployment.start()
        certs = deployment.certs
        server = Credentials.from_files(
            certs / "ca.pem", certs / "server.pem", certs / "server.key", settings=("", "", "")
        )
        channels = [
            PartyChannel(m, party.address, server, timeout_s=60)
            for m, party in enumerate(deployment.parties)
        ]
        proposals, ids = run_proposals(tmp_path)
        parties = GrpcParties(channels, proposals, label_holder_ids=ids)
        parties.send(None, torch.arange(4), stage="train", round=0)
        victim = deployment.parties[0]
        assert victim.stop(signal.SIGTERM) == 0
        output = victim.output()
        assert "Traceback" not in output and "error:" not in output, output
        assert (tmp_path / "party_0" / "state" / "party_0" / "released.pt").is_file()
    finally:
        deployment.stop()


def run_proposals(root) -> tuple[list[dict], dict]:
    """The proposals of the run (as the server makes them) and the label holder's ids."""
    from conftest import compose_config

    from vfl_lightning.run.assemble import build
    from vfl_lightning.run.grpc_session import make_proposal

    cfg = compose_config(root / "server", *LDP)
    datamodule, module = build(cfg)
    cfg.runtime.party_seeds = "derived"
    ids = {stage: datamodule.split_index[stage] for stage in ("train", "val", "test")}
    return make_proposal(cfg, module, datamodule, "0" * 32), ids
