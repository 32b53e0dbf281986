"""A server that crafts the fields of the calls it sends a party program: each call below goes
through the party's own service (frame decoding, dispatch, its session's checks) as the server's
stream carries it, and must end in the party's one-line refusal (``PERMISSION_DENIED``, a line
starting ``party 0 refuse``), never in a failure of the party's code (``INTERNAL``, a Python
exception's text): row indices of another dtype, a sparse gradient with float indices, an
evaluation restart of a stage the party has no stream of, FedVS shares collected before or
after the party shared its own, a FedVS update of rows it never coded, frames nested deeper than
any message of the schema, a call whose frame does not decode (named in the line, whatever call
came before it)."""

from __future__ import annotations

import grpc
import pytest
import torch

pytest.importorskip("grpc")

from grpc_parties import Aborted, ServerContext, session_of, stream_calls  # noqa: E402

from vfl_lightning.runtime.grpc_channel import bundle, encode_call  # noqa: E402
from vfl_lightning.wire.frames import MAX_DEPTH, FrameError, decode_frame  # noqa: E402

NPQ = ["algo=npq", "data=breast_cancer", "data.num_parties=2"]
CASCADE = ["experiment=cascade_digits", "data=breast_cancer", "data.num_parties=2"]


def refusal(program, calls: list[tuple[str, dict]]) -> str:
    """The one line with which the party refused the last of ``calls`` (the others answered)."""
    with pytest.raises(Aborted) as aborted:
        stream_calls(program, calls)
    code, line = aborted.value.code, aborted.value.line
    assert code == grpc.StatusCode.PERMISSION_DENIED, (code, line)
    assert line.startswith("party 0 refuse") and "\n" not in line, line
    return line


def test_crafted_row_indices_and_gradients_are_refused_in_one_line(tmp_path):
    program, session = session_of(tmp_path, NPQ)
    indices = "party 0 refuses: row indices are a 1-d int64 tensor"
    for idx in (torch.arange(4).to(torch.bfloat16), torch.arange(4).float(), torch.zeros(2, 2)):
        send = {"idx": idx, "stage": "train", "round": 0}
        assert refusal(program, [("Send", send)]) == indices
    # a sparse (top-k) gradient whose indices are floats: refused before it is expanded
    release = ("Send", {"idx": torch.arange(4), "stage": "train", "round": 0})
    topk = ["topk", [4, session.width], torch.tensor([1.0]), torch.tensor([1.0])]
    line = refusal(
        program, [release, ("ApplyGradient", {"gradient": topk, "fresh": False, "mu": 0.0})]
    )
    assert "in-range int64 indices and as many float32 values" in line
    # an evaluation restart of a stage it has no stream of
    line = refusal(program, [("RestartStream", {"stage": "holdout", "release": 1})])
    assert line == (
        "party 0 refused restart_stream: it releases rows of ('train', 'val', 'test', "
        "'predict'), not 'holdout'"
    )


def test_an_asynchronous_client_refuses_crafted_row_indices(tmp_path):
    program, _ = session_of(tmp_path, CASCADE)
    indices = "party 0 refuses: row indices are a 1-d int64 tensor"
    bad = torch.arange(4).to(torch.bfloat16)
    assert refusal(program, [("EmbedRows", {"idx": bad})]) == indices
    query = {"idx": bad, "zoo": True, "stream": None}
    assert refusal(program, [("ClientMessage", query)]) == indices
    # an empty batch: a refusal, not the party's code failing on a query over no row
    empty = query | {"idx": torch.zeros(0, dtype=torch.int64)}
    assert refusal(program, [("ClientMessage", empty)]) == (
        "party 0 refused client_message: a client message embeds at least one row"
    )


