"""A party's own configuration under ``runtime=grpc``: one YAML file its operator writes (or makes
with ``python -m vfl_lightning.party init``), read only by the party program. It names the party's
index, where it listens, its TLS files and the server it accepts, its data file (its columns and
sample ids), its state directory, where its seeds come from, the protocol, model, optimizer and
mechanism it agreed to run, and its privacy ``policy`` (the settings of
:class:`~vfl_lightning.algorithms.party_policy.PartyPolicy`). Nothing in it comes from the
server."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from vfl_lightning.algorithms.parties import PARTY_SEEDS
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms.certificates import SERVER_NAME

REQUIRED = (
    "party",
    "listen",
    "tls",
    "data",
    "state_dir",
    "protocol",
    "model",
    "optimizer",
    "mechanism",
)
OPTIONAL = {
    "server_name": SERVER_NAME,
    "seeds": "private",
    "seed": None,
    "idle_timeout_s": 120.0,
    "wait_s": None,
    "threads": 1,
    "once": False,
    "policy": None,
}
TLS_KEYS = ("ca", "cert", "key")


@dataclass(frozen=True)
class PartyConfig:
    """The checked contents of a party's configuration file ``path`` (relative paths in it are
    relative to the file's folder)."""

    path: Path
    party: int
    listen: str
    ca: Path
    cert: Path
    key: Path
    server_name: str
    data: Path
    state_dir: Path
    seeds: str
    seed: int | None
    protocol: dict
    model: dict
    optimizer: dict
    mechanism: dict
    idle_timeout_s: float
    wait_s: float | None
    threads: int
    once: bool
    policy: PartyPolicy

    def refuse(self, key: str, value, fix: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}={value!r} {fix}")


def check_address(value, key: str, where: str) -> str:
    """``host:port`` with a port in [0, 65535] (0: any free port, where listening)."""
    text = str(value) if isinstance(value, str) else ""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}{key}={value!r} must be host:port (e.g. 127.0.0.1:50051)")
    return text


def _number(value, key: str, where: str, *, low: float, null: bool = False) -> float | None:
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}{key}={value!r} must be a finite number > {low}")
    if not value > low:
        raise ConfigError(f"{where}{key}={value!r} must be a finite number > {low}")
    return float(value)


def read_party_config(path: str | Path) -> PartyConfig:
    """The party configuration in ``path``, or one ConfigError naming the file, the key, the
    value and what it takes."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    where = f"{path}: "
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except FileNotFoundError:
        raise ConfigError(
            f"--config {path} does not exist: write a party configuration there "
            "(python -m vfl_lightning.party init ... --out FILE)"
        ) from None
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as error:
        reason = " ".join(str(error).split())[:300]
        raise ConfigError(f"--config {path} cannot be read as a YAML mapping: {reason}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path} must hold a YAML mapping, got {type(loaded).__name__}")
    unknown = sorted(set(loaded) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ConfigError(
            f"{where}unknown key(s) {unknown}; a party configuration takes "
            f"{sorted([*REQUIRED, *OPTIONAL])}"
        )
    missing = [key for key in REQUIRED if loaded.get(key) is None]
    if missing:
        raise ConfigError(f"{where}missing key(s) {missing} (see docs/deploy.md)")
    values = OPTIONAL | loaded
    folder = path.parent

    def file(value, key: str) -> Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}{key}={value!r} must be a file path")
        return (folder / value).resolve()

    party = values["party"]
    if isinstance(party, bool) or not isinstance(party, int) or party < 0:
        raise ConfigError(f"{where}party={party!r} must be the party's index, an integer >= 0")
    tls = values["tls"]
    if not isinstance(tls, dict) or sorted(tls) != sorted(TLS_KEYS):
        raise ConfigError(f"{where}tls={tls!r} must map exactly {list(TLS_KEYS)} to PEM files")
    seeds = values["seeds"]
    if seeds not in PARTY_SEEDS:
        raise ConfigError(f"{where}seeds={seeds!r} must be one of {PARTY_SEEDS}")
    seed = values["seed"]
    if seeds == "derived" and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(
            f"{where}seed={seed!r}: seeds=derived needs the run's seed (an integer) it reproduces"
        )
    for key in ("protocol", "model", "optimizer", "mechanism"):
        if not isinstance(values[key], dict) or "_target_" not in values[key]:
            raise ConfigError(f"{where}{key} must be a config node with a _target_")
    threads = values["threads"]
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"{where}threads={threads!r} must be an integer >= 1")
    if not isinstance(values["once"], bool):
        raise ConfigError(f"{where}once={values['once']!r} must be true or false")
    if not isinstance(values["server_name"], str) or not values["server_name"]:
        raise ConfigError(f"{where}server_name={values['server_name']!r} must be a name")
    policy = values["policy"] or {}
    if not isinstance(policy, dict):
        raise ConfigError(f"{where}policy={policy!r} must be a mapping of policy settings or null")
    known = set(PartyPolicy.__dataclass_fields__) - {"source"}
    unknown = sorted(str(key) for key in set(policy) - known)
    if unknown:
        raise ConfigError(
            f"{where}policy has unknown setting(s) {unknown}; allowed: {sorted(known)}"
        )
    state_dir = values["state_dir"]
    if not isinstance(state_dir, str) or not state_dir:
        raise ConfigError(f"{where}state_dir={state_dir!r} must be a directory path")
    return PartyConfig(
        path=path,
        party=party,
        listen=check_address(values["listen"], "listen", where),
        ca=file(tls["ca"], "tls.ca"),
        cert=file(tls["cert"], "tls.cert"),
        key=file(tls["key"], "tls.key"),
        server_name=values["server_name"],
        data=file(values["data"], "data"),
        state_dir=(folder / state_dir).resolve(),
        seeds=seeds,
        seed=seed if seeds == "derived" else None,
        protocol=values["protocol"],
        model=values["model"],
        optimizer=values["optimizer"],
        mechanism=values["mechanism"],
        idle_timeout_s=_number(values["idle_timeout_s"], "idle_timeout_s", where, low=0),
        wait_s=_number(values["wait_s"], "wait_s", where, low=0, null=True),
        threads=threads,
        once=values["once"],
        policy=PartyPolicy(**policy, source=f"{path} policy"),
    )
