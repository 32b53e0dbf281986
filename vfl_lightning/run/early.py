"""The checks a composed config gets before torch and Lightning are imported (the command line runs
them first, so a bad key or value is answered in about a second): the seed and process options,
every key, type and range (:mod:`vfl_lightning.run.schema` on the key index), the metrics named for
sweepers and targets, and that every ``_target_``'s package exists. One ConfigError line each."""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys

from omegaconf import DictConfig, OmegaConf

from vfl_lightning.errors import ConfigError
from vfl_lightning.run.key_index import NOT_INDEXED, choices, indexed_parameters, locate
from vfl_lightning.run.schema import check_schema
from vfl_lightning.run.schema_rules import choice_or_dotted, is_number

EVALUATION_METRICS = ("acc", "acc_clean", "auroc", "auprc", "loss")
"""What every validation and test logs under ``val/`` and ``test/``: ``loss`` and ``acc``;
``auroc`` and ``auprc`` for binary labels; ``acc_clean`` where the server input is noisy."""
BOUNDED_METRICS = ("acc", "acc_clean", "auroc", "auprc")
"""The metrics whose values lie in [0, 1] (a target outside is never reached)."""


def check_early(cfg: DictConfig) -> None:
    """Every check of this module, in the order a user would fix them."""
    check_run_config(cfg)
    check_schema(cfg, imports=False)
    check_float32_settings(cfg)
    check_dataset_name(cfg)
    check_metric_names(cfg)
    check_target_packages(cfg)


THREADS_PER_CORE = 4
"""``torch_threads`` above this many per core only oversubscribes the machine (and 100,000
threads exhaust its memory while the data loads)."""


def check_run_config(cfg: DictConfig) -> None:
    """``seed``, ``torch_threads`` and ``lightning_speedups``."""
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed must be an integer in [0, 2^32 - 1], got {seed!r}")
    threads = cfg.get("torch_threads")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ConfigError(f"torch_threads must be an integer >= 1 or null, got {threads!r}")
    cores = os.cpu_count() or 1
    if threads is not None and threads > THREADS_PER_CORE * cores:
        raise ConfigError(
            f"torch_threads={threads} is more than {THREADS_PER_CORE} threads per core of this "
            f"machine's {cores}: choose at most {THREADS_PER_CORE * cores} (null: torch's default)"
        )
    speedups = cfg.get("lightning_speedups", True)
    if not isinstance(speedups, bool):
        raise ConfigError(f"lightning_speedups must be true or false, got {speedups!r}")


def check_dataset_name(cfg: DictConfig) -> None:
    """Without ``data.loader``, ``data.name`` chooses the loader: a built-in dataset's name (from
    the key index) or a loader's dotted path."""
    data = cfg.get("data") or {}
    if data.get("_target_") != "vfl_lightning.data.VerticalDataModule" or data.get("loader"):
        return
    name = data.get("name")
    if not choice_or_dotted(*choices("datasets"))[0](name):
        close = difflib.get_close_matches(str(name), choices("datasets"), n=1)
        fix = f"did you mean data={close[0]}? " if close else ""
        raise ConfigError(
            f"data.name={name} is not a built-in dataset (with data.loader=null the name chooses "
            f"the loader): {fix}choose one with data=NAME ({', '.join(choices('datasets'))}), "
            "or set data.loader to your loader's dotted path package.module.function"
        )


FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SETTINGS = ("optimizer.lr", "optimizer.weight_decay", "optimizer.eps", "algo.server_lr")
"""Optimizer settings torch converts to the parameters' float32 when it steps."""


def check_float32_settings(cfg: DictConfig) -> None:
    """A setting of :data:`FLOAT32_SETTINGS` above float32's largest value (``optimizer.lr=1e308``:
    torch's update would fail with an overflow after the data is built)."""
    for key in FLOAT32_SETTINGS:
        value = OmegaConf.select(cfg, key, default=None)
        if is_number(value) and abs(value) > FLOAT32_MAX:
            raise ConfigError(
                f"{key}={value:g} is beyond float32's largest value ({FLOAT32_MAX:.4g}), which "
                "the parameters' update cannot take: choose a smaller value"
            )


