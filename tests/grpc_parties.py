"""Party programs for ``runtime=grpc`` tests: a development CA, one data file per party (exported
from the run's data), one configuration per party, and M ``python -m vfl_lightning.party serve``
processes on 127.0.0.1 with ephemeral ports, each stopped by its pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vfl_lightning.data.export import export
from vfl_lightning.mechanisms.certificates import write_development_ca
from vfl_lightning.party import write_party_config

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300


@dataclass
class PartyProcess:
    party: int
    config: Path
    port_file: Path
    log: Path
    process: subprocess.Popen | None = None
    port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
        command = [sys.executable, "-m", "vfl_lightning.party", "serve", "--config"]
        command += [str(self.config), "--port-file", str(self.port_file)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.config.parent
            )

    def wait_port(self, deadline: float) -> None:
        while not self.port_file.exists() or not self.port_file.read_text().strip():
            if self.process.poll() is not None:
                raise RuntimeError(f"party {self.party} exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"party {self.party} did not start: {self.log.read_text()}")
            time.sleep(0.1)
        self.port = int(self.port_file.read_text())

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        code = self.process.returncode
        self.process = None
        return code

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def output_with(self, text: str, timeout_s: float = 60.0) -> str:
        """Its output once it holds ``text`` (a line the program prints after it answered the
        server, which may come after the server's call returned), or as it is after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.output()


@dataclass
class Deployment:
    """M party programs and the server's overrides to reach them."""

    root: Path
    parties: list[PartyProcess] = field(default_factory=list)

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    def server_overrides(self, seeds: str = "derived") -> list[str]:
        addresses = ",".join(p.address for p in self.parties)
        return [
            "runtime=grpc",
            f"runtime.parties=[{addresses}]",
            f"runtime.certs={self.certs}",
            f"runtime.party_seeds={seeds}",
            "runtime.connect_timeout_s=60",
        ]

    def start(self, parties=None) -> None:
        chosen = self.parties if parties is None else [self.parties[m] for m in parties]
        for party in chosen:
            party.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        for party in chosen:
            party.wait_port(deadline)

    def stop(self) -> None:
        for party in self.parties:
            party.stop()


def make_deployment(
    root: Path,
    overrides: list[str],
    num_parties: int | None = None,
    *,
    seeds: str = "derived",
    idle_timeout_s: float = 60.0,
    wait_s: float | None = 600.0,
    certs: Path | None = None,
    policy: dict | None = None,
) -> Deployment:
    """Certificates (or those in ``certs``), data files and configurations for ``num_parties``
    (default: the data's) party programs of the run ``overrides`` describe (not started), each
    with ``policy`` in its file."""
    root.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(root)
    data = root / "data"
    manifest = export([*overrides, "logger=none"], data)
    if num_parties is None:
        num_parties = manifest.num_parties
    if certs is None:
        write_development_ca(deployment.certs, num_parties)
    else:
        os.symlink(certs, deployment.certs)
    for m in range(num_parties):
        folder = root / f"party_{m}"
        config = write_party_config(
            folder / "party.yaml",
            overrides,
            party=m,
            listen="127.0.0.1:0",
            certs=deployment.certs,
            data=data / f"party_{m}.npz",
            state_dir=folder / "state",
            seeds=seeds,
            idle_timeout_s=idle_timeout_s,
            wait_s=wait_s,
            policy=policy,
        )
        deployment.parties.append(PartyProcess(m, config, folder / "port", folder / "log.txt"))
    return deployment


@contextlib.contextmanager
def running(root: Path, overrides: list[str], num_parties: int | None = None, **options):
    """A started :class:`Deployment`, every party stopped at the end."""
    deployment = make_deployment(root, overrides, num_parties, **options)
    try:
        deployment.start()
        yield deployment
    finally:
        deployment.stop()


def session_of(root: Path, overrides: list[str], seeds: str = "private", policy=None):
    """Party 0's program and its session for the run ``overrides`` describe, built as the party
    program builds them from the server's proposal (run key ``0`` * 32), without a network, and
    aligned by the label holder's PSI through the session's ``Psi`` calls; ``policy``: the policy
    in its configuration file."""
    import torch
    from conftest import compose_config

    from vfl_lightning.errors import PartyRefusal
    from vfl_lightning.run.assemble import build
    from vfl_lightning.run.grpc_session import make_proposal
    from vfl_lightning.runtime.grpc_schema import SESSION, UNARY
    from vfl_lightning.runtime.party_config import read_party_config
    from vfl_lightning.runtime.party_program import PartyProgram

    def refused(call, *args) -> str:
        try:
            call(*args)
        except PartyRefusal as error:
            return str(error)
        raise AssertionError(f"{call} was not refused")

    write_development_ca(root / "certs", 2)  # party 1: a peer whose keys a test certifies
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
        policy=policy,
    )
    program = PartyProgram(read_party_config(config))
    cfg = compose_config(root / "server", *overrides)
    datamodule, module = build(cfg)
    proposing = compose_config(root / "server", *overrides, "runtime=grpc")
    proposing.runtime.party_seeds = seeds
    proposal = make_proposal(proposing, module, datamodule, "0" * 32)[0]
    program.propose({"proposal": proposal})
    program.proposal = proposal
    assert manifest.num_parties == module.num_parties
    session = program.session
    before = "it releases nothing before the PSI aligned its rows (Psi)"
    assert refused(session.rows, "train", torch.arange(2)).endswith(before)  # every release's
    if getattr(session, "strategy", None) != "fedvs":  # a coded client refuses every Send
        send = {"idx": torch.arange(2), "stage": "train", "round": 0}
        assert refused(session.send, send).endswith(before)
    # the PSI of the label holder with this party (the server's code), through Psi calls of the
    # session's runner: a call of the authenticated session stream, never a unary call
    assert "Psi" in SESSION and "Psi" not in UNARY
    assert "Psi" not in program.handlers().unary
    program.split_ids = {s: datamodule.split_index[s] for s in ("train", "val", "test")}
    sent = align(program)
    # a replayed message of the finished alignment (a new ALIGN too) is refused, rows unchanged
    aligned = {stage: x.clone() for stage, x in session.features.items()}
    run = program.open_session(session.session)
    for message in sent:
        assert "its alignment is finished" in refused(run, "Psi", {"message": message})
    assert all(torch.equal(aligned[s], session.features[s]) for s in aligned)
    return program, session