def test_a_fedvs_client_collects_shares_once_after_sharing_its_own(tmp_path):
    program, session = session_of(tmp_path, ["experiment=fedvs_digits"])
    digest = session.own.digest()
    for call in [
        ("CollectData", {"shares": []}),
        ("CollectEvalData", {"stage": "val", "shares": []}),
        ("CollectEvalData", {"stage": "holdout", "shares": []}),
    ]:
        line = refusal(program, [call])
        assert "with no Share" in line and "of its own awaiting them" in line, line
    # a share asked for before the key agreement: the sealing's own rule, worded as a refusal
    assert refusal(program, [("ShareData", {})]) == (
        "party 0 refuses ShareData: client 0 holds no channel key with client 1: it sends no "
        "share before the authenticated key agreement"
    )
    indices = "party 0 refuses: row indices are a 1-d int64 tensor"
    gradient = ["dense", torch.zeros(4, session.width)]
    update = {"idx": torch.arange(4).to(torch.bfloat16), "gradient": gradient}
    assert refusal(program, [("Update", update)]) == indices
    # a gradient for rows it never coded (no coded embedding awaits its update): the server
    # would otherwise steer its model with as many updates of any rows as it likes
    update = {"idx": torch.arange(4), "gradient": gradient}
    line = refusal(program, [("Update", update)])
    assert line.startswith("party 0 refused update: it takes one update for each coded embedding")
    assert session.own.digest() == digest


def test_a_party_takes_as_many_updates_per_release_as_its_own_file_allows(tmp_path):
    """FedBCD with Q = 3 in the party's file: per training release the update with its gradient
    and Q − 1 = 2 local steps; a fourth update (a server repeating the cached local step), or a
    local step before the release's update, is refused and the model left as it was. The count
    is the party's own: a proposal of another Q is refused."""
    from vfl_lightning.runtime.grpc_channel import ProposalRefused

    fedbcd = ["algo=fedbcd", "algo.local_steps=3", "data=breast_cancer", "data.num_parties=2"]
    program, session = session_of(tmp_path, fedbcd)
    gradient = {"gradient": ["dense", torch.ones(4, session.width)], "fresh": False, "mu": 0.0}
    local = {"gradient": ["cached"], "fresh": True, "mu": 0.0}

    def send(round: int) -> tuple[str, dict]:
        return ("Send", {"idx": torch.arange(4), "stage": "train", "round": round})

    stream_calls(program, [send(0), ("ApplyGradient", gradient), *[("ApplyGradient", local)] * 2])
    digest = session.own.digest()
    line = refusal(program, [("ApplyGradient", local)])
    assert line == (
        "party 0 refused apply_gradient: it takes at most 3 update(s) per training release (its "
        "protocol's local steps, from its own configuration), this would be update 4"
    )
    fresh_first = refusal(program, [send(1), ("ApplyGradient", local)])
    assert fresh_first == (
        "party 0 refused apply_gradient: a local step (fresh) follows the update with the "
        "gradient its training release received, not before it"
    )
    assert session.own.digest() == digest
    stream_calls(program, [("ApplyGradient", gradient), *[("ApplyGradient", local)] * 2])
    assert session.own.digest() != digest
    other = program.proposal | {"protocol": program.proposal["protocol"] | {"local_steps": 9}}
    with pytest.raises(ProposalRefused, match="local_steps"):
        program.propose({"proposal": other})


def test_a_party_of_a_single_update_protocol_takes_no_local_step(tmp_path):
    """npq: one update per training release; a repeated cached step is refused."""
    program, session = session_of(tmp_path, NPQ)
    release = ("Send", {"idx": torch.arange(4), "stage": "train", "round": 0})
    gradient = {"gradient": ["dense", torch.ones(4, session.width)], "fresh": False, "mu": 0.0}
    stream_calls(program, [release, ("ApplyGradient", gradient)])
    line = refusal(program, [("ApplyGradient", {"gradient": ["cached"], "fresh": True, "mu": 0.0})])
    assert line.startswith("party 0 refused apply_gradient: it takes at most 1 update(s) per")


def test_an_asynchronous_client_takes_one_answer_per_message(tmp_path):
    program, session = session_of(tmp_path, CASCADE)
    query = {"idx": torch.arange(4), "zoo": True, "stream": None}
    (message,) = stream_calls(program, [("ClientMessage", query)])
    answer = {"answer": torch.zeros(1 + message["perturbed"].shape[0], dtype=torch.float64)}
    stream_calls(program, [("Answer", answer)])
    digest = session.own.digest()
    line = refusal(program, [("Answer", answer)])
    assert line == "party 0 refuses: an answer without a message it answers"
    assert session.own.digest() == digest


