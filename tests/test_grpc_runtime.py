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
    """The local run and the gRPC run of ``common``. Party programs hold their own rows, so the
    gRPC run always aligns them by the PSI: the local run does too (``data.psi=always``, which
    trains bit for bit as without it) and charges the same PSI bytes and simulated time."""
    local = train(compose_config(tmp_path / "local", *common, "data.psi=always"))
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
    # every party program holds its own rows: the PSI ran over the session streams, all 569 align
    assert remote["comm/psi_mb"] == local["comm/psi_mb"] > 0
    assert remote["data/aligned_rows"] == local["data/aligned_rows"] == 569
    counted = [
        f"privacy/party_{m}/{key}" for m in (0, 1) for key in ("feature_eps", "max_row_releases")
    ]
    assert set(counted) <= set(local) and remote["privacy/party_1/feature_eps"] > 0
    keys = ("comm/uplink_mb", "comm/downlink_mb", "comm/rounds", "time/simulated_s")
    for key in (*keys, "val/acc", "test/acc", *counted):
        assert remote[key] == local[key], key
    assert "comm/socket_mb" not in local
    ratio = remote["comm/socket_mb"] / remote["comm/total_mb"]
    assert 0.9 <= ratio <= 1.1, (remote["comm/socket_mb"], remote["comm/total_mb"])
    for party in deployment.parties:
        saved = list((party.config.parent / "state").rglob("round_*.pt"))
        assert saved, f"party {party.party} saved no state in its own directory"
        closed = f"party {party.party}: the server closed the run (finished)"
        assert closed in party.output_with(closed), party.output()


@pytest.mark.slow
def test_partial_overlap_over_grpc_aligns_by_the_psi_on_the_parties_channels(tmp_path):
    """Each party program holds its own rows (its file, its order, 60 % shared); the server runs
    the PSI over the parties' authenticated streams (Psi calls) and trains the local run's model
    on the same aligned rows."""
    common = ["algo=splitnn", "data.num_parties=2", "data.partition=halves", "data.overlap=0.6"]
    common += ["trainer.max_epochs=1", "data.batch_size=64"]
    local = train(compose_config(tmp_path / "local", *common))
    with running(tmp_path / "deployment", common, num_parties=2) as deployment:
        remote = train(compose_config(tmp_path / "server", *common, *deployment.server_overrides()))
    assert remote["status"] == "finished" and remote["runtime"] == "grpc"
    assert remote["model_digest"] == local["model_digest"]
    for key in ("data/aligned_rows", "comm/psi_mb", "time/simulated_s", "test/acc"):
        assert remote[key] == local[key], key
    assert remote["data/aligned_rows"] == round(0.6 * 1797)
