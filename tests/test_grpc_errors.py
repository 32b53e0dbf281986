"""runtime=grpc's bad inputs on both sides, each one ``error:`` line and exit 2: on the party's
(its configuration file, its certificate, its address, its port) and on the server's (its
certificates folder, the parties' addresses)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

pytest.importorskip("grpc")

from vfl_lightning import cli  # noqa: E402
from vfl_lightning.data.export import export  # noqa: E402
from vfl_lightning.mechanisms.certificates import write_development_ca  # noqa: E402
from vfl_lightning.party import main as party_main  # noqa: E402
from vfl_lightning.party import write_party_config  # noqa: E402

OVERRIDES = ["algo=npq", "data=breast_cancer", "data.num_parties=2"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc_errors")
    write_development_ca(root / "certs", 2)
    export(OVERRIDES, root / "data")
    write_party_config(
        root / "party.yaml",
        OVERRIDES,
        party=0,
        listen="127.0.0.1:0",
        certs=root / "certs",
        data=root / "data" / "party_0.npz",
        state_dir=root / "state",
    )
    return root


def party_error(capsys, argv) -> str:
    code = party_main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, lines)
    return lines[0]


def edited(files, tmp_path, old: str, new: str):
    text = (files / "party.yaml").read_text()
    assert old in text
    path = tmp_path / "party.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_a_missing_party_configuration_is_one_line(capsys, tmp_path):
    line = party_error(capsys, ["serve", "--config", str(tmp_path / "nowhere.yaml")])
    assert line.startswith(f"error: --config {tmp_path / 'nowhere.yaml'} does not exist")


def test_an_unreadable_party_configuration_is_one_line(capsys, tmp_path):
    path = tmp_path / "party.yaml"
    path.write_text("party: [unclosed\n")
    assert "cannot be read as a YAML mapping" in party_error(
        capsys, ["serve", "--config", str(path)]
    )
    path.write_text("- a list\n")
    assert "must hold a YAML mapping" in party_error(capsys, ["serve", "--config", str(path)])


def test_an_unknown_key_in_a_party_configuration_is_one_line(capsys, files, tmp_path):
    path = edited(files, tmp_path, "threads: 1", "threads: 1\nthread: 2")
    line = party_error(capsys, ["serve", "--config", str(path)])
    assert "unknown key(s) ['thread']" in line


def test_a_missing_certificate_is_one_line(capsys, files, tmp_path):
    path = edited(files, tmp_path, "party_0.pem", "party_9.pem")
    line = party_error(capsys, ["serve", "--config", str(path)])
    assert line.startswith("error: tls.cert=") and "party_9.pem cannot be read" in line


def test_a_wrong_listen_address_is_one_line(capsys, files, tmp_path):
    path = edited(files, tmp_path, "listen: 127.0.0.1:0", "listen: localhost")
    line = party_error(capsys, ["serve", "--config", str(path)])
    assert line == f"error: {path}: listen='localhost' must be host:port (e.g. 127.0.0.1:50051)"


def test_a_port_in_use_is_one_line(capsys, files, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        path = edited(files, tmp_path, "listen: 127.0.0.1:0", f"listen: 127.0.0.1:{port}")
        line = party_error(capsys, ["serve", "--config", str(path)])
    finally:
        taken.close()
    assert line.startswith(f"error: listen=127.0.0.1:{port} cannot be bound")
    assert "the port is in use" in line


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "state_dir: {files}/state",
            "state_dir: /etc/hostname/state",
            r"state_dir=/etc/hostname/state cannot be used: \[Errno 20\] Not a directory: "
            r"'/etc/hostname/state'; choose a directory this program can create and write",
        ),
        (
            "embedding_dim: 16",
            "embedding_dim: -3",
            r"model.embedding_dim must be an integer >= 1, ",
        ),
        (
            "embedding_dim: 16",
            "embedding_dim: 16\n  embeding_dim: 8",
            r"model.embeding_dim is not a config key \(model \(vfl_lightning.models.MLPEncoder\) "
            r"takes .*embedding_dim.*\); check the spelling of 'embeding_dim', or drop it from "
            r"this file$",
        ),
        (
            "vfl_lightning.models.MLPEncoder",
            "os.system",
            r"model._target_=os.system is a builtin_function_or_method, not a subclass of "
            r"torch.nn.Module: name one there",
        ),
        ("lr: 0.01", "lr: fast", r"optimizer.lr must be a finite number >= 0, got 'fast'$"),
        ("fusion: sum", "fusion: sum\n  beta: 0.1", r"mechanism.beta is not a config key"),
        (
            "vfl_lightning.algorithms.SyncVFL",
            "vfl_lightning.algorithms.Nope",
            r"protocol._target_=vfl_lightning.algorithms.Nope cannot be imported \(module "
            r"'vfl_lightning.algorithms' has no attribute 'Nope'\)",
        ),
        (
            "name: npq",
            "name: npq\n  server_lr: 0.5",
            r"protocol.server_lr=0.5 is the server's setting \(train.py's algo.server_lr\), which "
            r"no party agrees to or checks: drop it from this file \(a party's protocol node "
            r"takes _target_, name\)$",
        ),
        (
            "listen: 127.0.0.1:0",
            "listen: nohost.invalid:0",
            r"listen=nohost.invalid:0: the host 'nohost.invalid' does not resolve .*: listen on "
            r"this machine's address or name, or 0.0.0.0:0 \(every address\)$",
        ),
        (
            "listen: 127.0.0.1:0",
            "listen: 192.0.2.1:0",
            r"listen=192.0.2.1:0 cannot be bound \(Cannot assign requested address\): the address "
            r"is not this machine's",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 40 else None,
)
def test_a_bad_party_setting_is_one_line_before_it_listens(
    capsys, monkeypatch, files, tmp_path, old, new, message
):
    """Each node by train.py's rules, the protocol's settings, the state directory and the listen
    address: refused before the program listens (its start would print the listening line)."""
    from vfl_lightning.runtime import party_program

    def start(*args, **kwargs):
        raise AssertionError("the party program started listening")

    monkeypatch.setattr(party_program.PartyProgram, "start", start)
    path = edited(files, tmp_path, old.format(files=files), new)
    line = party_error(capsys, ["serve", "--config", str(path)])
    assert line.startswith(f"error: {path}: ") or line.startswith("error: listen="), line
    assert re.search(message, line), line


def test_a_data_file_that_is_not_an_npz_of_arrays_names_the_export_command(capsys, files, tmp_path):
    (tmp_path / "rows.csv").write_text("id,a\n1,2\n")
    path = edited(files, tmp_path, f"data: {files}/data/party_0.npz", f"data: {tmp_path}/rows.csv")
    line = party_error(capsys, ["serve", "--config", str(path)])
    assert line.startswith(f"error: data={tmp_path}/rows.csv cannot be read as a numpy .npz file")
    assert line.endswith("python -m vfl_lightning.data.export writes one (ids and x)"), line


@pytest.mark.parametrize(
    "overrides",
    [
        *([f"algo={path.stem}"] for path in sorted((ROOT / "conf" / "algo").glob("*.yaml"))),
        ["experiment=fedvs_digits"],
        ["experiment=fedbcd_mnist_cnn"],
        ["algo=pbm", "party=cnn", "optimizer=adam"],
    ],
    ids=" ".join,
)
def test_what_init_writes_passes_the_checks_of_serve(tmp_path, overrides):
    from vfl_lightning.run.party_checks import checked

    path = write_party_config(
        tmp_path / "party.yaml",
        overrides,
        party=0,
        listen="127.0.0.1:0",
        certs=tmp_path,
        data=tmp_path / "party_0.npz",
        state_dir=tmp_path / "state",
    )
    config = checked(path)
    assert config.protocol["_target_"] and "transcript_size" not in config.protocol


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["algo=foo"],
            "error: algo=foo is not an option of algo: the options are cascade, fedbcd, ",
        ),
        (
            ["algo=pbm", "mechanism.beta=abc"],
            "error: mechanism.beta must be a number in (0, 0.25] for PBM, got 'abc'",
        ),
        (
            ["party.embedding_dim=-3"],
            "error: party.embedding_dim must be an integer >= 1, got -3",
        ),
        (["--party", "-1"], "error: --party=-1 must be the party's index, an integer >= 0"),
        (
            ["--out", "/etc/hostname/party.yaml"],
            "error: --out=/etc/hostname/party.yaml cannot be written: [Errno 17] File exists: "
            "'/etc/hostname'",
        ),
    ],
    ids=" ".join,
)
def test_init_refuses_what_serve_or_train_py_would_in_one_line(capsys, tmp_path, argv, line):
    """``init`` checks the overrides' nodes as train.py does (a file it writes is one serve
    accepts) and names its own flags; Hydra's errors are worded as train.py words them."""
    flags = {"--party": "0", "--out": str(tmp_path / "party.yaml")}
    overrides = [a for a in argv if "=" in a]
    given = dict(zip(argv[::2], argv[1::2], strict=False)) if not overrides else {}
    flags |= {k: v for k, v in given.items() if k.startswith("--")}
    command = ["init", "--listen", "127.0.0.1:0", "--certs", str(tmp_path), "--data"]
    command += [str(tmp_path / "d.npz"), "--state-dir", str(tmp_path / "state")]
    for flag, value in flags.items():
        command += [flag, value]
    found = party_error(capsys, [*command, *overrides])
    assert found.startswith(line), found
    assert not (tmp_path / "party.yaml").exists()


