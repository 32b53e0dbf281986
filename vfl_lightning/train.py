"""train(cfg): build data, parties, head, mechanism, algorithm, trainer from a Hydra config, fit,
test, and write results.json. Importable; the root train.py only adds @hydra.main."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.checkpoints import AtomicCheckpointIO, LastCheckpoint
from vfl_lightning.curve import CurveWriter
from vfl_lightning.errors import ConfigError, error_summary, root_cause
from vfl_lightning.loggers import quiet_lightning
from vfl_lightning.summary import print_summary

log = logging.getLogger(__name__)


def _hydra_choices() -> dict:
    try:
        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}


def _complete(cfg: DictConfig, group: str, **runtime):
    """Instantiate the partial config ``cfg[group]`` with the runtime sizes; an option the chosen
    class does not take (set for another choice by an algo, experiment or attack config) becomes
    one ConfigError naming it."""
    factory = instantiate(cfg[group])
    try:
        return factory(**runtime)
    except TypeError as error:
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(error))
        if unknown is None:
            raise
        choices = _hydra_choices()
        chosen = ", ".join(
            f"{g}={choices[g]}" for g in ("algo", "experiment", "attack") if choices.get(g)
        )
        raise ConfigError(
            f"{group}={choices.get(group, cfg[group].get('_target_'))} has no option "
            f"{group}.{unknown.group(1)}, which the chosen configs set ({chosen}): this "
            f"combination is not supported; choose another {group} or drop the option with "
            f"~{group}.{unknown.group(1)}"
        ) from error


def build(cfg: DictConfig):
    """Instantiate (datamodule, module) from ``cfg``; runtime sizes are passed at instantiation."""
    get_class(cfg.algo._target_).check_party_class(get_class(cfg.party._target_), cfg.algo.name)
    datamodule = instantiate(cfg.data)
    num_parties = len(datamodule.party_shapes)
    parties = [_complete(cfg, "party", input_shape=shape) for shape in datamodule.party_shapes]
    # An active label holder (data.active_party=true) gets its own party model for its own slice.
    server_shape = getattr(datamodule, "server_shape", None)
    server_party = (
        None if server_shape is None else _complete(cfg, "party", input_shape=server_shape)
    )
    mechanism = _complete(cfg, "mechanism", num_parties=num_parties)
    widths = [p.embedding_dim for p in parties]
    if server_party is not None:
        widths.append(server_party.embedding_dim)
    head = instantiate(cfg.head)(
        in_features=mechanism.fused_width(widths), num_classes=datamodule.num_classes
    )
    active = {} if server_party is None else {"server_party": server_party}
    network = instantiate(cfg.network) if cfg.get("network") is not None else None
    module = instantiate(
        cfg.algo,
        parties=parties,
        head=head,
        mechanism=mechanism,
        optimizer=instantiate(cfg.optimizer),
        num_classes=datamodule.num_classes,
        seed=cfg.seed,
        network=network,
        **active,
    )
    return datamodule, module


RUNTIMES = ("local", "ray")
RAY_ALGOS = (
    "synchronous: splitnn, npq, pbm, ldp, fedsgd, fedbcd, fedbcd_s, fedpbcd; asynchronous: cascade, "
    "zoo_vfl, syn_zoo_vfl, vafl; FedVS: fedvs, fedvs_wait, fedvs_ignore, fedvs_wait_dp"
)


def runtime_name(cfg: DictConfig) -> str:
    runtime = cfg.get("runtime") or {}
    return str(runtime.get("name", "local"))


def check_runtime(cfg: DictConfig) -> None:
    """Refuse an unknown runtime, and runtime=ray for protocols or trainers it does not run."""
    name = runtime_name(cfg)
    if name not in RUNTIMES:
        raise ConfigError(f"runtime must be one of {RUNTIMES}, got {name!r}")
    if name == "local":
        return
    algo = get_class(cfg.algo._target_)
    if name not in algo.RUNTIMES:
        raise ConfigError(
            f"algo={cfg.algo.get('name')} does not run in the Ray runtime (it runs on "
            f"{', '.join(algo.RUNTIMES)}); runtime=ray runs {RAY_ALGOS}"
        )
    check_time_scale(cfg.runtime.get("time_scale"))
    check_ray_options(algo, cfg.algo)
    strategy = cfg.trainer.get("strategy")
    if strategy not in (None, "auto") or cfg.trainer.get("num_nodes", 1) != 1:
        raise ConfigError(
            "runtime=ray runs one server process: use trainer.strategy=auto and "
            f"trainer.num_nodes=1 (got strategy {strategy!r}); scale out with more party actors"
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


def start_ray(cfg: DictConfig) -> bool:
    """Connect to Ray for ``runtime=ray``: start a local instance (``runtime.address=null``) or
    join a cluster (``auto``, ``ray://host:port``); returns whether this call started it."""
    try:
        import ray
    except ImportError as error:
        raise ConfigError(
            "runtime=ray needs Ray, which is not installed: pip install -c constraints.txt "
            '-e ".[ray]" (the dev install includes it)'
        ) from error
    if ray.is_initialized():
        return False
    runtime = cfg.runtime
    address = runtime.get("address")
    options = {"num_cpus": runtime.get("num_cpus")} if address is None else {}
    ray.init(address=address, include_dashboard=False, log_to_driver=False, **options)
    return True


def attach_ray_parties(cfg: DictConfig, module: VFLModule) -> None:
    """Move the parties of ``module`` into Ray actors built from the run's configuration; the
    server's mechanism keeps no secure-aggregation pair seed."""
    from vfl_lightning.runtime.ray_parties import ACTOR_GROUPS

    config = {
        key: OmegaConf.to_container(cfg[key], resolve=True)
        if OmegaConf.is_config(cfg[key])
        else cfg[key]
        for key in ACTOR_GROUPS
    }
    parties = module.ray_parties(
        config,
        time_scale=check_time_scale(cfg.runtime.get("time_scale")),
        party_resources=OmegaConf.to_container(cfg.runtime.get("party_resources"), resolve=True)
        if OmegaConf.is_config(cfg.runtime.get("party_resources"))
        else cfg.runtime.get("party_resources"),
        ledger=module.wire.ledger,
        round_fn=lambda: module.wire.ledger.rounds,
        device_fn=lambda: module.device,
    )
    if module.mechanism.uses_pair_masks:
        module.mechanism.set_pair_seeds({})
    speeds = cfg.algo.get("client_speeds")
    if speeds is not None:
        parties.set_work_delays([float(s) for s in speeds], float(cfg.runtime.time_scale))
    module.attach_parties(parties)


def _loggers(cfg: DictConfig) -> list:
    return [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]


def _callbacks(cfg: DictConfig) -> list:
    """The configured callbacks; the progress bar only when ``trainer.enable_progress_bar``."""
    from lightning.pytorch.callbacks import ProgressBar

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def _scalar(value) -> float | int | str | None:
    if hasattr(value, "item"):
        return value.item()
    return value


PROTOCOL_KEYS = ("seed", "data", "party", "head", "algo", "mechanism", "optimizer")
"""Config groups a resumed run must keep: they define the data split, the protocol and its state."""
NOT_PROTOCOL = {"data.data_dir"}


def protocol_config(cfg: DictConfig) -> dict:
    """The resolved protocol-relevant configuration, flattened to ``{"group.key": value}``."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif prefix not in NOT_PROTOCOL:
            flat[prefix] = value

    for key in PROTOCOL_KEYS:
        node = cfg.get(key)
        walk(key, OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node)
    return flat


def load_resume_checkpoint(path: str) -> dict:
    """The checkpoint at ``path``, or one ConfigError naming the path and what is wrong with it."""
    if not Path(path).is_file():
        raise ConfigError(f"ckpt_path={path} does not exist or is not a file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise ConfigError(
            f"ckpt_path={path} is not a readable checkpoint (truncated, empty or another kind of "
            f"file): {type(error).__name__}: {reason}"
        ) from error
    if not isinstance(checkpoint, dict) or "vfl" not in checkpoint:
        raise ConfigError(f"ckpt_path={path} was not written by vfl_lightning (no 'vfl' state)")
    return checkpoint


def check_resume_config(checkpoint: dict, config: dict, path: str) -> None:
    """Refuse a resume whose protocol configuration differs from the checkpoint's, naming keys."""
    stored = checkpoint["vfl"].get("config")
    if stored is None:
        raise ConfigError(
            f"ckpt_path={path} holds no run configuration (written by an older version): its data "
            "split and protocol cannot be checked, start a new run"
        )
    changed = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
    if changed:
        listed = ", ".join(
            f"{k}={config.get(k)!r} (checkpoint: {stored.get(k)!r})" for k in changed
        )
        raise ConfigError(
            f"resuming from ckpt_path={path} with a different configuration: {listed}; a resumed "
            f"run must keep {', '.join(PROTOCOL_KEYS)} (start a new run to change them)"
        )


def check_run_config(cfg: DictConfig) -> None:
    """Refusals that must happen before anything is built (one ConfigError each)."""
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed must be an integer in [0, 2^32 - 1], got {seed!r}")
    threads = cfg.get("torch_threads")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ConfigError(f"torch_threads must be an integer >= 1 or null, got {threads!r}")
    precision = str(cfg.trainer.get("precision", "32-true"))
    if precision not in VFLModule.SUPPORTED_PRECISION:
        raise ConfigError(
            f"trainer.precision must be one of {VFLModule.SUPPORTED_PRECISION}, got {precision!r} "
            "(float16 AMP scales the loss, so scaled gradients would cross the wire)"
        )


def strict_json(value):
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN/Infinity)."""
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(path: Path, results: dict) -> None:
    """results.json, strict JSON, replaced atomically."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as f:
        json.dump(strict_json(results), f, indent=2, sort_keys=True, allow_nan=False)
    temporary.replace(path)


