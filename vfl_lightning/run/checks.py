"""Refusals that happen before anything trains, one ConfigError line each: the output directory,
the runtime and what ``runtime=ray`` runs (before anything is built), and what the privacy
accountant can account (once the mechanism is built)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig

from vfl_lightning.algorithms.parties import PARTY_SEEDS
from vfl_lightning.errors import ConfigError
from vfl_lightning.files import unwritable
from vfl_lightning.privacy.analysis.pbm import check_pbm_privacy_parameters
from vfl_lightning.privacy.callback import PrivacyCallback
from vfl_lightning.run.runtimes import check_settings, party_policy, runtime_class


def check_output_dir(output_dir: Path) -> None:
    """Create ``paths.output_dir``, or one ConfigError saying why it cannot be used."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"paths.output_dir={output_dir} cannot be created: {error}") from error
    if not os.access(output_dir, os.W_OK):
        raise ConfigError(f"paths.output_dir={output_dir} is not writable")


def check_checkpoint_dir(cfg: DictConfig) -> None:
    """``callbacks.checkpoint.dirpath`` can be made and written (the first checkpoint would
    otherwise fail inside fit, after the first epoch)."""
    from omegaconf import OmegaConf

    dirpath = OmegaConf.select(cfg, "callbacks.checkpoint.dirpath", default=None)
    problem = isinstance(dirpath, str) and dirpath and unwritable(Path(dirpath))
    if problem:
        raise ConfigError(
            f"callbacks.checkpoint.dirpath={dirpath} cannot be used: {problem}; choose a "
            "directory you can write (by default the run's <paths.output_dir>/checkpoints)"
        )


def runtime_name(cfg: DictConfig) -> str:
    runtime = cfg.get("runtime") or {}
    return str(runtime.get("name", "local"))


