"""Ray's transport security, loopback only: a fresh Ray with mutual TLS (certificates made here)
and token authentication carries a training run; plaintext, certificate-less and wrong-token
clients are refused."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ROOT = Path(__file__).resolve().parents[1]
RUN = [
    "algo=npq",
    "data.num_parties=2",
    "data.partition=halves",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
]
QUIET = ["logger=none", "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_certificates(folder: Path) -> dict[str, str]:
    """A self-signed CA and one node certificate it signed (localhost and 127.0.0.1, used by Ray
    as server and client certificate); returns Ray's TLS environment variables."""
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {"not_valid_before": now - datetime.timedelta(minutes=5)}
    valid["not_valid_after"] = now + datetime.timedelta(hours=2)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder(**valid)
        .subject_name(_name("vfl_lightning test CA"))
        .issuer_name(_name("vfl_lightning test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    node_key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.DNSName("127.0.0.1")]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    node = (
        x509.CertificateBuilder(**valid)
        .subject_name(_name("ray node"))
        .issuer_name(ca.subject)
        .public_key(node_key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files = {
        "RAY_TLS_CA_CERT": (folder / "ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
        "RAY_TLS_SERVER_CERT": (folder / "node.crt", node.public_bytes(serialization.Encoding.PEM)),
        "RAY_TLS_SERVER_KEY": (
            folder / "node.key",
            node_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        ),
    }
    for path, content in files.values():
        path.write_bytes(content)
    os.chmod(files["RAY_TLS_SERVER_KEY"][0], 0o600)
    return {variable: str(path) for variable, (path, _) in files.items()}


@pytest.mark.slow
def test_tls_and_token_auth_carry_a_run_and_refuse_other_clients(tmp_path, make_cfg):
    from vfl_lightning.train import train

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= make_certificates(tmp_path)
    env |= {
        "RAY_USE_TLS": "1",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        # Ray's single-machine mode: every Ray address is 127.0.0.1 (nothing listens elsewhere)
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "WANDB_MODE": "disabled",
    }
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "tests" / "ray_tls_probe.py"), str(run_dir)]
    probe = subprocess.Popen(
        [*command, *RUN, *QUIET],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = probe.communicate(timeout=560)
    finally:
        if probe.poll() is None:
            os.killpg(probe.pid, signal.SIGKILL)
    assert probe.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["doubled"] == 42
    assert report["gcs_address"].startswith("127.0.0.1:")
    assert report["tls_frame"][6:8] == "04", report  # an HTTP/2 SETTINGS frame, over mutual TLS
    assert report["plaintext_frame"][6:8] != "04", report
    assert report["no_client_certificate_frame"][6:8] != "04", report
    assert report["wrong_token_returncode"] != 0 and report["wrong_token_refused_by_auth"]
    assert report["train_returncode"] == 0, report["train_tail"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["runtime"] == "ray" and results["status"] == "finished"
    local = train(make_cfg(*RUN))
    assert results["model_digest"] == local["model_digest"]
