"""runtime=grpc end to end: the server (train(cfg) here) and M party programs on 127.0.0.1 with
test certificates and ephemeral ports; with derived seeds the run is the local run bit for bit,
and the bytes on the server's sockets are the ledger's within 10 %."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")

from conftest import compose_config  # noqa: E402
from grpc_parties import running  # noqa: E402

from vfl_lightning.train import train  # noqa: E402


def run_both(tmp_path, common: list[str]) -> tuple[dict, dict, object]:
    local = train(compose_config(tmp_path / "local", *common))
    with running(tmp_path / "deployment", common) as deployment:
        remote = train(compose_config(tmp_path / "server", *common, *deployment.server_overrides()))
    return local, remote, deployment


def test_pbm_over_grpc_is_the_local_run_and_its_sockets_carry_the_ledger(tmp_path):
    """Two party programs (4 on digits: tests/test_grpc_equality.py, slow)."""
    common = ["algo=pbm", "data=breast_cancer", "data.num_parties=2", "trainer.max_epochs=2"]
    local, remote, deployment = run_both(tmp_path, [*common, "data.batch_size=64"])
    assert len(deployment.parties) == 2
    assert remote["status"] == "finished" and remote["runtime"] == "grpc"
    assert remote["model_digest"] == local["model_digest"]
    for key in ("comm/uplink_mb", "comm/downlink_mb", "comm/rounds", "val/acc", "test/acc"):
        assert remote[key] == local[key], key
    assert "comm/socket_mb" not in local
    ratio = remote["comm/socket_mb"] / remote["comm/total_mb"]
    assert 0.9 <= ratio <= 1.1, (remote["comm/socket_mb"], remote["comm/total_mb"])
    for party in deployment.parties:
        saved = list((party.config.parent / "state").rglob("round_*.pt"))
        assert saved, f"party {party.party} saved no state in its own directory"