@pytest.mark.parametrize(
    ("overrides", "name"), [(CASCADE, "cascade"), (["experiment=fedvs_digits"], "fedvs")]
)
def test_another_familys_party_answers_no_update_of_the_synchronous_family(
    tmp_path, overrides, name
):
    program, _ = session_of(tmp_path, overrides)
    for call, fields in [
        ("ApplyGradient", {"gradient": ["cached"], "fresh": True, "mu": 0.0}),
        ("SetAnchor", {}),
        ("SetLrFactor", {"factor": 0.5}),
    ]:
        assert refusal(program, [(call, fields)]) == (
            f"party 0 refuses {call}: it runs {name}, whose parties answer no {call}"
        )


def test_a_frame_nested_deeper_than_any_message_is_refused(tmp_path):
    program, _ = session_of(tmp_path, NPQ)
    lists = b"\x01\x01" + b"\x09\x01" * 5000 + b"\x00"  # a list in a list ... 5000 deep
    text = b"[" * 5000 + b"]" * 5000
    json = b"\x01\x01\x0a" + bytes([0x90, 0x4E]) + text  # one JSON field of 10000 bytes
    for frame in (lists, json):
        with pytest.raises(FrameError, match=f"more than {MAX_DEPTH} deep"):
            decode_frame(frame, {"answer": "list" if frame is lists else "json"})
        call = bytes([6]) + b"Answer" + frame
        service = program.handlers()
        with pytest.raises(Aborted) as aborted:
            list(service.stream(iter([bundle([call])]), ServerContext(program.config.server_name)))
        assert aborted.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert f"more than {MAX_DEPTH} deep" in aborted.value.line
    shallow = b"\x01\x01" + b"\x09\x01" * MAX_DEPTH + b"\x00"
    nested = decode_frame(shallow, {"answer": "list"})["answer"]
    for _ in range(MAX_DEPTH):
        nested = nested[0]
    assert nested is None


def certified(root, party: int, run_id: str, key) -> list:
    """Party ``party``'s X25519 ``key`` for ``run_id`` as the server relays it, signed with its
    certificate in ``root``/certs."""
    from vfl_lightning.mechanisms.certificates import Credentials, certify_key
    from vfl_lightning.mechanisms.keys import public_bytes

    certs = root / "certs"
    files = (certs / "ca.pem", certs / f"party_{party}.pem", certs / f"party_{party}.key")
    credentials = Credentials.from_files(*files, settings=("ca", "cert", "key"))
    signed = certify_key(credentials, run_id=run_id, party=party, public_key=public_bytes(key))
    return [party, signed.public_key, signed.certificate, signed.signature]


def test_a_party_agrees_on_keys_once_per_session_with_one_key_per_party(tmp_path):
    """Agree with no key, too few or too many is refused (before: no pair seed, or the party's
    code failing); the honest agreement gives the pair seed party 1 computes; a second Agree,
    with the same keys or a fresh certified key of party 1, is refused and the seed kept, so a
    server cannot re-key the party's masks mid-session."""
    from vfl_lightning.mechanisms.keys import fresh_private_key, pair_seed

    program, session = session_of(tmp_path, ["algo=pbm", "data=breast_cancer", *NPQ[2:]])
    published = stream_calls(program, [("PublishKey", {"run_id": "run"})])[0]
    own = [0, published["public_key"], published["certificate"], published["signature"]]
    peer_key = fresh_private_key()
    peer = certified(tmp_path, 1, "run", peer_key)
    for keys in ([], [own], [own, peer, peer]):
        line = refusal(program, [("Agree", {"run_id": "run", "keys": keys})])
        assert line == (
            "party 0 refused agree: the relayed keys are one per party of the run (2), got "
            f"{len(keys)}"
        )
        assert session.mechanism.masking.pairs == []
    assert stream_calls(program, [("Agree", {"run_id": "run", "keys": [own, peer]})]) == [{}]
    expected = pair_seed(peer_key, published["public_key"], 0, 1)
    assert session.mechanism.masking.pair_seeds == [expected]
    again = "party 0 refused agree: the key agreement runs once per session and this one has run"
    for keys in ([own, peer], [own, certified(tmp_path, 1, "run", fresh_private_key())]):
        line = refusal(program, [("Agree", {"run_id": "run", "keys": keys})])
        assert line.startswith(again)
    assert session.mechanism.masking.pair_seeds == [expected]