def check_metric_names(cfg: DictConfig) -> None:
    """``optimized_metric`` (what a sweeper optimizes) and ``target.metric``: a ``val/`` or
    ``test/`` name must be one a validation or test logs (:data:`EVALUATION_METRICS`)."""
    target = cfg.get("target") or {}
    for key, value in (
        ("optimized_metric", cfg.get("optimized_metric")),
        ("target.metric", target.get("metric")),
    ):
        if value is None and key == "optimized_metric":
            continue
        if not isinstance(value, str) or "/" not in value:
            raise ConfigError(
                f"{key} must be a logged metric's name, e.g. val/acc or train/acc, got {value!r}"
            )
        stage, _, name = value.partition("/")
        if stage in ("val", "test") and name not in EVALUATION_METRICS:
            names = [f"{stage}/{n}" for n in EVALUATION_METRICS]
            close = [n for n in names if value.startswith(n) or n.startswith(value)]
            close = close or difflib.get_close_matches(value, names, n=1)
            fix = f"did you mean {key}={close[0]}?" if close else "choose one of them"
            raise ConfigError(
                f"{key}={value} is not a metric runs log ({stage}/ has {', '.join(names)}; auroc "
                f"and auprc with binary labels only): {fix}"
            )
    metric, goal = target.get("metric"), target.get("value")
    if target.get("stop") is True and goal is None:
        raise ConfigError(
            f"target.stop=true ends training when target.metric={metric} reaches target.value, "
            "but target.value is null, so it would never stop: set target.value (e.g. "
            "target.value=0.9), or target.stop=false"
        )
    bounded = isinstance(metric, str) and metric.partition("/")[2] in BOUNDED_METRICS
    if bounded and is_number(goal) and not 0 <= goal <= 1:
        raise ConfigError(
            f"target.value={goal} can never be reached by target.metric={metric}, which lies in "
            "[0, 1]: choose a value in [0, 1]"
        )


def target_nodes(node: DictConfig, prefix: str = ""):
    """``(dotted path, _target_)`` of every node that names a class, at any depth."""
    for key in node:
        value = node._get_node(key)
        if isinstance(value, DictConfig) and not value._is_none():
            path = f"{prefix}{key}"
            target = value.get("_target_")
            if isinstance(target, str):
                yield path, target
            yield from target_nodes(value, f"{path}.")


def check_target_packages(cfg: DictConfig) -> None:
    """A ``_target_`` outside the key index must at least name a package that is installed or
    already imported (a running script's ``__main__``, which has no import spec); its class is
    imported and checked after torch. ``algo._target_`` in Python's standard library (cheap to
    import, and never a protocol) is imported and refused here."""
    for path, target in target_nodes(cfg):
        if indexed_parameters(target) is not NOT_INDEXED:
            continue
        package = target.split(".")[0]
        imported = bool(package) and package in sys.modules
        if not imported and (not package or importlib.util.find_spec(package) is None):
            raise ConfigError(
                f"{path}._target_={target} cannot be imported: there is no module named "
                f"{package!r}: check the spelling, or install the package that provides it (or "
                "add its folder to PYTHONPATH)"
            )
        if path == "algo" and package in sys.stdlib_module_names:
            try:
                found = locate(target)
            except Exception as error:
                raise target_error(path, target, error) from None
            raise not_a_protocol(target, found)


def target_error(path: str, target: str, error: BaseException) -> ConfigError:
    """``<path>._target_`` names nothing that imports: why, and the fix."""
    reason = " ".join(str(error).split()) or type(error).__name__
    return ConfigError(
        f"{path}._target_={target} cannot be imported ({reason}): check the spelling, or "
        "install the package that provides it (or add its folder to PYTHONPATH)"
    )


def not_a_protocol(target: str, found) -> ConfigError:
    """``algo._target_`` names something other than a protocol class: what it is, and the fix."""
    kind = "a class" if isinstance(found, type) else f"a {type(found).__name__}"
    return ConfigError(
        f"algo._target_={target} is {kind}, not a protocol (a subclass of "
        "vfl_lightning.algorithms.base.VFLModule, e.g. vfl_lightning.algorithms.SyncVFL): name "
        "your protocol class there, or choose a shipped one with algo=NAME"
    )
