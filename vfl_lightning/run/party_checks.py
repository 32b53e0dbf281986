"""What ``python -m vfl_lightning.party serve`` checks in a party's configuration before it
listens, beyond the file's own shape (:func:`~vfl_lightning.runtime.party_config.
read_party_config`): its config nodes by train.py's rules, the protocol settings it may hold, its
state directory and its listen address. One ConfigError line each, naming the file, the key, the
value and the fix."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from omegaconf import OmegaConf

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.errors import ConfigError
from vfl_lightning.run.checks import unwritable
from vfl_lightning.run.early import target_error
from vfl_lightning.run.key_index import locate
from vfl_lightning.run.schema import check_target_node, check_values, config_dirs, shipped_defaults
from vfl_lightning.runtime.party_config import PartyConfig

NODES = (
    ("protocol", "algo"),
    ("model", "party"),
    ("optimizer", "optimizer"),
    ("mechanism", "mechanism"),
)
"""Each config node of a party's file and the train.py group whose keys, types and ranges it
takes (``model`` is train.py's ``party``, ``protocol`` its ``algo``)."""


def check_party_config(config: PartyConfig) -> None:
    """Every check of this module, in the order a party's operator would fix them."""
    where = f"{config.path}: "
    protocol = check_nodes(config, where)
    check_protocol_settings(config, protocol, where)
    problem = unwritable(config.state_dir)
    if problem:
        raise ConfigError(
            f"{where}state_dir={config.state_dir} cannot be used: {problem}; choose a directory "
            "this program can create and write (it keeps the party's model, optimizer and "
            "generators there)"
        )
    check_listen(config.listen, where)


def renamed(message: str, group: str, own: str) -> str:
    """A train.py check's message about ``<group>.key`` told with the party file's node name."""
    message = message.replace("or drop the override", "or drop it from this file")
    return own + message[len(group) :] if message.startswith(f"{group}.") else message


def bases() -> dict[str, tuple[type, str]]:
    """The class each node's ``_target_`` must name a subclass of, and its public name."""
    import torch

    from vfl_lightning.mechanisms.base import Mechanism

    return {
        "protocol": (VFLModule, "vfl_lightning.algorithms.base.VFLModule (a protocol)"),
        "model": (torch.nn.Module, "torch.nn.Module"),
        "optimizer": (torch.optim.Optimizer, "torch.optim.Optimizer"),
        "mechanism": (Mechanism, "vfl_lightning.mechanisms.base.Mechanism"),
    }


def check_nodes(config: PartyConfig, where: str) -> type[VFLModule]:
    """Each node names a class that imports (the protocol node a protocol class, the model a
    torch module, ...) and holds only keys that class takes, each of the type and in the range
    train.py accepts; returns the protocol class."""
    known = shipped_defaults(tuple(config_dirs()))
    found = {}
    for own, group in NODES:
        node = getattr(config, own)
        target = str(node["_target_"])
        try:
            found[own] = locate(target)
        except Exception as error:
            line = str(target_error(own, target, error))
            raise ConfigError(
                f"{where}{line} (python -m vfl_lightning.party init writes a shipped one)"
            ) from None
        base, name = bases()[own]
        if not (isinstance(found[own], type) and issubclass(found[own], base)):
            kind = "a class" if isinstance(found[own], type) else f"a {type(found[own]).__name__}"
            raise ConfigError(
                f"{where}{own}._target_={target} is {kind}, not a subclass of {name}: name one "
                "there (python -m vfl_lightning.party init ... writes a shipped one)"
            )
        try:
            # only the class's own parameters: a key another choice of the group takes would be
            # compared with the server's proposal and refused there, after the party started
            check_target_node(own, OmegaConf.create(node), {})
            check_values(OmegaConf.create({group: node}), known)
        except ConfigError as error:
            raise ConfigError(f"{where}{renamed(str(error), group, own)}") from None
    return found["protocol"]


def check_protocol_settings(config: PartyConfig, protocol: type[VFLModule], where: str) -> None:
    """The protocol node holds only the settings a party agrees to (the class's
    ``PARTY_SETTINGS``, which the proposal compares): any other is the server's (train.py's
    ``algo.*``), which no party checks, so a party that set one would believe it agreed to it."""
    settings = tuple(getattr(protocol, "PARTY_SETTINGS", ("_target_", "name")))
    for key, value in config.protocol.items():
        if key not in settings and key not in ("_partial_",):
            raise ConfigError(
                f"{where}protocol.{key}={value!r} is the server's setting (train.py's "
                f"algo.{key}), which no party agrees to or checks: drop it from this file (a "
                f"party's protocol node takes {', '.join(settings)})"
            )


def check_listen(listen: str, where: str) -> None:
    """``listen``'s host resolves to an address of this machine and its port is free (bound and
    released at once; gRPC binds it next)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError) as error:
        raise ConfigError(
            f"{where}listen={listen}: the host {host!r} does not resolve ({error}): listen on "
            f"this machine's address or name, or 0.0.0.0:{port} (every address)"
        ) from None
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
    except OSError as error:
        fix = {
            errno.EADDRINUSE: "the port is in use; choose another port (or 0: any free one)",
            errno.EADDRNOTAVAIL: "the address is not this machine's; listen on one of its "
            f"addresses, or 0.0.0.0:{port} (every address)",
            errno.EACCES: "a port below 1024 needs privileges; choose a port >= 1024",
        }.get(error.errno, "choose another address or port")
        raise ConfigError(f"listen={listen} cannot be bound ({error.strerror}): {fix}") from None
    finally:
        probe.close()


def checked(path: str | Path) -> PartyConfig:
    """The party configuration in ``path``, read and checked."""
    from vfl_lightning.runtime.party_config import read_party_config

    config = read_party_config(path)
    check_party_config(config)
    return config
