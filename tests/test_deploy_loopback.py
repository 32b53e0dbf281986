"""scripts/deploy_loopback.sh, as a user runs it: certificates, 4 party programs and the server on
127.0.0.1 for algo=pbm on digits, each party with its own configuration and state directory;
the script exits with the server's status and leaves results.json in RUN_DIR/server/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_loopback_deployment_trains_and_stops_its_parties(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHON=sys.executable, WANDB_MODE="disabled")
    done = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "deploy_loopback.sh"),
            str(run_dir),
            "trainer.max_epochs=2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run_dir / "server" / "results.json").read_text())
    assert results["status"] == "finished" and results["runtime"] == "grpc"
    assert results["comm/rounds"] == 80 and 0 < results["val/acc"] <= 1
    for m in range(4):
        party = run_dir / f"party_{m}"
        assert list((party / "state").rglob("round_*.pt")), f"party {m} kept no state"
        assert sorted(p.name for p in (party / "tls").iterdir()) == [
            "ca.pem",
            f"party_{m}.key",
            f"party_{m}.pem",
        ]
        log = (party / "log.txt").read_text()
        assert f"party {m}: the server closed the run" in log, log
    assert sorted(p.name for p in (run_dir / "server" / "certs").iterdir()) == [
        "ca.pem",
        "server.key",
        "server.pem",
    ]


def test_the_loopback_deployment_refuses_a_used_directory(tmp_path):
    (tmp_path / "taken").write_text("")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "deploy_loopback.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: RUN_DIR={tmp_path} exists and is not empty; choose a new directory"
    )
