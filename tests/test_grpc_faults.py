"""runtime=grpc's faults, each with a bounded answer in one line: a party killed in a run (then
restarted, it resumes from its own state and the run ends as the uninterrupted one), a party that
is not up when the server starts, and a server that disappears."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import lightning as L
import pytest

pytest.importorskip("grpc")

from conftest import compose_config  # noqa: E402
from grpc_parties import make_deployment  # noqa: E402

from vfl_lightning import cli  # noqa: E402
from vfl_lightning.errors import PartyLost  # noqa: E402
from vfl_lightning.mechanisms.certificates import Credentials  # noqa: E402
from vfl_lightning.runtime.grpc_channel import PartyChannel  # noqa: E402
from vfl_lightning.runtime.grpc_parties import GrpcParties  # noqa: E402
from vfl_lightning.runtime.party_config import read_party_config  # noqa: E402
from vfl_lightning.runtime.party_program import PartyProgram  # noqa: E402
from vfl_lightning.train import train  # noqa: E402

TWO_PARTIES = ["data=breast_cancer", "data.num_parties=2"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_party_not_up_is_one_line_after_a_bounded_wait(make_cfg, capsys, monkeypatch, tmp_path):
    from vfl_lightning.mechanisms.certificates import write_development_ca

    write_development_ca(tmp_path / "certs", 2)
    ports = [free_port(), free_port()]
    cfg = make_cfg(
        "algo=npq",
        *TWO_PARTIES,
        "runtime=grpc",
        f"runtime.parties=[127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}]",
        f"runtime.certs={tmp_path / 'certs'}",
        "runtime.connect_timeout_s=1",
    )
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    started = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 2 and time.monotonic() - started < 60
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(
        f"error: runtime.parties[0]=127.0.0.1:{ports[0]}: party 0 is not reachable over mutual "
        "TLS within runtime.connect_timeout_s=1 ("
    )
    assert line.endswith(
        "): start party 0's program there (its certificate must name party-0, from the CA in "
        "runtime.certs), or correct the address"
    )
    results = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == line.removeprefix("error: ")


def digest_of(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*.pt"))
    }


def test_a_gone_server_lets_the_party_exit_after_its_timeout_with_its_state_intact(tmp_path, capfd):
    """The server saves a state, then vanishes (its streams and channel drop, no Close): the
    party exits with one line after ``idle_timeout_s``, its state file untouched."""

    overrides = ["algo=npq", *TWO_PARTIES]
    deployment = make_deployment(tmp_path, overrides, 2, idle_timeout_s=1.0)
    programs = [PartyProgram(read_party_config(p.config)) for p in deployment.parties]
    server = Credentials.from_files(
        *(deployment.certs / name for name in ("ca.pem", "server.pem", "server.key")),
        settings=("a", "b", "c"),
    )
    channels = [
        PartyChannel(m, f"127.0.0.1:{program.start()}", server, timeout_s=30)
        for m, program in enumerate(programs)
    ]
    try:
        parties = GrpcParties(channels, proposals_for(tmp_path, overrides))
        parties.state_dict()
        state = tmp_path / "party_0" / "state"
        saved = digest_of(state)
        assert saved
        parties.stopping.set()
        for stream in parties.streams:
            stream.drop()
        for channel in channels:
            channel.close()
        started = time.monotonic()
        assert programs[0].wait() == 1
        assert time.monotonic() - started < 30
        assert digest_of(state) == saved
        errors = [line for line in capfd.readouterr().err.splitlines() if "error:" in line]
        assert errors[0] == (
            f"error: party 0: no call from the server for 1 s (idle_timeout_s); the server is "
            f"gone. Its state in {state} is intact: restart this program to resume"
        )
    finally:
        for program in programs:
            program.stop(0, "")
            program.wait()


def proposals_for(tmp_path: Path, overrides: list[str]) -> list[dict]:
    from vfl_lightning.run.assemble import build
    from vfl_lightning.run.grpc_session import make_proposal

    cfg = compose_config(tmp_path / "server", *overrides)
    datamodule, module = build(cfg)
    cfg.runtime.party_seeds = "derived"
    return make_proposal(cfg, module, datamodule, "0" * 32)


class KillParty(L.Callback):
    """SIGKILL to the party process ``pid`` before batch ``batch`` of epoch ``epoch`` (after the
    last checkpoint reached disk)."""

    def __init__(self, pid: int, epoch: int, batch: int) -> None:
        self.pid, self.epoch, self.batch = pid, epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            wait = getattr(trainer.strategy.checkpoint_io, "wait", None)
            if wait is not None:
                wait()
            os.kill(self.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_party_stops_the_run_in_one_line_and_resumes_to_the_straight_run(tmp_path):
    common = ["algo=pbm", *TWO_PARTIES, "trainer.max_epochs=2", "trainer.limit_train_batches=4"]
    expected = train(compose_config(tmp_path / "straight", *common))
    deployment = make_deployment(tmp_path / "deployment", common, 2)
    try:
        deployment.start()
        victim = deployment.parties[1]
        kill = [
            "+callbacks.kill._target_=test_grpc_faults.KillParty",
            f"+callbacks.kill.pid={victim.process.pid}",
            "+callbacks.kill.epoch=1",
            "+callbacks.kill.batch=2",
        ]
        killed_dir = tmp_path / "killed"
        killed_cfg = compose_config(killed_dir, *common, *deployment.server_overrides(), *kill)
        with pytest.raises(PartyLost) as lost:
            train(killed_cfg)
        line = str(lost.value)
        assert "\n" not in line
        assert line.startswith(f"party 1 at {victim.address} is lost (Send: UNAVAILABLE")
        assert "at training round 6 (Send); the run stopped, its last checkpoint is intact" in line
        checkpoint = killed_dir / "checkpoints" / "last.ckpt"
        assert line.endswith(f"restart the party program and resume with ckpt_path={checkpoint}")
        results = json.loads((killed_dir / "results.json").read_text())
        assert results["status"] == "failed" and results["error"] == line
        closed = "party 0: the server closed the run (failed)"
        assert closed in deployment.parties[0].output_with(closed)
        assert victim.stop() == -signal.SIGKILL
        deployment.start([1])  # the party program again: same configuration, new port
        resumed_cfg = compose_config(
            tmp_path / "resumed", *common, *deployment.server_overrides(), f"ckpt_path={checkpoint}"
        )
        resumed = train(resumed_cfg)
    finally:
        deployment.stop()
    assert resumed["status"] == "finished"
    assert resumed["model_digest"] == expected["model_digest"]
    assert resumed["comm/total_mb"] == expected["comm/total_mb"]
