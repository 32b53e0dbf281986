"""``runtime=grpc`` (:class:`GrpcRuntime`): every party its own program, reached at
``runtime.parties[m]`` over mutual TLS with the server's certificates in ``runtime.certs``. The
server proposes what will run; each party checks it against its own configuration. Nothing of a
party's configuration comes from this command."""

from __future__ import annotations

import logging
import math
import secrets
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.checkpoints import resumable_checkpoint
from vfl_lightning.errors import ConfigError
from vfl_lightning.run.checks import check_ray_evaluation_release, check_ray_options, party_seeds
from vfl_lightning.run.runtimes import LocalRuntime, party_policy

log = logging.getLogger(__name__)

CERT_FILES = ("ca.pem", "server.pem", "server.key")
SETTINGS = (
    "name",
    "parties",
    "certs",
    "party_seeds",
    "connect_timeout_s",
    "call_timeout_s",
    "heartbeat_s",
)
"""The keys of ``runtime=grpc`` (conf/runtime/grpc.yaml): the runtime class takes any, so an
added key (``+runtime.conect_timeout_s=5``) is refused here rather than ignored."""


def _positive(cfg: DictConfig, key: str) -> float:
    value = cfg.runtime.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        value = None
    if value is None or value <= 0:
        raise ConfigError(
            f"runtime.{key}={cfg.runtime.get(key)!r} must be a finite number of seconds > 0"
        )
    return float(value)


def party_addresses(cfg: DictConfig) -> list[str]:
    """``runtime.parties``: one ``host:port`` per party, in party order."""
    from vfl_lightning.runtime.party_config import check_address

    parties = cfg.runtime.get("parties")
    if OmegaConf.is_config(parties):
        parties = OmegaConf.to_container(parties, resolve=True)
    if not isinstance(parties, list) or not parties:
        raise ConfigError(
            f"runtime.parties={parties!r} must list each party program's host:port in party "
            "order, e.g. runtime.parties=[10.0.0.5:50051,10.0.0.6:50051]"
        )
    for m, address in enumerate(parties):
        check_address(address, f"runtime.parties[{m}]", "")
    if len(set(parties)) != len(parties):
        raise ConfigError(f"runtime.parties={parties} lists an address twice")
    return [str(address) for address in parties]


def check_party_hosts(parties: list[str]) -> None:
    """Every party's host resolves (a misspelt name is answered now, not after
    ``runtime.connect_timeout_s``)."""
    import socket

    for m, address in enumerate(parties):
        host, _, port = address.rpartition(":")
        try:
            socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as error:
            raise ConfigError(
                f"runtime.parties[{m}]={address}: the host {host!r} does not resolve ({error}): "
                f"write party {m}'s program address as host:port (runtime.parties lists them in "
                "party order)"
            ) from None


def certs_dir(cfg: DictConfig) -> Path:
    """``runtime.certs``: the folder of the server's TLS files (ca.pem, server.pem, server.key)."""
    certs = cfg.runtime.get("certs")
    if not isinstance(certs, str) or not certs:
        raise ConfigError(
            f"runtime.certs={certs!r} must be the folder of ca.pem, server.pem and server.key "
            "(python -m vfl_lightning.party certs --out DIR --parties M makes a development one)"
        )
    folder = Path(certs).expanduser()
    missing = [name for name in CERT_FILES if not (folder / name).is_file()]
    if missing:
        raise ConfigError(
            f"runtime.certs={certs} lacks {missing}: it must hold ca.pem (the deployment's CA), "
            "server.pem and server.key"
        )
    return folder