def algo_config_dirs() -> list[Path]:
    """The ``algo/`` folders of the running job's file config sources (none outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        sources = HydraConfig.get().runtime.config_sources
    except ValueError:
        return []
    folders = [Path(source.path) / "algo" for source in sources if source.schema == "file"]
    return [folder for folder in folders if folder.is_dir()]


def algo_targets(folder: Path) -> dict[str, str]:
    """``{algo name: _target_}`` of the algo configs in ``folder``; a delta config (its first
    default another algo file) takes the target of the file it extends."""
    from omegaconf import OmegaConf

    files = {path.stem: OmegaConf.load(path) for path in folder.glob("*.yaml")}

    def target(name: str, seen: tuple[str, ...] = ()) -> str | None:
        config = files[name]
        own = OmegaConf.select(config, "algo._target_")
        if own is not None or name in seen:
            return own
        bases = [d for d in config.get("defaults", []) if isinstance(d, str) and d in files]
        return target(bases[0], (*seen, name)) if bases else None

    return {name: target(name) for name in files}


def algos_with(capability: Callable[[type], bool]) -> str:
    """The algo names whose protocol class has ``capability``, read from the job's algo configs;
    outside a Hydra job, those protocol classes of the library."""
    from vfl_lightning import algorithms

    names = set()
    for folder in algo_config_dirs():
        for name, target in algo_targets(folder).items():
            if target is not None and capability(get_class(target)):
                names.add(name)
    if names:
        return f"algo={', '.join(sorted(names))}"
    classes = [n for n in algorithms.__all__ if capability(getattr(algorithms, n))]
    return f"the protocols of {', '.join(classes)}"


def check_runtime(cfg: DictConfig) -> None:
    """Refuse a runtime that cannot be imported, a protocol that does not run on it (its
    ``RUNTIMES``), and what the runtime itself refuses (:meth:`LocalRuntime.check`)."""
    runtime = runtime_class(cfg)
    check_settings(cfg, runtime)
    name = runtime_name(cfg)
    party_seeds(cfg)
    party_policy(cfg)
    algo = get_class(cfg.algo._target_)
    if name not in algo.RUNTIMES:
        raise ConfigError(
            f"algo={cfg.algo.get('name')} does not run on runtime={name} (it runs on "
            f"{', '.join(algo.RUNTIMES)}); runtime={name} runs "
            f"{algos_with(lambda protocol: name in protocol.RUNTIMES)}"
        )
    runtime.check(cfg, algo)


def check_ray_runtime(cfg: DictConfig, algo: type) -> None:
    """What ``runtime=ray`` refuses: its time scale, party directory, the asynchronous family's
    options it does not run, and a multi-process trainer."""
    check_time_scale(cfg.runtime.get("time_scale"))
    check_party_dir(
        cfg.runtime.get("party_dir"),
        cfg.get("paths", {}).get("output_dir"),
        on_this_machine=cfg.runtime.get("address") is None,
    )
    check_ray_options(algo, cfg.algo)
    check_ray_evaluation_release(cfg.get("mechanism") or {}, cfg.algo.get("dp"))
    strategy = cfg.trainer.get("strategy")
    if strategy not in (None, "auto") or cfg.trainer.get("num_nodes", 1) != 1:
        raise ConfigError(
            "runtime=ray runs one server process: use trainer.strategy=auto and "
            f"trainer.num_nodes=1 (got strategy {strategy!r}); scale out with more party actors"
        )


def party_seeds(cfg: DictConfig) -> str:
    """``runtime.party_seeds``: ``private`` (entropy drawn inside each party actor) or
    ``derived`` (from the run's seed); runtime=local is always derived."""
    runtime = cfg.get("runtime") or {}
    value = runtime.get("party_seeds", "derived")
    if value not in PARTY_SEEDS:
        raise ConfigError(f"runtime.party_seeds must be one of {PARTY_SEEDS}, got {value!r}")
    if value == "private" and not runtime_class(cfg).PRIVATE_SEEDS:
        raise ConfigError(
            f"runtime.party_seeds=private needs runtime=ray or grpc (runtime={runtime_name(cfg)} "
            "simulates every party in one process from the run's seed: its party seeds are "
            "always derived)"
        )
    return value


def check_ray_evaluation_release(mechanism, dp=None) -> None:
    """Refuse ``mechanism.apply_at_eval=false`` with a noisy mechanism, and Wait-DP's
    ``algo.dp.at_eval=false``, under ``runtime=ray``: every validation and test would release
    each party's clean embedding (ε = ∞), and a party sends only through its mechanism."""
    if dp is not None and not dp.get("at_eval", True):
        raise ConfigError(
            "algo.dp.at_eval=false under runtime=ray: every validation and test would release "
            "each client's clean embedding (epsilon = inf); keep algo.dp.at_eval=true "
            "(runtime=local simulates the clean evaluation)"
        )
    target = mechanism.get("_target_")
    if target is None or mechanism.get("apply_at_eval", True):
        return
    if get_class(target).noisy:
        raise ConfigError(
            f"mechanism.apply_at_eval=false under runtime=ray: every validation and test would "
            f"release each party's clean embedding (epsilon = inf), and a {target.rsplit('.', 1)[-1]} "
            "party releases only through its mechanism; keep mechanism.apply_at_eval=true "
            "(runtime=local simulates the clean evaluation)"
        )


def check_party_dir(
    party_dir, output_dir: str | None = None, *, on_this_machine: bool = False
) -> None:
    """``runtime.party_dir``: null (each party's machine names its directory) or a directory path
    outside the server's run directory ``output_dir``; with ``on_this_machine`` (Ray started here,
    so the parties write here) one that can be made and written, checked before any party
    starts."""
    if party_dir is None:
        return
    if not isinstance(party_dir, str) or not party_dir.strip() or Path(party_dir).is_file():
        raise ConfigError(
            f"runtime.party_dir must be null (each party's machine names its own directory) or a "
            f"directory path where each party keeps its state, got {party_dir!r}"
        )
    if output_dir and Path(party_dir).resolve().is_relative_to(Path(output_dir).resolve()):
        raise ConfigError(
            f"runtime.party_dir must lie outside the server's run directory {output_dir} (the "
            f"server reads everything there), got {party_dir!r}; null lets each party's machine "
            "name its own"
        )
    problem = on_this_machine and unwritable(Path(party_dir))
    if problem:
        raise ConfigError(
            f"runtime.party_dir={party_dir} cannot be used: {problem}; choose a directory you can "
            "write, or runtime.party_dir=null (each party's machine names its own)"
        )


def check_ray_options(algo_class: type, algo) -> None:
    """Refuse, in one line each, what ``runtime=ray`` does not run of the asynchronous family:
    ``algo.activation_order`` (the arrival order is real) and ``algo.epoch=server_iterations``
    (one client per batch)."""
    from vfl_lightning.algorithms.asynchronous import HybridVFL

    if not issubclass(algo_class, HybridVFL):
        return
    name = algo.get("name")
    if algo.get("activation_order") is not None:
        raise ConfigError(
            f"algo.activation_order={list(algo.activation_order)} cannot be used with runtime=ray: "
            f"the clients' messages are taken in the order they really arrive (set "
            f"algo.client_speeds to make some clients slower, or use runtime=local for algo={name})"
        )
    if not algo.get("synchronous") and algo.get("epoch") == "server_iterations":
        raise ConfigError(
            f"algo.epoch=server_iterations is not supported with runtime=ray (algo={name}): every "
            "batch goes to all clients and their messages are taken as they arrive; use "
            "algo.epoch=client_pass, or runtime=local"
        )


def check_time_scale(value) -> float:
    """``runtime.time_scale``: real seconds a party sleeps per modelled second of delay (FedVS's
    straggler delays, the asynchronous family's work times from ``algo.client_speeds``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"runtime.time_scale must be a finite number > 0 (real seconds slept per modelled "
            f"second of delay), got {value!r}"
        )
    return float(value)


def check_accounting(module, callbacks: list) -> None:
    """With a privacy accountant (a :class:`PrivacyCallback`) and PBM's analysis, refuse before
    fit what the accountant would refuse at the first epoch's end: M·b beyond its exact range."""
    mechanism = module.mechanism
    accounted = any(isinstance(c, PrivacyCallback) for c in callbacks)
    if accounted and getattr(mechanism, "accounting", None) == "pbm":
        check_pbm_privacy_parameters(mechanism.b, mechanism.beta, mechanism.num_parties, 1)
