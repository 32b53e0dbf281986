"""runtime=grpc's transport and trust: mutual TLS with the deployment's CA, each party's certificate
name, the server's, and the key agreement signed with the parties' certificates. Each refusal is
one line. The party programs run in this process (threads), on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")

from vfl_lightning.data.export import export  # noqa: E402
from vfl_lightning.errors import PartyLost  # noqa: E402
from vfl_lightning.mechanisms.certificates import (  # noqa: E402
    Credentials,
    write_development_ca,
)
from vfl_lightning.party import write_party_config  # noqa: E402
from vfl_lightning.runtime.grpc_channel import (  # noqa: E402
    PartyChannel,
    PartyRefusal,
    PartyService,
    start_server,
)
from vfl_lightning.runtime.grpc_parties import GrpcParties  # noqa: E402
from vfl_lightning.runtime.party_config import read_party_config  # noqa: E402
from vfl_lightning.runtime.party_program import PartyProgram  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ["algo=pbm", "data=breast_cancer", "data.num_parties=3"]
NUM_PARTIES = 3


def credentials(folder, stem: str) -> Credentials:
    return Credentials.from_files(
        folder / "ca.pem", folder / f"{stem}.pem", folder / f"{stem}.key", settings=("a", "b", "c")
    )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """Certificates of two CAs, data files and party configurations (party m: party_<m>.yaml)."""
    root = tmp_path_factory.mktemp("grpc_transport")
    write_development_ca(root / "certs", NUM_PARTIES)
    write_development_ca(root / "other_ca", NUM_PARTIES)
    export(OVERRIDES, root / "data")
    for m in range(NUM_PARTIES):
        write_party_config(
            root / f"party_{m}.yaml",
            OVERRIDES,
            party=m,
            listen="127.0.0.1:0",
            certs=root / "certs",
            data=root / "data" / f"party_{m}.npz",
            state_dir=root / f"state_{m}",
            seeds="derived",
        )
    return root


@pytest.fixture
def program(deployment):
    """Party 0's program, serving in this process; stopped at the end."""
    program = PartyProgram(read_party_config(deployment / "party_0.yaml"))
    port = program.start()
    yield program, f"127.0.0.1:{port}"
    program.stop(0, "")
    program.wait()


def test_a_plaintext_connection_is_refused(program, deployment):
    _, address = program
    with grpc.insecure_channel(address) as channel:
        hello = channel.unary_unary("/vfl_lightning.Party/Hello")
        with pytest.raises(grpc.RpcError) as refused:
            hello(b"\x01\x00", timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # the party still serves a client with the deployment's certificate
    server = PartyChannel(0, address, credentials(deployment / "certs", "server"), timeout_s=5)
    assert server.call("Hello", {}) == {"party": 0, "name": "party-0"}
    server.close()


def test_a_server_certificate_from_another_ca_is_refused_in_one_line(program, deployment):
    _, address = program
    foreign = credentials(deployment / "other_ca", "server")
    channel = PartyChannel(0, address, foreign, timeout_s=5)
    with pytest.raises(PartyLost) as refused:
        channel.wait_ready(1)
    line = str(refused.value)
    assert "\n" not in line and f"party 0 at {address} is not reachable over mutual TLS" in line
    channel.close()


def test_a_refused_handshake_prints_no_grpc_log_lines(program, deployment):
    """gRPC's C core would log each failed TLS handshake of the reconnecting channel to stderr
    (``I... ssl_transport_security.cc ... Handshake failed``); the refusal is the only output."""
    _, address = program
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from vfl_lightning.errors import PartyLost\n"
        "from vfl_lightning.mechanisms.certificates import Credentials\n"
        "from vfl_lightning.runtime.grpc_channel import PartyChannel\n"
        "folder = Path(sys.argv[1])\n"
        "files = [folder / name for name in ('ca.pem', 'server.pem', 'server.key')]\n"
        "tls = Credentials.from_files(*files, settings=('a', 'b', 'c'))\n"
        "try:\n"
        "    PartyChannel(0, sys.argv[2], tls, timeout_s=5).wait_ready(3)\n"
        "except PartyLost:\n"
        "    print('refused', file=sys.stderr)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "GRPC_VERBOSITY"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", script, str(deployment / "other_ca"), address],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.stderr.splitlines() == ["refused"], done.stderr[-2000:]