def test_the_certificate_command_names_an_out_folder_it_cannot_make(capsys):
    line = party_error(capsys, ["certs", "--out", "/etc/hostname/certs", "--parties", "2"])
    assert line == (
        "error: --out=/etc/hostname/certs cannot be written: [Errno 20] Not a directory: "
        "'/etc/hostname/certs'"
    )


def test_the_certificate_command_refuses_no_parties(capsys, tmp_path):
    line = party_error(capsys, ["certs", "--out", str(tmp_path), "--parties", "0"])
    assert line == "error: --parties=0 and --days=365 must be integers >= 1"


def server_error(make_cfg, capsys, monkeypatch, *overrides) -> str:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    cfg = make_cfg(*OVERRIDES, "runtime=grpc", *overrides)
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_server_without_certificates_is_one_line(make_cfg, capsys, monkeypatch, tmp_path):
    line = server_error(
        make_cfg,
        capsys,
        monkeypatch,
        "runtime.parties=[127.0.0.1:1,127.0.0.1:2]",
        f"runtime.certs={tmp_path}",
    )
    assert line == (
        f"error: runtime.certs={tmp_path} lacks ['ca.pem', 'server.pem', 'server.key']: it must "
        "hold ca.pem (the deployment's CA), server.pem and server.key"
    )