def check_grpc_runtime(cfg: DictConfig, algo: type) -> None:
    """What ``runtime=grpc`` refuses before anything is built, one line each."""
    unknown = [str(key) for key in cfg.runtime if key not in ("_target_", *SETTINGS)]
    if unknown:
        raise ConfigError(
            f"runtime.{unknown[0]} is not a config key (runtime=grpc takes "
            f"{', '.join(sorted(SETTINGS))}); check the spelling of {unknown[0]!r}, or drop the "
            "override"
        )
    check_party_hosts(party_addresses(cfg))
    certs_dir(cfg)
    for key in ("connect_timeout_s", "call_timeout_s", "heartbeat_s"):
        _positive(cfg, key)
    check_ray_options(algo, cfg.algo)
    if cfg.algo.get("client_speeds") is not None:
        raise ConfigError(
            f"algo.client_speeds={list(cfg.algo.client_speeds)} cannot be used with "
            "runtime=grpc: every party program runs at its own machine's speed (use runtime=ray "
            "to simulate slow clients)"
        )
    check_ray_evaluation_release(cfg.get("mechanism") or {}, cfg.algo.get("dp"))
    check_no_server_policy(cfg)
    for name, spec in ((cfg.get("data") or {}).get("canaries") or {}).items():
        level = (spec or {}).get("level", "feature")
        if level == "message":
            raise ConfigError(
                f"audit={name} (data.canaries.{name}.level=message) cannot run under "
                "runtime=grpc: message canaries go into a party's own releases, and a party "
                "program takes neither their rows nor their coins from the server; audit "
                "runtime=local or runtime=ray"
            )
        raise ConfigError(
            f"audit={name} (data.canaries.{name}.level={level}) cannot run under runtime=grpc: "
            "its canaries are written into the built-in dataset's training rows, and a gRPC run "
            "aligns the party programs' own rows by the PSI; audit runtime=local or runtime=ray"
        )
    strategy = cfg.trainer.get("strategy")
    if strategy not in (None, "auto") or cfg.trainer.get("num_nodes", 1) != 1:
        raise ConfigError(
            "runtime=grpc runs one server process: use trainer.strategy=auto and "
            f"trainer.num_nodes=1 (got strategy {strategy!r})"
        )


def check_no_server_policy(cfg: DictConfig) -> None:
    """Refuse a ``policy`` setting on the server's command: each party program enforces the
    ``policy`` of its own configuration file, and none is sent to it."""
    from vfl_lightning.algorithms.party_policy import PartyPolicy

    policy, default = party_policy(cfg).as_dict(), PartyPolicy().as_dict()
    changed = [key for key in default if policy[key] != default[key]]
    if changed:
        key = changed[0]
        raise ConfigError(
            f"policy.{key}={policy[key]!r} cannot be set on the server under runtime=grpc: each "
            f"party program enforces the policy of its own configuration file; set {key} under "
            "policy: in each party's file (docs/deploy.md) and drop the override"
        )


def make_proposal(cfg: DictConfig, module: VFLModule, datamodule, run: str) -> list[dict]:
    """What the server proposes to each party: the protocol's ``PARTY_SETTINGS``, the model,
    optimizer and mechanism configs, every party's input shape and width, and where party seeds
    come from (the samples are aligned by the PSI after the proposal)."""
    from vfl_lightning.runtime.grpc_proposal import FORMAT, VERSION

    def node(name: str) -> dict:
        return OmegaConf.to_container(cfg[name], resolve=True)

    algo = node("algo")
    seeds = party_seeds(cfg)
    common = {
        "format": FORMAT,
        "version": VERSION,
        "num_parties": module.num_parties,
        "protocol": {key: algo.get(key) for key in type(module).PARTY_SETTINGS},
        "model": node("party"),
        "optimizer": node("optimizer"),
        "mechanism": node("mechanism"),
        "party_shapes": [list(shape) for shape in datamodule.party_shapes],
        "widths": list(module.widths[: module.num_parties]),
        "party_seeds": seeds,
        "seed": int(cfg.seed) if seeds == "derived" else None,
        "run": run,
    }
    return [common | {"party": m} for m in range(module.num_parties)]