def raw_refusal(program, messages: list[list[bytes]]) -> str:
    """The line with which the party ended a stream of ``messages`` (each a list of encoded
    calls, one stream message) after its Open."""
    opened = encode_call("Open", {"session": program.session.session})
    stream = [bundle([opened]), *(bundle(calls) for calls in messages)]
    with pytest.raises(Aborted) as aborted:
        list(program.handlers().stream(iter(stream), ServerContext(program.config.server_name)))
    assert aborted.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "\n" not in aborted.value.line
    return aborted.value.line


def test_a_call_that_does_not_decode_is_named_in_the_line_not_the_call_before_it(tmp_path):
    program, _ = session_of(tmp_path, NPQ)
    rounds = iter(range(10))

    def send() -> bytes:  # a release the party answers (each round once)
        fields = {"idx": torch.arange(4), "stage": "train", "round": next(rounds)}
        return encode_call("Send", fields)

    fix = "; the server must run the party's vfl_lightning version"
    no_fields = bytes([13]) + b"ApplyGradient" + b"\x01\x00"
    expected = (
        "party 0 refuses ApplyGradient: its frame does not decode (ApplyGradient call: 0 fields, "
        f"expected 3 (['gradient', 'fresh', 'mu'])){fix}"
    )
    assert raw_refusal(program, [[send()], [no_fields]]) == expected
    assert raw_refusal(program, [[send(), no_fields]]) == expected  # in one stream message
    deep = bytes([6]) + b"Answer" + b"\x01\x01" + b"\x09\x01" * (MAX_DEPTH + 2) + b"\x00"
    line = raw_refusal(program, [[send()], [deep]])
    assert line.startswith("party 0 refuses Answer: its frame does not decode (") and line.endswith(
        fix
    )
    assert f"more than {MAX_DEPTH} deep" in line
    unknown = bytes([5]) + b"Steal" + b"\x01\x00"
    assert raw_refusal(program, [[send()], [unknown]]) == (
        f"party 0 refuses Steal: its frame does not decode (unknown call 'Steal'){fix}"
    )
    assert raw_refusal(program, [[send()], [b""]]) == (
        f"party 0 refuses an empty call: its frame does not decode (an empty call){fix}"
    )


def test_text_from_the_server_reaches_the_party_log_escaped_on_one_line(tmp_path, capsys):
    """A call name and a Close status carrying a terminal's escape sequence, a carriage return
    and a bidirectional override are printed by the party (and sent back) escaped, one line per
    event: a server cannot clear the operator's terminal or forge a line of the party's log."""
    program, _ = session_of(tmp_path, NPQ)
    capsys.readouterr()
    forged = "\x1b[2J\rerror: party 0 accepted\u202e"
    name = forged.encode()
    line = raw_refusal(program, [[bytes([len(name)]) + name + b"\x01\x00"]])
    assert line.startswith("party 0 refuses \\x1b[2J error: party 0 accepted\\u202e: its frame")
    stream_calls(program, [("Close", {"status": forged})])
    printed = capsys.readouterr().out
    assert printed.isascii() and "\x1b" not in printed and "\r" not in printed
    assert printed.splitlines() == [
        f"error: {line}",
        "party 0: the server closed the run (\\x1b[2J error: party 0 accepted\\u202e)",
    ]