def test_a_party_certificate_from_another_ca_is_refused_by_the_server(deployment):
    foreign = credentials(deployment / "other_ca", "party_0")
    service = PartyService(
        0,
        "vfl-server",
        {"Hello": lambda f: {"party": 0, "name": "x"}},
        lambda s: None,
        lambda: None,
    )
    server, port = start_server(service.handler(), "127.0.0.1:0", foreign)
    try:
        channel = PartyChannel(
            0, f"127.0.0.1:{port}", credentials(deployment / "certs", "server"), timeout_s=5
        )
        with pytest.raises(PartyLost, match="not reachable over mutual TLS"):
            channel.wait_ready(1)
        channel.close()
    finally:
        server.stop(None)


def test_a_party_presenting_another_partys_certificate_is_refused(deployment):
    """At party 0's address a program with party 1's certificate: TLS refuses the name."""
    impostor = credentials(deployment / "certs", "party_1")
    service = PartyService(
        0,
        "vfl-server",
        {"Hello": lambda f: {"party": 0, "name": "x"}},
        lambda s: None,
        lambda: None,
    )
    server, port = start_server(service.handler(), "127.0.0.1:0", impostor)
    try:
        channel = PartyChannel(
            0, f"127.0.0.1:{port}", credentials(deployment / "certs", "server"), timeout_s=5
        )
        with pytest.raises(PartyLost) as refused:
            channel.wait_ready(1)
        assert "certificate naming party-0" in str(refused.value)
        assert "\n" not in str(refused.value)
        channel.close()
    finally:
        server.stop(None)


def test_a_party_program_refuses_another_partys_certificate_file(deployment, tmp_path):
    """A configuration of party 0 holding party 1's certificate does not start."""
    text = (deployment / "party_0.yaml").read_text().replace("party_0.pem", "party_1.pem")
    text = text.replace("party_0.key", "party_1.key")
    (tmp_path / "party.yaml").write_text(text)
    with pytest.raises(ValueError, match="names party-1, but party 0's certificate must name"):
        PartyProgram(read_party_config(tmp_path / "party.yaml"))


def test_a_party_accepts_calls_only_from_the_server_certificate(program, deployment):
    """Another party's certificate (of the same CA) cannot call party 0."""
    _, address = program
    peer = credentials(deployment / "certs", "party_1")
    channel = PartyChannel(0, address, peer, timeout_s=5)
    with pytest.raises(PartyRefusal) as refused:
        channel.call("Hello", {})
    assert str(refused.value) == (
        "party 0 accepts calls only from the server vfl-server, not from a certificate naming "
        "['party-1']"
    )
    channel.close()


class Tampering(GrpcParties):
    """A server that relays party 2's key with one bit flipped, or another party's key as 2's."""

    swap = False

    def relay(self, keys):
        keys = [list(key) for key in keys]
        if self.swap:
            keys[2] = [2, *keys[1][1:]]
        else:
            flipped = bytearray(keys[2][1])
            flipped[0] ^= 1
            keys[2][1] = bytes(flipped)
        return keys


def proposals(deployment) -> list[dict]:
    """The proposal of the run the configurations describe (as the server would make it)."""
    from conftest import compose_config

    from vfl_lightning.run.assemble import build
    from vfl_lightning.run.grpc_session import make_proposal

    cfg = compose_config(deployment / "server", *OVERRIDES)
    datamodule, module = build(cfg)
    cfg.runtime.party_seeds = "derived"
    return make_proposal(cfg, module, datamodule, "0" * 32)


