"""How long an idle party program takes to exit after SIGTERM: ``python -m vfl_lightning.party
serve`` on 127.0.0.1 (npq, breast_cancer, 2 parties, a development CA), stopped while it waits
for a server (no session) and while a session's stream is open but the server is quiet (after
the proposal and the key agreement). Each party is started, given a moment, sent SIGTERM; the
seconds from the signal to the process's exit are printed per case (every party of every
repeat), with their median, and the exit codes (0 expected).

    python bench/party_stop.py                 # 3 repeats of each case
    python bench/party_stop.py --repeats 10
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("WANDB_MODE", "disabled")

OVERRIDES = ["algo=npq", "data=breast_cancer", "data.num_parties=2"]


def stop_seconds(party) -> tuple[float, int]:
    """(seconds from SIGTERM to the exit of ``party``'s process, its exit code)."""
    process = party.process
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(120)
    party.process = None
    return time.monotonic() - start, process.returncode


def proposals(root: Path) -> list[dict]:
    from conftest import compose_config

    from vfl_lightning.run.assemble import build
    from vfl_lightning.run.grpc_session import make_proposal

    cfg = compose_config(root / "server", *OVERRIDES)
    datamodule, module = build(cfg)
    cfg.runtime.party_seeds = "derived"
    return make_proposal(cfg, module, datamodule, "0" * 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from grpc_parties import make_deployment

    from vfl_lightning.mechanisms.certificates import Credentials
    from vfl_lightning.runtime.grpc_channel import PartyChannel
    from vfl_lightning.runtime.grpc_parties import GrpcParties

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        deployment = make_deployment(root / "parties", OVERRIDES, 2)
        certs = deployment.certs
        server = Credentials.from_files(
            certs / "ca.pem", certs / "server.pem", certs / "server.key", settings=("", "", "")
        )
        proposed = proposals(root)
        cases: dict[str, list[tuple[float, int]]] = {"no session": [], "idle session": []}
        for _ in range(args.repeats):
            deployment.start()
            time.sleep(0.5)
            cases["no session"] += [stop_seconds(party) for party in deployment.parties]
            deployment.start()
            channels = [
                PartyChannel(m, party.address, server, timeout_s=30)
                for m, party in enumerate(deployment.parties)
            ]
            parties = GrpcParties(channels, proposed)
            time.sleep(0.5)
            cases["idle session"] += [stop_seconds(party) for party in deployment.parties]
            with contextlib.suppress(Exception):  # the parties are gone: the server's end only
                parties.close()
        for case, results in cases.items():
            seconds = [s for s, _ in results]
            codes = sorted({code for _, code in results})
            listed = ", ".join(f"{s:.2f}" for s in seconds)
            print(
                f"{case:12}: median {statistics.median(seconds):.2f} s to exit after SIGTERM "
                f"({listed}); exit codes {codes}"
            )


if __name__ == "__main__":
    main()
