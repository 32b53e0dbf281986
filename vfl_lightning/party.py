"""The party program of ``runtime=grpc``, each party its own process on its own machine:

    python -m vfl_lightning.party serve --config party_0.yaml [--port-file FILE]
    python -m vfl_lightning.party init --party 0 --listen HOST:PORT --certs DIR --data FILE
        --state-dir DIR --out party_0.yaml [--seeds derived] [train.py overrides, e.g. algo=pbm]
    python -m vfl_lightning.party certs --out DIR --parties 4

``serve`` runs the party from its own configuration (docs/deploy.md); ``init`` writes such a
configuration from the library's configs (the protocol, model, optimizer and mechanism the
overrides choose); ``certs`` makes a development CA with a server certificate and one per party.
A bad input is one ``error:`` line and exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def write_party_config(
    out: Path,
    overrides: list[str],
    *,
    party: int,
    listen: str,
    certs: Path,
    data: Path,
    state_dir: Path,
    seeds: str = "private",
    server_name: str | None = None,
    idle_timeout_s: float = 120.0,
    wait_s: float | None = None,
    once: bool = False,
    policy: dict | None = None,
) -> Path:
    """Write party ``party``'s configuration to ``out``: the protocol, model, optimizer and
    mechanism that train.py's ``overrides`` choose, its own files (``certs``: a folder of
    ``ca.pem`` and ``party_<m>.pem``/``.key``), with ``seeds=derived`` the overrides' seed, and
    its privacy policy: every setting of :class:`~vfl_lightning.algorithms.party_policy.
    PartyPolicy`, the defaults (which cap nothing) where ``policy`` does not set one."""
    from omegaconf import OmegaConf

    from vfl_lightning.algorithms.party_policy import PartyPolicy
    from vfl_lightning.data.export import compose_run_config
    from vfl_lightning.errors import ConfigError
    from vfl_lightning.mechanisms.certificates import SERVER_NAME, party_files
    from vfl_lightning.run.early import check_run_config
    from vfl_lightning.run.key_index import locate
    from vfl_lightning.run.schema import (
        check_target_node,
        check_values,
        config_dirs,
        shipped_defaults,
    )
    from vfl_lightning.runtime.party_config import check_address

    if isinstance(party, bool) or not isinstance(party, int) or party < 0:
        raise ConfigError(f"--party={party!r} must be the party's index, an integer >= 0")
    check_address(listen, "--listen", "")
    cfg = compose_run_config(list(overrides))
    check_run_config(cfg)

    def node(name: str) -> dict:
        return OmegaConf.to_container(cfg[name], resolve=True)

    # what the party will hold, checked as train.py checks the same overrides
    known = shipped_defaults(tuple(config_dirs()))
    nodes = OmegaConf.create({name: node(name) for name in ("algo", "party", "optimizer")})
    nodes.mechanism = node("mechanism")
    for name in nodes:
        check_target_node(name, nodes[name], known)
    check_values(nodes, known)
    # a party agrees to the protocol's PARTY_SETTINGS; the rest of algo is the server's
    settings = getattr(locate(cfg.algo._target_), "PARTY_SETTINGS", ("_target_", "name"))
    protocol = {key: value for key, value in node("algo").items() if key in settings}

    certificate, key = party_files(party)
    certs = Path(certs).resolve()
    config = {
        "party": int(party),
        "listen": listen,
        "tls": {
            "ca": str(certs / "ca.pem"),
            "cert": str(certs / certificate),
            "key": str(certs / key),
        },
        "server_name": server_name or SERVER_NAME,
        "data": str(Path(data).resolve()),
        "state_dir": str(Path(state_dir).resolve()),
        "seeds": seeds,
        "seed": int(cfg.seed) if seeds == "derived" else None,
        "protocol": protocol,
        "model": node("party"),
        "optimizer": node("optimizer"),
        "mechanism": node("mechanism"),
        "idle_timeout_s": float(idle_timeout_s),
        "wait_s": None if wait_s is None else float(wait_s),
        "threads": 1,
        "once": bool(once),
        "policy": PartyPolicy(**(policy or {})).as_dict(),
    }
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    except OSError as error:
        raise ConfigError(f"--out={out} cannot be written: {error}") from None
    return out


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m vfl_lightning.party",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = main.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the party from its configuration")
    serve.add_argument("--config", required=True, type=Path, help="the party's YAML file")
    serve.add_argument("--port-file", type=Path, help="write the bound port here (listen port 0)")
    init = commands.add_parser("init", help="write a party configuration")
    init.add_argument("--party", required=True, type=int)
    init.add_argument("--listen", required=True, help="host:port the party listens on")
    init.add_argument("--certs", required=True, type=Path, help="folder of ca.pem, party_<m>.*")
    init.add_argument("--data", required=True, type=Path, help="the party's .npz data file")
    init.add_argument("--state-dir", required=True, type=Path)
    init.add_argument("--out", required=True, type=Path)
    init.add_argument("--seeds", choices=("private", "derived"), default="private")
    init.add_argument("--server-name", default=None)
    init.add_argument("--idle-timeout-s", type=float, default=120.0)
    init.add_argument("--wait-s", type=float, default=None)
    init.add_argument("--once", action="store_true", help="exit after the first run closes")
    init.add_argument("overrides", nargs="*", help="train.py's overrides (algo=pbm, ...)")
    certs = commands.add_parser("certs", help="make a development CA and certificates")
    certs.add_argument("--out", required=True, type=Path)
    certs.add_argument("--parties", required=True, type=int)
    certs.add_argument("--server-name", default=None)
    certs.add_argument("--days", type=int, default=365)
    for sub in (main, serve, init, certs):
        sub.error = lambda message, sub=sub: sub.exit(2, f"error: {message} (see --help)\n")
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from vfl_lightning.run.outcome import error_summary, exit_code

    try:
        if args.command == "certs":
            from vfl_lightning.errors import ConfigError
            from vfl_lightning.mechanisms.certificates import SERVER_NAME, write_development_ca

            if args.parties < 1 or args.days < 1:
                raise ConfigError(
                    f"--parties={args.parties} and --days={args.days} must be integers >= 1"
                )
            try:
                written = write_development_ca(
                    args.out,
                    args.parties,
                    server_name=args.server_name or SERVER_NAME,
                    days=args.days,
                )
            except OSError as error:
                raise ConfigError(f"--out={args.out} cannot be written: {error}") from None
            print(f"wrote a development CA and {len(written) // 2 - 1} certificates to {args.out}")
            return 0
        if args.command == "init":
            written = write_party_config(
                args.out,
                args.overrides,
                party=args.party,
                listen=args.listen,
                certs=args.certs,
                data=args.data,
                state_dir=args.state_dir,
                seeds=args.seeds,
                server_name=args.server_name,
                idle_timeout_s=args.idle_timeout_s,
                wait_s=args.wait_s,
                once=args.once,
            )
            print(f"wrote {written}")
            return 0
        from vfl_lightning.run.party_checks import checked
        from vfl_lightning.runtime.party_program import PartyProgram

        program = PartyProgram(checked(args.config))
        return program.serve(args.port_file)
    except Exception as error:
        code = exit_code(error)
        if code is None:
            raise
        from vfl_lightning.errors import ConfigError
        from vfl_lightning.run.hydra_cli import explain

        # Hydra's own errors for init's overrides (algo=foo, sed=3) as train.py words them
        line = None if isinstance(error, ConfigError) else explain(error)
        print(f"error: {line or error_summary(error)}", file=sys.stderr)
        return code


if __name__ == "__main__":
    code = main()
    # Everything is written (a stopped program's ledger and states, init's and certs' files):
    # the interpreter's teardown of torch and Lightning, about a second, is skipped.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