def _with_path_context(build_fn, cfg: DictConfig):
    """``build_fn(cfg)``, with a filesystem error under ``paths.data_dir`` named as that key."""
    try:
        return build_fn(cfg)
    except Exception as error:
        cause = root_cause(error)
        data_dir = str(cfg.paths.get("data_dir", ""))
        if isinstance(cause, OSError) and str(cause.filename or "").startswith(data_dir or "\0"):
            raise ConfigError(
                f"paths.data_dir={data_dir} cannot be used: {cause.strerror or cause} "
                f"({cause.filename})"
            ) from error
        raise


_FROZEN = False


def freeze_import_time_objects() -> None:
    """Take every object alive at the first run of this process (about 500,000 once torch,
    Lightning, Hydra and W&B are imported: modules, classes, functions) out of the cyclic garbage
    collector's view (``gc.freeze``). Otherwise a full collection, which scans them all, falls
    somewhere inside a run (about 0.2 s on a 2-core machine, a tenth of a small run). Objects made
    by runs are collected as usual; later runs of the process (a multirun) freeze nothing more."""
    global _FROZEN
    if not _FROZEN:
        gc.freeze()
        _FROZEN = True


def train(cfg: DictConfig) -> dict:
    """Train and test the configured protocol; return (and write) the results dictionary.

    ``results.json`` is written whatever happens, with ``status``: ``finished``, ``failed``
    (with ``error``, also logged) or ``interrupted``; W&B is finished with a non-zero exit code
    unless the run finished.
    """
    started = time.perf_counter()
    freeze_import_time_objects()
    output_dir = Path(cfg.paths.output_dir)
    results: dict = {"status": "failed", "algo": cfg.algo.get("name"), "seed": cfg.get("seed")}
    trainer: L.Trainer | None = None
    module: VFLModule | None = None
    started_ray = False
    try:
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(
                f"paths.output_dir={output_dir} cannot be created: {error}"
            ) from error
        if not os.access(output_dir, os.W_OK):
            raise ConfigError(f"paths.output_dir={output_dir} is not writable")
        check_run_config(cfg)
        check_runtime(cfg)
        if cfg.get("torch_threads"):
            torch.set_num_threads(int(cfg.torch_threads))
        quiet_lightning()
        L.seed_everything(cfg.seed, workers=True)
        config = protocol_config(cfg)
        ckpt_path = cfg.get("ckpt_path")
        if ckpt_path is not None:
            check_resume_config(load_resume_checkpoint(str(ckpt_path)), config, str(ckpt_path))
        datamodule, module = _with_path_context(build, cfg)
        module.run_config = config
        if runtime_name(cfg) == "ray":
            started_ray = start_ray(cfg)
            attach_ray_parties(cfg, module)
        callbacks = _callbacks(cfg)
        loggers = _loggers(cfg)
        trainer = instantiate(
            cfg.trainer,
            callbacks=callbacks,
            logger=loggers or False,
            plugins=[AtomicCheckpointIO()],
        )
        for logger in loggers:
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        # the checkpoint was unpickled in full above (load_resume_checkpoint): Lightning's own
        # weights-only load would refuse list-valued hyperparameters (e.g. algo.client_speeds)
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=False)
        module.check_finite()
        fit_metrics = {k: _scalar(v) for k, v in trainer.callback_metrics.items()}
        test_metrics = {}
        if cfg.get("test", True) and not trainer.fast_dev_run:
            for row in trainer.test(module, datamodule=datamodule, verbose=False):
                test_metrics |= {k: _scalar(v) for k, v in row.items()}
        choices = _hydra_choices()
        results |= {
            "algo": cfg.algo.get("name"),
            "mechanism": choices.get("mechanism", cfg.mechanism.get("_target_")),
            "data": cfg.data.get("name"),
            "party": choices.get("party"),
            "head": choices.get("head"),
            "num_parties": module.num_parties,
            "active_party": module.server_party is not None,
            "seed": cfg.seed,
            "runtime": runtime_name(cfg),
            "model_digest": module.model_digest(),
            "epochs": int(trainer.current_epoch),
            "global_step": int(trainer.global_step),
            **{k: v for k, v in fit_metrics.items() if not k.startswith("test/")},
            **test_metrics,
            **module.results(),
        }
        for callback in callbacks:
            if hasattr(callback, "results"):
                results |= callback.results()
        checkpoint = next((c for c in callbacks if isinstance(c, LastCheckpoint)), None)
        if checkpoint is not None and checkpoint.last_model_path:
            results["checkpoint"] = checkpoint.last_model_path
        results["status"] = "finished"
        curve = next((c.path for c in callbacks if isinstance(c, CurveWriter)), None)
        for logger in loggers:
            if hasattr(logger, "finish_run"):
                logger.finish_run(results, curve)
        return results
    except BaseException as error:
        # Lightning turns Ctrl-C into sys.exit(1) raised while handling the KeyboardInterrupt.
        interrupted = isinstance(error, KeyboardInterrupt) or (
            isinstance(error, SystemExit) and isinstance(error.__context__, KeyboardInterrupt)
        )
        results["status"] = "interrupted" if interrupted else "failed"
        if trainer is not None:
            results |= {"epochs": int(trainer.current_epoch), "global_step": trainer.global_step}
        if module is not None:
            results |= module.communication_metrics()
        results["error"] = error_summary(error)
        log.error("run %s: %s", results["status"], results["error"])
        raise
    finally:
        if module is not None:
            module.party_side.close()
        if started_ray:
            import ray

            ray.shutdown()
        results["time/wall_s"] = time.perf_counter() - started
        # With trainer=ddp every rank holds the same totals: rank 0 alone writes them.
        rank_zero = trainer is None or trainer.is_global_zero
        written = rank_zero and output_dir.is_dir() and os.access(output_dir, os.W_OK)
        if written:
            write_results(output_dir / "results.json", results)
        _finish_wandb(0 if results["status"] == "finished" else 1)
        if written:
            print_summary(results, output_dir)


def _finish_wandb(exit_code: int) -> None:
    """Close any W&B run (with the run's exit code) so one failed multirun job does not poison
    the next."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)