@pytest.mark.parametrize(
    ("parties", "message"),
    [
        ("[]", "runtime.parties=[] must list each party program's host:port in party order"),
        ("[localhost]", "runtime.parties[0]='localhost' must be host:port"),
        ("[127.0.0.1:1,127.0.0.1:1]", "lists an address twice"),
    ],
)
def test_server_with_bad_party_addresses_is_one_line(
    make_cfg, capsys, monkeypatch, files, parties, message
):
    line = server_error(
        make_cfg, capsys, monkeypatch, f"runtime.parties={parties}", f"runtime.certs={files}/certs"
    )
    assert message in line


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["runtime.parties=[nohost.invalid:1,127.0.0.1:2]"],
            r"^error: runtime.parties\[0\]=nohost.invalid:1: the host 'nohost.invalid' does not "
            r"resolve \(.*\): write party 0's program address as host:port",
        ),
        (
            ["runtime.parties=[127.0.0.1:1,127.0.0.1:2]", "+runtime.conect_timeout_s=5"],
            r"^error: runtime.conect_timeout_s is not a config key \(runtime=grpc takes "
            r"call_timeout_s, certs, connect_timeout_s, .*\); check the spelling",
        ),
        # the count is compared before the server waits for any party (none listens here)
        (
            [
                "runtime.parties=[127.0.0.1:1,127.0.0.1:2,127.0.0.1:3]",
                "runtime.connect_timeout_s=20",
            ],
            r"^error: runtime.parties lists 3 party programs, the data has 2 parties: list one "
            r"host:port per party$",
        ),
    ],
)
def test_server_with_a_wrong_runtime_setting_is_one_line(
    make_cfg, capsys, monkeypatch, files, overrides, message
):
    line = server_error(make_cfg, capsys, monkeypatch, *overrides, f"runtime.certs={files}/certs")
    assert re.search(message, line), line


