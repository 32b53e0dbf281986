"""The composed config checked key by key before anything is built, one ConfigError line each:
every key is one the shipped configs or the class it configures know, no value is left unset
(``???``), and every value has the type and range its key takes.

Known keys: a node with a ``_target_`` takes the parameters of its class (from the key index,
:mod:`vfl_lightning.run.key_index`, or for a class of your own its signature, so
``+optimizer.nesterov=true`` or ``+trainer.num_nodes=2`` pass) and
the keys config files set for it; ``callbacks`` and ``logger`` take any name whose node has a
``_target_`` (or is null); every other key must appear in a config file under the config
directories. Types: a key whose every shipped default is
a boolean takes a boolean, one whose every default is a number a number, a string a string
(:data:`NOT_TYPED` lists the keys that take more); :data:`RANGES` adds the range of the keys every protocol shares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

from vfl_lightning.errors import ConfigError
from vfl_lightning.run.key_index import NOT_INDEXED, indexed_parameters, target_parameters
from vfl_lightning.run.schema_rules import RANGES, is_int, is_number

META_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
CONTAINERS = ("callbacks", "logger")
"""Nodes whose entries the user names: each a ``_target_`` node, or null to leave one out."""
NOT_GROUPS = ("hydra", "wandb_sweeps")
NOT_TYPED = {
    "trainer.max_epochs",
    "trainer.devices",
    "trainer.deterministic",
    "trainer.fast_dev_run",
    "trainer.precision",
    "trainer.limit_train_batches",
    "trainer.limit_val_batches",
    "trainer.limit_test_batches",
    "trainer.val_check_interval",
    "trainer.num_nodes",
}
"""Keys whose shipped defaults are of one type but that also take another (Lightning's ``devices``
and ``fast_dev_run``, a batch limit as a count or a fraction, ...)."""


MISSING_HINTS = {
    "data.dir": "the directory written by python -m vfl_lightning.data.export (data=party_files "
    "data.dir=DIR)",
}


def config_dirs() -> list[Path]:
    """The running Hydra job's file config sources; outside a job, the repository's conf/."""
    from hydra.core.hydra_config import HydraConfig

    try:
        sources = HydraConfig.get().runtime.config_sources
        folders = [Path(source.path) for source in sources if source.schema == "file"]
    except ValueError:
        folders = []
    repository = Path(__file__).resolve().parents[2] / "conf"
    return [f for f in folders if f.is_dir()] or ([repository] if repository.is_dir() else [])


class ConfigYAMLLoader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):
    """libyaml's parser (a tenth of the pure-Python one's time) resolving scalars as OmegaConf's
    loader does (YAML 1.2 floats such as ``1e-5``, no timestamps)."""

    yaml_implicit_resolvers = get_yaml_loader().yaml_implicit_resolvers


@lru_cache(maxsize=8)
def shipped_defaults(folders: tuple[Path, ...]) -> dict[str, list]:
    """``{dotted key: [every default a config file gives it]}`` over the config files."""
    found: dict[str, list] = {}

    def walk(prefix: str, node) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if key == "defaults" and not prefix:
                continue
            found.setdefault(path, []).append(value)
            if isinstance(value, dict):
                walk(f"{path}.", value)

    for folder in folders:
        for file in folder.rglob("*.yaml"):
            group = file.parent.relative_to(folder).parts
            if group and group[0] in NOT_GROUPS:
                continue
            text = file.read_text()
            data = yaml.load(text, Loader=ConfigYAMLLoader)
            if not isinstance(data, dict):
                continue
            is_global = "@package _global_" in text or not group
            walk("" if is_global else ".".join(group) + ".", data)
    return found


def check_missing(node: DictConfig, prefix: str = "") -> None:
    """Refuse a value left as ``???`` anywhere in the config."""
    for key in node:
        path = f"{prefix}{key}"
        if OmegaConf.is_missing(node, key):
            hint = MISSING_HINTS.get(path, f"set it on the command line: {path}=...")
            raise ConfigError(f"{path} must be set (the config leaves it ???): {hint}")
        value = node._get_node(key)
        if isinstance(value, DictConfig) and not value._is_none():
            check_missing(value, f"{path}.")


def _unknown(path: str, allowed: Iterable[str], where: str) -> ConfigError:
    listed = ", ".join(sorted(a for a in allowed if a not in META_KEYS))
    name = path.rsplit(".", 1)[-1]
    return ConfigError(
        f"{path} is not a config key ({where} takes {listed}); "
        f"check the spelling of {name!r}, or drop the override"
    )


def keys_with_imports(target: str):
    """The keys ``target`` takes: from the key index, else from its signature (imports it)."""
    keys = indexed_parameters(target)
    return target_parameters(target) if keys is NOT_INDEXED else keys


def check_target_node(
    path: str, node: DictConfig, known: dict[str, list], keys_of: Callable = keys_with_imports
) -> None:
    """A key the node's class does not take is refused unless a config file sets it (for another
    choice of the group: then the class's own refusal names the configs that set it)."""
    parameters = keys_of(str(node.get("_target_")))
    if parameters is None or parameters is NOT_INDEXED:
        return
    for key in node:
        if key not in META_KEYS and key not in parameters and f"{path}.{key}" not in known:
            set_in_files = {k[len(path) + 1 :] for k in known if k.startswith(f"{path}.")}
            allowed = set(parameters) | {k for k in set_in_files if "." not in k}
            raise _unknown(f"{path}.{key}", allowed, f"{path} ({node.get('_target_')})")