@pytest.mark.parametrize("swap", [False, True])
def test_a_tampered_or_substituted_key_is_refused_in_one_line(deployment, swap):
    programs = [
        PartyProgram(read_party_config(deployment / f"party_{m}.yaml")) for m in range(NUM_PARTIES)
    ]
    server = credentials(deployment / "certs", "server")
    try:
        channels = [
            PartyChannel(m, f"127.0.0.1:{program.start()}", server, timeout_s=30)
            for m, program in enumerate(programs)
        ]
        tampering = type("Tampering", (Tampering,), {"swap": swap})
        with pytest.raises(PartyRefusal) as refused:
            tampering(channels, proposals(deployment))
        line = str(refused.value)
        assert "\n" not in line and line.startswith("party 0 refuses: the key agreement:")
        if swap:
            assert "the certificate relayed for party 2 names ['party-1'], not party-2" in line
        else:
            assert "party 2's public key fails its certificate's signature" in line
        # an honest relay of the same parties agrees
        GrpcParties(channels, proposals(deployment)).close()
    finally:
        for program in programs:
            program.stop(0, "")
            program.wait()


def test_the_certified_key_of_a_run_is_refused_for_another_run(deployment):
    from vfl_lightning.mechanisms.certificates import (
        KeyCertificationError,
        certify_key,
        verify_certified_key,
    )

    party = credentials(deployment / "certs", "party_1")
    signed = certify_key(party, run_id="run a", party=1, public_key=bytes(32))
    ca = party.ca
    assert verify_certified_key(signed, run_id="run a", party=1, ca=ca) == bytes(32)
    with pytest.raises(KeyCertificationError, match="fails its certificate's signature"):
        verify_certified_key(signed, run_id="run b", party=1, ca=ca)
    with pytest.raises(KeyCertificationError, match="is signed for party 1"):
        verify_certified_key(signed, run_id="run a", party=2, ca=ca)
    forged = dataclasses.replace(signed, signature=signed.signature[:-1] + b"\x00")
    with pytest.raises(KeyCertificationError):
        verify_certified_key(forged, run_id="run a", party=1, ca=ca)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda p: p["mechanism"].update(beta=0.2),
            "mechanism.beta is 0.2 in the proposal, 0.15 in its configuration",
        ),
        (
            lambda p: p["protocol"].update(name="npq"),
            "protocol.name is 'npq' in the proposal, 'pbm' in its configuration",
        ),
        (
            lambda p: p.update(party_seeds="private"),
            "runtime.party_seeds='private', its configuration has seeds='derived'",
        ),
        (lambda p: p.update(seed=7), "seed=7 in the proposal, seed=0 in its configuration"),
        (lambda p: p["widths"].__setitem__(0, 99), "embedding width 99 in the proposal, 16"),
        (lambda p: p.update(party=1), "it addresses party 1 at this address, this is party 0"),
    ],
)
def test_a_party_refuses_a_proposal_that_differs_from_its_configuration(
    program, deployment, capsys, change, message
):
    """The party prints the refusal and returns it; the server raises the same line (exit 2)."""
    from vfl_lightning.run.outcome import exit_code
    from vfl_lightning.runtime.grpc_channel import ProposalRefused

    _, address = program
    proposal = proposals(deployment)[0]
    change(proposal)
    channel = PartyChannel(0, address, credentials(deployment / "certs", "server"), timeout_s=30)
    with pytest.raises(ProposalRefused) as refused:
        channel.call("Propose", {"proposal": proposal})
    channel.close()
    line = str(refused.value)
    assert line.startswith("party 0 refuses the proposal: ") and message in line, line
    assert line.endswith(f"({deployment / 'party_0.yaml'})") or "width" in line
    assert f"error: {line}" in capsys.readouterr().out.splitlines()
    assert exit_code(refused.value) == 2
