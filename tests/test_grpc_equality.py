"""runtime=grpc with derived seeds is the local run bit for bit, for every protocol family: the
server and M party programs on 127.0.0.1 (test certificates, ephemeral ports); and the bytes on
the server's sockets are the ledger's within 10 % for pbm, npq and splitnn (slow; pbm with two
parties in the default suite, tests/test_grpc_runtime.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")

from test_grpc_runtime import run_both  # noqa: E402

SHORT = ["trainer.max_epochs=2", "trainer.limit_train_batches=6", "trainer.limit_val_batches=2"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["algo=pbm", "data.batch_size=64"],
        ["algo=npq", "data.batch_size=64"],
        ["algo=splitnn", "data.batch_size=64"],
        ["algo=fedbcd", "trainer.max_steps=60"],
        ["experiment=cascade_digits"],
        ["experiment=fedvs_digits"],
        ["algo=npq", "data.active_party=true"],
    ],
    ids=["pbm", "npq", "splitnn", "fedbcd", "cascade", "fedvs", "active_party"],
)
def test_grpc_with_derived_seeds_is_the_local_run(tmp_path, overrides):
    local, remote, _ = run_both(tmp_path, [*overrides, *SHORT])
    assert remote["status"] == "finished" and remote["runtime"] == "grpc"
    assert remote["model_digest"] == local["model_digest"]
    for key in ("comm/uplink_mb", "comm/downlink_mb", "comm/rounds", "time/simulated_s"):
        assert remote[key] == local[key], key
    if overrides[0] in ("algo=pbm", "algo=npq", "algo=splitnn"):
        ratio = remote["comm/socket_mb"] / remote["comm/total_mb"]
        assert 0.9 <= ratio <= 1.1, (remote["comm/socket_mb"], remote["comm/total_mb"])


@pytest.mark.slow
def test_cascade_with_private_seeds_takes_messages_as_they_arrive(tmp_path):
    """Private seeds: every client of a batch is asked at once and answered as its message
    arrives; the ledger's counts are the local run's (its bits do not depend on the order)."""
    from conftest import compose_config
    from grpc_parties import running

    from vfl_lightning.train import train

    common = ["experiment=cascade_digits", *SHORT]
    local = train(compose_config(tmp_path / "local", *common))
    with running(tmp_path / "deployment", common, seeds="private") as deployment:
        overrides = deployment.server_overrides(seeds="private")
        remote = train(compose_config(tmp_path / "server", *common, *overrides))
    assert remote["status"] == "finished"
    for key in ("comm/uplink_mb", "comm/downlink_mb", "comm/rounds"):
        assert remote[key] == local[key], key
    assert remote["model_digest"] != local["model_digest"]  # the directions are the parties' own


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["fedvs_wait", "fedvs_wait_dp"])
def test_fedvs_baselines_run_with_the_local_clock(tmp_path, algo):
    local, remote, _ = run_both(tmp_path, ["experiment=fedvs_digits", f"algo={algo}", *SHORT])
    assert remote["status"] == "finished"
    assert remote["time/simulated_s"] == local["time/simulated_s"]
    assert remote["comm/uplink_mb"] == local["comm/uplink_mb"]
    if algo == "fedvs_wait":  # no noise: the same arithmetic as the local runtime
        assert remote["model_digest"] == local["model_digest"]
    else:  # each client adds its own noise and never sends the clean embedding
        assert remote["fedvs/dp_sigma"] == local["fedvs/dp_sigma"] > 1
        assert "val/acc_clean" in local and "val/acc_clean" not in remote
