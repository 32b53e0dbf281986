"""A gRPC party program enforces the party-side rules of every runtime (its ``PartyGuard``, with
the policy of its own configuration file): the calls below are what a crafting server could send
a party session (repeat a round, replay an evaluation, rewind the party to a saved state, ask a
noisy or coded party for a plain release, send an oversized gradient, ask past its budget), and
each is refused in one line naming the party, the call and the rule. End to end, the refusal
stops the server with ``status: failed`` and that line."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

pytest.importorskip("grpc")

from conftest import compose_config  # noqa: E402
from grpc_parties import align, running, session_of  # noqa: E402

from vfl_lightning.algorithms.party_budget import PartyBudget  # noqa: E402
from vfl_lightning.algorithms.party_policy import PartyPolicy  # noqa: E402
from vfl_lightning.errors import ConfigError, PartyRefusal  # noqa: E402
from vfl_lightning.mechanisms.base import release_round  # noqa: E402
from vfl_lightning.runtime.grpc_channel import ProposalRefused  # noqa: E402
from vfl_lightning.train import train  # noqa: E402

LDP = ["algo=ldp", "data=breast_cancer", "data.num_parties=2"]
ROWS = torch.arange(4)


def refused(call, fields: dict, rule: str) -> str:
    """The one line of ``call(fields)``'s refusal, which must contain ``rule``."""
    with pytest.raises(PartyRefusal) as error:
        call(fields)
    line = str(error.value)
    assert "\n" not in line and line.startswith("party 0 refused "), line
    assert rule in line, line
    return line


def send(stage: str, round: int | None, idx: torch.Tensor = ROWS) -> dict:
    return {"idx": idx, "stage": stage, "round": round}


def gradient(values: torch.Tensor, fresh: bool = False) -> dict:
    return {"gradient": ["dense", values], "fresh": fresh, "mu": 0.0}


def test_rounds_strictly_increase_and_an_evaluation_is_never_replayed(tmp_path):
    _, session = session_of(tmp_path, LDP)
    session.send(send("train", 0))
    repeat = "release rounds strictly increase within each stream: its last train release was"
    line = refused(session.send, send("train", 0), repeat)
    assert line == f"party 0 refused send: {repeat} round 0, got round 0"
    session.send(send("train", 3))
    refused(session.send, send("train", 2), "its last train release was round 3, got round 2")
    refused(session.send, send("val", 4), "a val release takes a round of its val/sanity stream")
    refused(session.send, send("train", None), "it sends no clean embedding")
    first = release_round("val", 0)
    session.restart_stream({"stage": "val", "release": first})
    session.send(send("val", first))
    refused(session.send, send("val", first), f"its last val release was round {first}")
    replay = "restart_stream: release rounds strictly increase"
    refused(session.restart_stream, {"stage": "val", "release": first}, replay)
    session.restart_stream({"stage": "val", "release": first + 1})
    session.send(send("val", first + 1))


def test_a_party_resumes_its_newest_state_or_the_one_before_before_its_first_release(tmp_path):
    """A party resumes from the newest state it saved, or the one before it (the server asks the
    parties to save before it writes its own checkpoint: a run stopped in between, e.g. a party
    killed after its save, has a checkpoint one save behind), never from an older one, and never
    after its first release."""
    program, session = session_of(tmp_path, LDP)
    run = "0" * 32
    digests = {}
    for round in (1, 2, 3):
        session.send(send("train", round - 1))
        session.apply_gradient(gradient(torch.ones(len(ROWS), session.width)))
        if round == 2:
            refused(session.save_state, {"round": 1}, "it saves its state at its current round 2")
        session.save_state({"round": round})
        digests[round] = session.own.digest()
    assert len(set(digests.values())) == 3  # each save holds another model
    rewind = "it loads state only to resume, before its first release"
    refused(session.load_state, {"run": run, "round": 2}, rewind)

    def resumed_session():
        program.propose({"proposal": program.proposal})
        align(program)
        return program.session

    # a new session of the same run (the party program again): round 3 or 2, never round 1
    older = resumed_session()
    assert older is not session
    rule = f"resumes only from the newest state it saved for run {run}, round 3, or the one"
    refused(older.load_state, {"run": run, "round": 1}, f"{rule} before it, round 2, not round 1")
    assert older.load_state({"run": run, "round": 2}) == {"problem": ""}
    assert older.own.digest() == digests[2]
    refused(older.send, send("train", 1), "its last train release was round 1, got round 1")
    older.send(send("train", 2))
    refused(older.load_state, {"run": run, "round": 2}, rewind)
    newest = resumed_session()
    assert newest.load_state({"run": run, "round": 3}) == {"problem": ""}
    assert newest.own.digest() == digests[3]
    refused(newest.send, send("train", 2), "its last train release was round 2, got round 2")