def test_a_proposal_in_a_run_ends_the_running_session_for_good(tmp_path):
    """A second session: the server proposes again while a session's stream is open. The open
    stream's next call is refused (the party answers one session, the newest), and the old
    session's id opens no stream any more, so no call reaches the replaced session's keys,
    rows or guard again."""
    program, session = session_of(tmp_path, NPQ)
    context = ServerContext(program.config.server_name)

    def send(round: int) -> bytes:
        return bundle(
            [encode_call("Send", {"idx": torch.arange(4), "stage": "train", "round": round})]
        )

    def messages():
        yield bundle([encode_call("Open", {"session": session.session})])
        yield send(0)
        program.propose({"proposal": program.proposal})  # the server proposes again mid-run
        yield send(1)

    replies = []
    with pytest.raises(Aborted) as aborted:
        for reply in program.handlers().stream(messages(), context):
            replies.append(reply)
    assert len(replies) == 2  # Open and the first Send
    assert aborted.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert aborted.value.line == "party 0 refuses Send: its session was replaced"
    assert program.session is not session
    with pytest.raises(Aborted) as reopened:
        stream_calls(program, [("Digest", {})], session=session.session)
    assert reopened.value.line.startswith(
        f"party 0 refuses to open session '{session.session}': the server must propose"
    )


def test_a_proposal_of_fewer_parties_is_counted_at_its_larger_epsilon_and_capped(tmp_path):
    """The number of parties is the proposal's (a party's file does not fix it): proposed alone,
    a PBM party has no peer to mask with and its noise is the sum's only noise; it counts the ε
    of what it is asked to release, so its own ``max_feature_eps`` refuses such a proposal."""
    from vfl_lightning.algorithms.party_budget import PartyBudget
    from vfl_lightning.algorithms.party_policy import PartyPolicy
    from vfl_lightning.runtime.grpc_channel import ProposalRefused

    pbm = ["algo=pbm", "data=breast_cancer", "data.num_parties=2"]
    program, session = session_of(tmp_path / "open", pbm)
    proposal = program.proposal
    alone = proposal | {k: proposal[k][:1] for k in ("party_shapes", "widths")}
    program.propose({"proposal": alone | {"num_parties": 1}})
    single = program.session
    assert (session.mechanism.num_parties, single.mechanism.num_parties) == (2, 1)
    eps = [
        PartyBudget(0, PartyPolicy(), s.mechanism, embedding_dim=s.width).epsilon(1)
        for s in (session, single)
    ]
    assert eps[1] > eps[0] and single.own.guard.budget.epsilon(1) == eps[1]
    cap = (eps[0] + eps[1]) / 2
    capped, _ = session_of(tmp_path / "capped", pbm, policy={"max_feature_eps": cap})
    with pytest.raises(ProposalRefused) as refused:
        capped.propose({"proposal": alone | {"num_parties": 1}})
    line = str(refused.value)
    assert line.startswith("party 0 refused the proposal: its budget ") and "\n" not in line
    assert f"max_feature_eps={cap}" in line and "which allows 0 release(s) of a row" in line


def test_a_crafted_proposal_is_refused_in_one_line(tmp_path):
    """Proposals whose fields are not what a proposal holds (through the party's Propose
    handler): refused in one line (``FAILED_PRECONDITION``, both sides print it), never a failure
    of the party's code."""
    from vfl_lightning.wire.frames import Json, encode_frame

    program, _ = session_of(tmp_path, NPQ)
    proposal = program.proposal
    handler = program.handlers().unary_handler("Propose").unary_unary
    shapes = "its party_shapes and widths are not one input shape (sizes >= 1) and one width"
    for crafted, rule in [
        (proposal | {"party_shapes": [5, 6]}, shapes),
        (proposal | {"party_shapes": [proposal["party_shapes"][0], [-3]]}, shapes),
        (proposal | {"widths": proposal["widths"][:1]}, shapes),
        (proposal | {"run": "../../x"}, "its run key '../../x' is not 32 lowercase hex digits"),
        (proposal | {"run": 7}, "its run key 7 is not 32 lowercase hex digits"),
        (proposal | {"mechanism": [1]}, "mechanism is [1] in the proposal"),
    ]:
        with pytest.raises(Aborted) as aborted:
            handler(encode_frame({"proposal": Json(crafted)}), ServerContext("vfl-server"))
        assert aborted.value.code == grpc.StatusCode.FAILED_PRECONDITION, aborted.value.line
        line = aborted.value.line
        assert line.startswith("party 0 refuses the proposal: ") and rule in line, line
        assert "\n" not in line