def align(program) -> list[bytes]:
    """The label holder's PSI with ``program``'s current session (the server's code, through
    ``Psi`` calls of the session's runner); the messages it sent."""
    from vfl_lightning.data.alignment import align_with_parties

    run, sent = program.open_session(program.session.session), []

    def exchange(messages: list[bytes]) -> list[bytes]:
        sent.append(messages[0])
        return [run("Psi", {"message": messages[0]})["message"]]

    report = align_with_parties(program.split_ids, exchange, 1)
    assert report.aligned_rows == sum(len(rows) for rows in program.split_ids.values())
    return sent


class Aborted(Exception):
    """How a party's service ended a stream: its gRPC status code and its one line."""

    def __init__(self, code, line: str) -> None:
        super().__init__(line)
        self.code, self.line = code, line


class ServerContext:
    """The context a party's handler sees for a call from the server's certificate."""

    def __init__(self, name: str) -> None:
        self.name = name

    def auth_context(self) -> dict:
        return {"x509_subject_alternative_name": [self.name.encode()]}

    def is_active(self) -> bool:
        return True

    def abort(self, code, line: str):
        raise Aborted(code, line)


def stream_calls(program, calls: list[tuple[str, dict]], session: str | None = None) -> list:
    """``calls`` ([(method, fields)]) as the server sends them on one stream of ``program``'s
    current session (or of ``session``), each in its own stream message, through the party's
    own service (frames, decoding, dispatch, refusal status): the decoded replies; a refusal or
    failure raises :class:`Aborted` with its status and line."""
    from vfl_lightning.runtime.grpc_channel import bundle, encode_call
    from vfl_lightning.runtime.grpc_schema import SESSION
    from vfl_lightning.wire.frames import decode_frame

    opened = session or program.session.session
    messages = [bundle([encode_call("Open", {"session": opened})])]
    messages += [bundle([encode_call(method, fields)]) for method, fields in calls]
    service = program.handlers()
    replies = list(service.stream(iter(messages), ServerContext(program.config.server_name)))
    answered = ["Open"] + [method for method, _ in calls if SESSION[method][1] is not None]
    return [
        decode_frame(reply, SESSION[method][1] or {}, method)
        for method, reply in zip(answered, replies, strict=True)
    ][1:]
