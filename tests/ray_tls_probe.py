"""Run by tests/test_ray_transport.py in a fresh process whose environment turns on Ray's TLS and
token authentication: starts Ray, probes its GCS port, trains through it, prints one JSON line.

Usage: python ray_tls_probe.py RUN_DIR TRAIN_OVERRIDES...
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import ray

ROOT = Path(__file__).resolve().parents[1]
# The HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its own
# SETTINGS frame (9-byte header, type byte 0x04 at offset 3).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


@ray.remote
class Doubler:
    def twice(self, value: int) -> int:
        return 2 * value


def first_frame(host: str, port: int, tls: ssl.SSLContext | None) -> str:
    """The hex of the first 9 bytes the server answers to the HTTP/2 preface, or the error."""
    try:
        with socket.create_connection((host, port), timeout=10) as raw:
            stream = raw if tls is None else tls.wrap_socket(raw, server_hostname="localhost")
            stream.sendall(HTTP2_PREFACE)
            return stream.recv(9).hex()
    except (OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def tls_context(with_client_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=os.environ["RAY_TLS_CA_CERT"])
    context.set_alpn_protocols(["h2"])
    if with_client_certificate:
        context.load_cert_chain(os.environ["RAY_TLS_SERVER_CERT"], os.environ["RAY_TLS_SERVER_KEY"])
    return context


def join(address: str, token: str) -> subprocess.CompletedProcess:
    """A second driver that tries to join the cluster with ``token``."""
    code = f"import ray; ray.init(address={address!r}); print('joined')"
    env = {**os.environ, "RAY_AUTH_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )


def main(run_dir: str, *overrides: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        doubled = ray.get(Doubler.remote().twice.remote(21))
        address = ray.get_runtime_context().gcs_address
        host, port = address.rsplit(":", 1)
        wrong = join(address, "0" * 64)
        train = subprocess.run(
            [
                sys.executable,
                str(ROOT / "train.py"),
                *overrides,
                "runtime=ray",
                f"runtime.address={address}",
                f"hydra.run.dir={run_dir}",
            ],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=ROOT,
        )
        report = {
            "doubled": doubled,
            "gcs_address": address,
            "tls_frame": first_frame(host, int(port), tls_context(True)),
            "plaintext_frame": first_frame(host, int(port), None),
            "no_client_certificate_frame": first_frame(host, int(port), tls_context(False)),
            "wrong_token_returncode": wrong.returncode,
            "wrong_token_refused_by_auth": "InvalidAuthToken" in wrong.stderr,
            "train_returncode": train.returncode,
            "train_tail": (train.stdout + train.stderr).strip().splitlines()[-5:],
        }
    finally:
        ray.shutdown()
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
