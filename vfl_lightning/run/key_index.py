"""The keys every class the shipped configs name (``_target_``) takes, and the option lists the
value checks need, kept in ``key_index.json`` so the early configuration check reads them without
importing those classes (nor torch, nor Lightning).

The file is generated from the code. After adding a config key (a parameter of a class a config
names, a new ``_target_`` in conf/, a partition, an activation or a dataset loader), run::

    python -m vfl_lightning.run.key_index

``tests/test_key_index.py`` fails, naming the key and this command, while the file and the code
disagree. A ``_target_`` outside the index (a class of your own) is checked after the imports,
from its signature (:func:`target_parameters`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from functools import lru_cache
from pathlib import Path

INDEX_FILE = Path(__file__).with_name("key_index.json")
COMMAND = "python -m vfl_lightning.run.key_index"
REPOSITORY_CONF = Path(__file__).resolve().parents[2] / "conf"
NOT_INDEXED = object()
"""What :func:`indexed_parameters` returns for a ``_target_`` the index does not hold."""


@lru_cache(maxsize=1)
def load() -> dict:
    """The stored index: ``{"targets": {target: [keys] or null}, "choices": {name: [options]}}``
    (null: the class passes ``**kwargs`` to another library, so it takes any key)."""
    return json.loads(INDEX_FILE.read_text())


def indexed_parameters(target: str):
    """The keys ``target`` takes, from the index: a frozenset, None (any key) or
    :data:`NOT_INDEXED`."""
    targets = load()["targets"]
    if target not in targets:
        return NOT_INDEXED
    keys = targets[target]
    return None if keys is None else frozenset(keys)


def choices(name: str) -> tuple[str, ...]:
    """The options of ``name`` (``partitions``, ``activations``, ``datasets``), from the index."""
    return tuple(load()["choices"][name])


def locate(target: str):
    """The object a dotted path names, importing the longest module prefix that exists; an
    ImportError naming the part that is missing otherwise."""
    parts = target.split(".")
    if not all(parts):
        raise ImportError(f"{target!r} is not a dotted path (package.module.Name)")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if module_name == missing or module_name.startswith(missing + "."):
                continue
            raise
        for attribute in parts[end:]:
            if not hasattr(found, attribute):
                raise ImportError(f"module {module_name!r} has no attribute {attribute!r}")
            found = getattr(found, attribute)
        return found
    raise ImportError(f"no module named {parts[0]!r}")


@lru_cache(maxsize=64)
def target_parameters(target: str) -> frozenset[str] | None:
    """The keyword parameters ``target`` takes, read from its signature: a function's own; a
    class's ``__init__`` and, while this project's ``__init__``s pass ``**kwargs`` on, those of its
    bases in MRO order. None (any key) when ``**kwargs`` go to another library (e.g. W&B's
    ``init``) or the target cannot be imported (its own check says why)."""
    try:
        found = locate(target)
    except Exception:
        return None
    return signature_keys(found)


def signature_keys(found) -> frozenset[str] | None:
    """The keyword parameters of a class or function (see :func:`target_parameters`)."""
    if inspect.isclass(found):
        chain = [(k, k.__dict__["__init__"]) for k in found.__mro__ if "__init__" in k.__dict__]
    elif callable(found):
        chain = [(found, found)]
    else:
        return None
    names: set[str] = set()
    for owner, function in chain:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a builtin without a readable signature
            return None
        names |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
        if not owner.__module__.startswith("vfl_lightning."):
            passed_to = getattr(found, "KWARGS_GO_TO", None)  # the function they reach
            if passed_to is None:
                return None
            more = signature_keys(locate(passed_to))
            return None if more is None else frozenset((names | more) - {"self"})
    return frozenset(names - {"self"})


def config_targets(folders: list[Path]) -> set[str]:
    """Every ``_target_`` a config file under ``folders`` names, at any depth (Hydra's own
    ``hydra/`` group left out; interpolations are not names)."""
    from omegaconf import OmegaConf

    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and "${" not in target:
                found.add(target)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for folder in folders:
        for file in sorted(folder.rglob("*.yaml")):
            if file.relative_to(folder).parts[0] == "hydra":
                continue
            walk(OmegaConf.to_container(OmegaConf.load(file), resolve=False))
    return found


def build(folders: list[Path] | None = None) -> dict:
    """The index as the code gives it now (imports every indexed class)."""
    from vfl_lightning.data.datasets import LOADERS
    from vfl_lightning.data.partition import PARTITIONS
    from vfl_lightning.models.encoders import ACTIVATIONS

    targets = {}
    for target in sorted(config_targets(folders or [REPOSITORY_CONF])):
        keys = signature_keys(locate(target))
        targets[target] = None if keys is None else sorted(keys)
    return {
        "command": COMMAND,
        "targets": targets,
        "choices": {
            "partitions": sorted(PARTITIONS),
            "activations": sorted(ACTIVATIONS),
            "datasets": sorted(LOADERS),
        },
    }


def differences(stored: dict, built: dict) -> list[str]:
    """One line per disagreement between the stored index and the code, naming the key."""
    lines = []
    old, new = stored.get("targets", {}), built["targets"]
    for target in sorted(new.keys() - old.keys()):
        lines.append(f"{target} is named by a config but missing from the key index")
    for target in sorted(old.keys() - new.keys()):
        lines.append(f"{target} is in the key index but no config names it")
    for target in sorted(new.keys() & old.keys()):
        if old[target] is None or new[target] is None:
            if old[target] != new[target]:
                takes = "any key" if new[target] is None else "a fixed set of keys"
                lines.append(f"{target} now takes {takes}")
            continue
        for key in sorted(set(new[target]) - set(old[target])):
            lines.append(f"{target} takes {key}, which the key index lacks")
        for key in sorted(set(old[target]) - set(new[target])):
            lines.append(f"{target} no longer takes {key}, which the key index lists")
    for name, options in built["choices"].items():
        known = stored.get("choices", {}).get(name, [])
        for option in sorted(set(options) ^ set(known)):
            where = "the code" if option in options else "the key index"
            lines.append(f"{name}: {option!r} is only in {where}")
    return lines


def write(index: dict) -> None:
    INDEX_FILE.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vfl_lightning.run.key_index",
        description="Rebuild vfl_lightning/run/key_index.json from the code and conf/; print "
        "what changed.",
    )
    parser.error = lambda message: parser.exit(2, f"error: {message} (see --help)\n")
    parser.parse_args(argv)
    stored = json.loads(INDEX_FILE.read_text()) if INDEX_FILE.is_file() else {}
    built = build()
    changes = differences(stored, built)
    write(built)
    for line in changes:
        print(line)
    print(f"{INDEX_FILE}: {len(built['targets'])} targets, {len(changes)} changes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