def test_a_policy_on_the_server_command_is_one_line(make_cfg, capsys, monkeypatch, files):
    """Each party program enforces the policy of its own file: the server's is refused, not
    silently dropped."""
    line = server_error(
        make_cfg,
        capsys,
        monkeypatch,
        "runtime.parties=[127.0.0.1:1,127.0.0.1:2]",
        f"runtime.certs={files}/certs",
        "policy.max_releases_per_row=3",
    )
    assert line == (
        "error: policy.max_releases_per_row=3 cannot be set on the server under runtime=grpc: "
        "each party program enforces the policy of its own configuration file; set "
        "max_releases_per_row under policy: in each party's file (docs/deploy.md) and drop the "
        "override"
    )


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        (
            "canary_message",
            "(data.canaries.canary_message.level=message) cannot run under runtime=grpc: message "
            "canaries go into a party's own releases",
        ),
        (
            "canary_label",
            "(data.canaries.canary_label.level=label) cannot run under runtime=grpc: its "
            "canaries are written into the built-in dataset's training rows",
        ),
    ],
)
def test_a_canary_audit_is_one_line(make_cfg, capsys, monkeypatch, files, audit, message):
    """Message canaries go into a party's releases, and a party program takes no setting from
    the server; label (and feature) canaries go into the built-in data, while a gRPC run aligns
    the party programs' own rows by the PSI: both refused before anything is built."""
    line = server_error(
        make_cfg,
        capsys,
        monkeypatch,
        "runtime.parties=[127.0.0.1:1,127.0.0.1:2]",
        f"runtime.certs={files}/certs",
        "algo=ldp",
        f"audit={audit}",
        f"audit.{audit}.count=20",
    )
    assert line.startswith(f"error: audit={audit} {message}"), line
    assert line.endswith("audit runtime=local or runtime=ray")


def test_server_with_a_certificate_of_another_ca_is_one_line(
    make_cfg, capsys, monkeypatch, files, tmp_path
):
    write_development_ca(tmp_path / "other", 2)
    (tmp_path / "mixed").mkdir()
    for name, source in (("ca.pem", files / "certs"), ("server.pem", tmp_path / "other")):
        (tmp_path / "mixed" / name).write_bytes((source / name).read_bytes())
    (tmp_path / "mixed" / "server.key").write_bytes(
        (tmp_path / "other" / "server.key").read_bytes()
    )
    line = server_error(
        make_cfg,
        capsys,
        monkeypatch,
        "runtime.parties=[127.0.0.1:1,127.0.0.1:2]",
        f"runtime.certs={tmp_path / 'mixed'}",
    )
    assert line == (
        f"error: runtime.certs={tmp_path / 'mixed' / 'server.pem'} is not signed by the CA "
        f"runtime.certs={tmp_path / 'mixed' / 'ca.pem'}: use a certificate of the deployment's CA"
    )


def test_runtime_grpc_without_grpcio_says_how_to_install_it(make_cfg, monkeypatch, files):
    import sys

    from vfl_lightning.errors import ConfigError
    from vfl_lightning.run.grpc_session import GrpcRuntime

    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError
    cfg = make_cfg(
        *OVERRIDES,
        "runtime=grpc",
        "runtime.parties=[127.0.0.1:1,127.0.0.1:2]",
        f"runtime.certs={files}/certs",
    )
    with pytest.raises(ConfigError, match=r"^runtime=grpc needs grpcio, which is not installed"):
        GrpcRuntime().start(cfg)


def test_the_runtime_keys_the_server_accepts_are_those_of_its_config_file():
    """``runtime=grpc`` refuses a key outside ``SETTINGS``; the list is the config file's keys, so
    a key added to conf/runtime/grpc.yaml and not to ``SETTINGS`` would refuse every run."""
    import yaml

    from vfl_lightning.run.grpc_session import SETTINGS

    shipped = yaml.safe_load((Path(__file__).parents[1] / "conf/runtime/grpc.yaml").read_text())
    assert sorted(SETTINGS) == sorted(set(shipped) - {"_target_"})