def check_keys(
    cfg: DictConfig, known: dict[str, list], keys_of: Callable = keys_with_imports
) -> None:
    """Refuse a key neither a config file nor the class its node configures knows (``keys_of``:
    the keys a ``_target_`` takes; :data:`NOT_INDEXED` skips its node)."""
    roots = {k.split(".")[0] for k in known}
    for key in cfg:
        if key not in roots:
            raise _unknown(str(key), roots, "the root config")
        node = cfg._get_node(key)
        if not isinstance(node, DictConfig) or node._is_none():
            continue
        if "_target_" in node:
            check_target_node(str(key), node, known, keys_of)
        elif key in CONTAINERS:
            for name in node:
                item = node._get_node(name)
                if isinstance(item, DictConfig) and not item._is_none():
                    if "_target_" not in item:
                        raise ConfigError(
                            f"{key}.{name} needs a _target_ (the class to instantiate), got "
                            f"keys {sorted(item)}; or set {key}.{name}=null to leave it out"
                        )
                    check_target_node(f"{key}.{name}", item, known, keys_of)
        else:
            check_plain_node(str(key), node, known, keys_of)


def check_plain_node(path: str, node: DictConfig, known: dict[str, list], keys_of) -> None:
    """A node without a ``_target_`` (``audit``, ``search``): its keys, at every depth, are those
    config files set (``+audit.canary.foo=1`` is refused); a ``_target_`` node inside it takes
    its class's keys."""
    inside = {k[len(path) + 1 :].split(".")[0] for k in known if k.startswith(f"{path}.")}
    for name in node:
        if name not in inside:
            raise _unknown(f"{path}.{name}", inside, path)
        child = node._get_node(name)
        if isinstance(child, DictConfig) and not child._is_none():
            if "_target_" in child:
                check_target_node(f"{path}.{name}", child, known, keys_of)
            else:
                check_plain_node(f"{path}.{name}", child, known, keys_of)


def _type_of(defaults: list) -> str | None:
    """``bool``, ``number`` or ``str`` when every shipped default of a key (but null and
    interpolations) is one."""
    present = [d for d in defaults if d is not None and not (isinstance(d, str) and "${" in d)]
    if not present:
        return None
    if all(isinstance(d, bool) for d in present):
        return "bool"
    if all(is_number(d) for d in present):
        return "number"
    if all(isinstance(d, str) for d in present):
        return "str"
    return None


def leaves(node: DictConfig, prefix: str = ""):
    """``(dotted key, resolved value)`` of every leaf (lists are leaves)."""
    for key in node:
        path = f"{prefix}{key}"
        value = node.get(key)
        if isinstance(value, DictConfig):
            yield from leaves(value, f"{path}.")
        else:
            yield path, OmegaConf.to_container(value) if isinstance(value, ListConfig) else value