class GrpcRuntime(LocalRuntime):
    """Every party a program of its own (``python -m vfl_lightning.party serve``); this process
    holds sample ids, labels and the head, and reaches the parties over mutual TLS
    (docs/deploy.md)."""

    PRIVATE_SEEDS = True

    SETTINGS = SETTINGS

    def __init__(self, name: str = "grpc", **settings) -> None:
        super().__init__(name, **settings)
        self.channels: list = []
        self.datamodule = None

    @classmethod
    def check(cls, cfg: DictConfig, protocol: type) -> None:
        check_grpc_runtime(cfg, protocol)

    def start(self, cfg: DictConfig) -> bool:
        """Read the server's TLS files and open a channel to every party (:meth:`attach` waits
        for them)."""
        import vfl_lightning.runtime  # noqa: F401  (before grpc: its C core's logs off)

        try:
            import grpc  # noqa: F401
        except ImportError as error:
            raise ConfigError(
                "runtime=grpc needs grpcio, which is not installed: pip install -c "
                'constraints.txt -e ".[grpc]" (the dev install includes it)'
            ) from error
        from vfl_lightning.mechanisms.certificates import CertificateConfigError, Credentials
        from vfl_lightning.runtime.grpc_channel import PartyChannel

        folder = certs_dir(cfg)
        try:
            credentials = Credentials.from_files(
                *(folder / name for name in CERT_FILES), settings=("runtime.certs",) * 3
            )
        except CertificateConfigError as error:
            raise ConfigError(str(error)) from None
        timeout = _positive(cfg, "call_timeout_s")
        self.channels = [
            PartyChannel(m, address, credentials, timeout_s=timeout)
            for m, address in enumerate(party_addresses(cfg))
        ]
        return True

    def wait_for_parties(self, cfg: DictConfig) -> None:
        """Reach every party over mutual TLS; one line naming ``runtime.parties[m]`` for the
        first that does not answer within ``runtime.connect_timeout_s`` (nothing ran: exit 2)."""
        from vfl_lightning.errors import PartyLost

        wait = _positive(cfg, "connect_timeout_s")
        for channel in self.channels:
            try:
                channel.wait_ready(wait)
            except PartyLost as lost:
                m = channel.party
                raise ConfigError(
                    f"runtime.parties[{m}]={channel.address}: party {m} is not reachable over "
                    f"mutual TLS within runtime.connect_timeout_s={wait:g} "
                    f"({getattr(lost, 'reason', lost)}): start party {m}'s program there (its "
                    f"certificate must name party-{m}, from the CA in runtime.certs), or correct "
                    "the address"
                ) from None

    def server_side(self, factory: PartyFactory):
        """The label holder's data module (ids and labels; party files: only server.npz is read)
        and the parties' widths; the party models are built and dropped, so the global
        generators (and the head built next) are the local runtime's."""
        if factory.reads_party_files:
            datamodule = factory.datamodule(party_columns=False)
        else:
            datamodule = factory.datamodule(defer_alignment=True)
            own = datamodule.server_shape is not None
            for split in datamodule.splits.values():
                split.xs = split.xs[-1:] if own else []
            datamodule.party_tables = []
        # every party program holds its own rows in its own order: the PSI always aligns them
        datamodule.await_alignment()
        models = factory.party_models(datamodule.party_shapes)
        self.datamodule = datamodule
        return datamodule, [], [int(model.embedding_dim) for model in models]

    def attach(self, cfg: DictConfig, module: VFLModule) -> None:
        from vfl_lightning.runtime.grpc_registry import grpc_parties

        if len(self.channels) != module.num_parties:
            raise ConfigError(
                f"runtime.parties lists {len(self.channels)} party programs, the data has "
                f"{module.num_parties} parties: list one host:port per party"
            )
        self.wait_for_parties(cfg)
        if party_seeds(cfg) == "derived":
            log.warning(
                "runtime.party_seeds=derived: every party's noise and keys of its streams are "
                "derived from the run's seed and known to whoever holds the config; the party "
                "configurations must say seeds: derived too"
            )
        datamodule = self.datamodule
        proposals = make_proposal(cfg, module, datamodule, secrets.token_hex(16))
        parties = grpc_parties(
            module,
            self.channels,
            proposals,
            ledger=module.wire.ledger,
            round_fn=lambda: module.wire.ledger.rounds,
            checkpoint_fn=lambda: resumable_checkpoint(module._trainer),
            device_fn=lambda: module.device,
            codec_fn=lambda: module.wire.downlink_codec,
            heartbeat_s=_positive(cfg, "heartbeat_s"),
            label_holder_ids=datamodule.label_holder_ids,
        )
        datamodule.apply_alignment(parties.alignment)
        self.channels = []
        if module.mechanism.uses_pair_masks:
            module.mechanism.set_pair_seeds({})
        module.attach_parties(parties)

    def stop(self) -> None:
        for channel in self.channels:
            channel.close()
        self.channels = []