def test_a_noisy_or_coded_party_never_releases_a_plain_embedding(tmp_path):
    _, noisy = session_of(tmp_path / "ldp", LDP)
    for stage in ("train", "val", "test"):
        refused(noisy.send, send(stage, None), f"releases its {stage} rows only with its noise")
    _, coded = session_of(tmp_path / "fedvs", ["experiment=fedvs_digits"])
    plain = "a coded party releases only coded shares of the sum, never its own embedding"
    refused(coded.send, send("train", 0), plain)
    refused(coded.plain_embedding, {"exchange": 1, "idx": ROWS}, plain)
    # the refused calls released nothing: nothing is counted
    assert noisy.privacy_spent({})["spent"] == [
        ["feature_eps", 0.0],
        ["eval_feature_eps", 0.0],
        ["max_row_releases", 0],
        ["eval_max_row_releases", 0],
    ]


@pytest.mark.parametrize("action", ["refuse", "clip"])
def test_an_oversized_gradient_is_refused_or_clipped_by_the_party_own_policy(tmp_path, action):
    policy = {"max_gradient_norm": 1.0, "large_gradient": action}
    _, session = session_of(tmp_path, ["algo=npq", *LDP[1:]], policy=policy)
    twin = copy.deepcopy(session)
    for party in (session, twin):
        party.send(send("train", 0))
    huge = torch.zeros(4, 16)
    huge[1, 0] = 100.0
    if action == "refuse":
        line = refused(session.apply_gradient, gradient(huge), "a received gradient row has")
        assert line.endswith(
            f"L2 norm 100, above its {tmp_path / 'party.yaml'} policy: max_gradient_norm=1.0"
        )
        return
    session.apply_gradient(gradient(huge))
    clipped = huge.clone()
    clipped[1, 0] = 1.0
    twin.apply_gradient(gradient(clipped))
    assert session.own.digest() == twin.own.digest()
    refused(session.apply_gradient, gradient(huge[:3]), "must match its embedding ((4, 16)")


def test_the_party_budget_of_its_own_file_refuses_past_it_and_counts_what_it_released(tmp_path):
    _, session = session_of(tmp_path / "rows", LDP, policy={"max_releases_per_row": 1})
    session.send(send("train", 0))
    line = refused(
        session.send,
        send("train", 1, torch.arange(2, 6)),
        "max_releases_per_row=1: this would be release 2 of row 2",
    )
    assert line.startswith("party 0 refused send: its budget ")
    spent = dict(session.privacy_spent({})["spent"])
    budget = PartyBudget(0, PartyPolicy(), session.mechanism, embedding_dim=session.width)
    assert spent["max_row_releases"] == 1 and spent["feature_eps"] == budget.epsilon(1)
    cap = (budget.epsilon(1) + budget.epsilon(2)) / 2
    _, capped = session_of(tmp_path / "eps", LDP, policy={"max_feature_eps": cap})
    capped.send(send("train", 0))
    refused(capped.send, send("train", 1), f"max_feature_eps={cap} at δ = 1e-05, which allows 1")
    # a policy that refuses the protocol's first release refuses the proposal, in one line
    for policy, rule in [
        ({"allow_clean": False}, "it releases nothing without noise under its "),
        ({"max_feature_eps": budget.epsilon(1) / 2}, "which allows 0 release(s) of a row"),
    ]:
        with pytest.raises(ProposalRefused) as error:
            overrides = ["algo=npq", *LDP[1:]] if "allow_clean" in policy else LDP
            session_of(tmp_path / str(len(rule)), overrides, policy=policy)
        line = str(error.value)
        assert line.startswith("party 0 refused the proposal: ") and rule in line, line


def test_a_bad_policy_in_the_party_file_is_one_line(tmp_path):
    from vfl_lightning.runtime.party_config import read_party_config

    session_of(tmp_path, LDP, policy={"max_feature_eps": 1000.0})
    path = tmp_path / "party.yaml"
    text = path.read_text()
    for old, new, message in [
        ("max_feature_eps: 1000.0", "max_feature_eps: -1.0", "policy: max_feature_eps must be a"),
        ("max_feature_eps: 1000.0", "max_epsilon: 5", r"policy has unknown setting\(s\) \['max_e"),
        ("large_gradient: refuse", "large_gradient: ignore", "policy: large_gradient must be one"),
    ]:
        assert old in text
        path.write_text(text.replace(old, new))
        with pytest.raises(ConfigError, match=message) as bad:
            read_party_config(path)
        assert "\n" not in str(bad.value) and str(path) in str(bad.value)


def test_a_refusal_stops_the_server_in_one_line_with_status_failed(tmp_path):
    """The parties' own files allow one release of a row: the first training release of the
    second epoch is refused; the server's run fails with the party's line."""
    common = ["algo=npq", *LDP[1:], "trainer.max_epochs=2", "trainer.limit_val_batches=1"]
    with running(tmp_path / "deployment", common, policy={"max_releases_per_row": 1}) as parties:
        cfg = compose_config(tmp_path / "server", *common, *parties.server_overrides())
        with pytest.raises(PartyRefusal) as error:
            train(cfg)
    line = str(error.value)
    assert "\n" not in line
    assert re.match(
        r"^party [01] refused send: its budget .*party.yaml policy: "
        r"max_releases_per_row=1: this would be release 2 of row \d+ of train",
        line,
    )
    results = json.loads((tmp_path / "server" / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == line
    assert results["epochs"] == 1