def check_values(cfg: DictConfig, known: dict[str, list]) -> None:
    """Every value of the type its shipped defaults have and in its key's range."""
    for path, value in leaves(cfg):
        rule = RANGES.get(path)
        if rule is not None:
            accept, text = rule
            if not accept(value):
                raise ConfigError(f"{path} must be {text}, got {value!r}")
            continue
        kind = None if path in NOT_TYPED else _type_of(known.get(path, []))
        if kind == "bool" and not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}")
        if kind == "number" and value is not None and not is_number(value):
            raise ConfigError(f"{path} must be a finite number, got {value!r}")
        if kind == "str" and value is not None and not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}")
    check_epochs(cfg.get("trainer"))
    check_training_batches(cfg)
    check_fractions(cfg.get("data"))


def check_fractions(data) -> None:
    """``data.val_fraction + data.test_fraction`` must leave training samples; ``data.columns``
    is read by the explicit partition only."""
    if data is None:
        return
    partition = data.get("partition")
    if data.get("columns") is not None and partition not in (None, "explicit"):
        raise ConfigError(
            f"data.columns is read by data.partition=explicit only, got data.partition="
            f"{partition}: set data.partition=explicit or data.columns=null"
        )
    columns, parties = data.get("columns"), data.get("num_parties")
    explicit = partition == "explicit" and columns is not None and is_int(parties)
    if explicit and len(columns) != parties:
        raise ConfigError(
            f"data.columns lists {len(columns)} column lists, but data.num_parties={parties}: "
            f"give one list per party, or set data.num_parties={len(columns)}"
        )
    val, test = data.get("val_fraction"), data.get("test_fraction")
    if is_number(val) and is_number(test) and val + test >= 1:
        raise ConfigError(
            f"data.val_fraction + data.test_fraction must be < 1 (the rest trains), got "
            f"{val} + {test} = {val + test:g}"
        )


def check_epochs(trainer) -> None:
    """``trainer.max_epochs``: an integer >= 1, or -1 (or null) when ``trainer.max_steps`` ends
    training; -1 with ``max_steps=-1`` would train forever."""
    if trainer is None:
        return
    epochs, steps = trainer.get("max_epochs"), trainer.get("max_steps", -1)
    if is_int(epochs) and epochs >= 1:
        return
    if (epochs is None or epochs == -1) and is_int(steps) and steps >= 1:
        return
    raise ConfigError(
        f"trainer.max_epochs must be an integer >= 1 (or -1 with trainer.max_steps >= 1, which "
        f"then ends training), got {epochs!r} with trainer.max_steps={steps!r}"
    )


def check_training_batches(cfg: DictConfig) -> None:
    """``trainer.limit_train_batches`` = 0 trains nothing: it only evaluates the checkpoint
    ``ckpt_path`` resumes, so without one the run would score its initial model."""
    trainer = cfg.get("trainer")
    limit = None if trainer is None else trainer.get("limit_train_batches")
    zero = limit is not None and not isinstance(limit, bool) and limit == 0
    if zero and "ckpt_path" in cfg and cfg.get("ckpt_path") is None:
        raise ConfigError(
            f"trainer.limit_train_batches={limit} trains nothing: set ckpt_path to evaluate a "
            "checkpoint, or a limit > 0 (null: every batch)"
        )


def check_schema(cfg: DictConfig, *, imports: bool = True) -> None:
    """Every check of this module: unset values, unknown keys, types and ranges. ``imports=False``
    reads the keys of classes from the key index alone and leaves a ``_target_`` it does not hold
    to :func:`check_unindexed_keys` (nothing is imported: the command line runs it before
    torch)."""
    check_missing(cfg)
    known = shipped_defaults(tuple(config_dirs()))
    check_keys(cfg, known, keys_with_imports if imports else indexed_parameters)
    check_values(cfg, known)


def unindexed_parameters(target: str):
    """The keys of a ``_target_`` the key index does not hold, from its signature (imports it);
    :data:`NOT_INDEXED` for one it holds (its node was checked from the index)."""
    return target_parameters(target) if indexed_parameters(target) is NOT_INDEXED else NOT_INDEXED


def check_unindexed_keys(cfg: DictConfig) -> None:
    """What ``check_schema(cfg, imports=False)`` left out: the keys of every node whose
    ``_target_`` the key index does not hold, read from its class (imported). After that check,
    the two together are :func:`check_schema`."""
    check_keys(cfg, shipped_defaults(tuple(config_dirs())), unindexed_parameters)
