"""Refusals that need only the composed config and the classes it names (every ``_target_``
imports, the protocol class, accelerator, precision, optimizer, validation split, data
parallelism): one ConfigError each, before anything is built or any process is started."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from hydra.utils import get_class
from omegaconf import DictConfig

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.errors import ConfigError
from vfl_lightning.parallel import FederationDDPStrategy
from vfl_lightning.run.checks import algos_with
from vfl_lightning.run.early import not_a_protocol, target_error, target_nodes
from vfl_lightning.run.key_index import locate

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
SINGLE_PROCESS_STRATEGIES = (None, "auto", "single_device")


def check_config(cfg: DictConfig) -> None:
    """Every check of this module, in the order a user would fix them."""
    check_targets(cfg)
    algo = protocol_class(cfg)
    check_accelerator(cfg.trainer.get("accelerator", "auto"))
    algo.check_precision(cfg.trainer.get("precision", "32-true"))
    check_optimizer(cfg.optimizer)
    check_validation_split(cfg)
    check_data_parallel(cfg, algo)
    check_audit_data(cfg)
    check_partition(cfg.get("data"))


def check_targets(cfg: DictConfig) -> None:
    """Every ``_target_`` names something that imports."""
    for path, target in target_nodes(cfg):
        try:
            locate(target)
        except Exception as error:
            raise target_error(path, target, error) from None


def protocol_class(cfg: DictConfig) -> type[VFLModule]:
    """The class ``algo._target_`` names: a protocol (a :class:`VFLModule`)."""
    target = cfg.algo._target_
    found = locate(target)
    if not (isinstance(found, type) and issubclass(found, VFLModule)):
        raise not_a_protocol(target, found)
    return found


def check_accelerator(accelerator) -> None:
    """``trainer.accelerator``: a known name, and a device this machine has."""
    if not isinstance(accelerator, str):
        return
    if accelerator not in ACCELERATORS:
        raise ConfigError(f"trainer.accelerator must be one of {ACCELERATORS}, got {accelerator!r}")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(
            f"trainer.accelerator={accelerator} needs a CUDA GPU, but torch sees none (torch "
            f"{torch.__version__}, {build}): use trainer.accelerator=cpu or auto"
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            "trainer.accelerator=mps needs Apple's Metal backend, which this machine does not "
            "have: use trainer.accelerator=cpu or auto"
        )


def _number_at_least(value, low: float) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= low
    )


def check_optimizer(optimizer: DictConfig) -> None:
    """The optimizer's ``lr``, ``momentum``, ``weight_decay``, ``eps`` (finite numbers >= 0) and
    Adam's ``betas`` (two numbers in [0, 1)), before torch builds it."""
    for key in ("lr", "momentum", "weight_decay", "eps"):
        value = optimizer.get(key)
        if key in optimizer and not _number_at_least(value, 0.0):
            raise ConfigError(f"optimizer.{key} must be a finite number >= 0, got {value!r}")
    betas = optimizer.get("betas")
    pair = list(betas) if isinstance(betas, Sequence) and not isinstance(betas, str) else None
    if betas is not None and (
        pair is None or len(pair) != 2 or not all(_number_at_least(b, 0.0) and b < 1 for b in pair)
    ):
        raise ConfigError(f"optimizer.betas must be two numbers in [0, 1), got {pair or betas!r}")
    if optimizer.get("nesterov") and not (
        _number_at_least(optimizer.get("momentum"), 0.0)
        and optimizer.get("momentum") > 0
        and not optimizer.get("dampening")
    ):
        raise ConfigError(
            "optimizer.nesterov=true needs optimizer.momentum > 0 and optimizer.dampening=0, got "
            f"momentum={optimizer.get('momentum')!r}, dampening={optimizer.get('dampening', 0)!r}"
        )


def check_validation_split(cfg: DictConfig) -> None:
    """Refuse ``data.val_fraction=0`` when a validation metric is asked for: the sweepers'
    ``optimized_metric`` or a ``target`` with a value (otherwise silently missing); so is
    ``test=false`` with a ``test/`` ``optimized_metric``."""
    metric = cfg.get("optimized_metric")
    if not cfg.get("test", True) and metric and str(metric).startswith("test/"):
        raise ConfigError(
            f"test=false runs no test split, but optimized_metric={metric} needs one: set "
            "test=true, or choose a val/ metric"
        )
    fraction = cfg.data.get("val_fraction")
    if fraction is None or isinstance(fraction, bool) or fraction != 0:
        return
    needs = []
    metric = cfg.get("optimized_metric")
    if metric and str(metric).startswith("val/"):
        needs.append(f"optimized_metric={metric}")
    target = cfg.get("target") or {}
    if target.get("value") is not None and str(target.get("metric", "")).startswith("val/"):
        needs.append(f"target.metric={target.metric}")
    if needs:
        raise ConfigError(
            f"data.val_fraction=0 leaves no validation split, but {' and '.join(needs)} needs "
            "one: set data.val_fraction in (0, 1), or optimized_metric=null (and target.value="
            "null) to train without validation"
        )


def requested_processes(trainer: DictConfig) -> int:
    """How many processes ``trainer.devices`` x ``trainer.num_nodes`` asks Lightning for."""
    devices = trainer.get("devices", "auto")
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            devices = [d for d in text.split(",") if d.strip()]
        elif text.lstrip("-").isdigit():
            devices = int(text)
    if isinstance(devices, bool):
        count = 1
    elif isinstance(devices, int):
        gpu = str(trainer.get("accelerator")) in ("gpu", "cuda")
        count = (torch.cuda.device_count() if gpu else 1) if devices == -1 else devices
    elif isinstance(devices, str):
        count = 1
    else:
        count = len(devices)
    nodes = trainer.get("num_nodes", 1)
    return max(count, 1) * (nodes if isinstance(nodes, int) and nodes > 1 else 1)


def check_data_parallel(cfg: DictConfig, algo: type) -> None:
    """A multi-process trainer is refused here, before Lightning launches a second process, for
    a protocol that cannot split its batches over ranks, and for any strategy but ``trainer=ddp``
    (another one would not reduce the party gradients)."""
    strategy = cfg.trainer.get("strategy")
    named = strategy.get("_target_") if hasattr(strategy, "get") else strategy
    processes = requested_processes(cfg.trainer)
    if processes == 1 and named in SINGLE_PROCESS_STRATEGIES:
        return
    short = str(named).rsplit(".", 1)[-1]
    if not getattr(algo, "DATA_PARALLEL", False):
        raise ConfigError(
            f"algo={cfg.algo.get('name')} cannot run data-parallel (trainer.devices x "
            f"trainer.num_nodes = {processes} processes, strategy {short}): its protocol state is "
            f"not a function of each batch's rows; trainer=ddp runs "
            f"{algos_with(lambda protocol: protocol.DATA_PARALLEL)}. "
            "Use trainer=default (trainer.devices=1, no DDP strategy)"
        )
    federation = isinstance(named, str) and "." in named
    if not (federation and issubclass(get_class(named), FederationDDPStrategy)):
        raise ConfigError(
            f"trainer.strategy={short} with trainer.devices x trainer.num_nodes = {processes} "
            "processes would not reduce the party gradients (their backward bypasses "
            "DistributedDataParallel): use trainer=ddp, or trainer.devices=1"
        )


def check_partition(data) -> None:
    """``data.partition``: a known name or an importable function, its options named and typed
    as the function takes them (one line each, before anything is built)."""
    from omegaconf import OmegaConf

    from vfl_lightning.data.partition import partition_function

    if data is None or data.get("partition") is None:
        return
    partition = data.partition
    if OmegaConf.is_config(partition):
        partition = OmegaConf.to_container(partition, resolve=True)
    try:
        partition_function(partition)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_audit_data(cfg: DictConfig) -> None:
    """An ``audit=`` writes canaries into a built-in dataset, never into exported party files nor
    into rows that the PSI aligns; every configured callback with a ``check_protocol`` (the
    audits) checks the protocol and mechanism classes here, before anything is built or
    Lightning prints a line."""
    from vfl_lightning.data.files_datamodule import PartyFilesDataModule

    audits = sorted(cfg.data.get("canaries") or {})
    if audits and issubclass(get_class(cfg.data._target_), PartyFilesDataModule):
        raise ConfigError(
            f"audit={','.join(audits)} writes its canaries into the training data, but "
            "data=party_files reads exported party files: audit a built-in dataset"
        )
    overlap, psi = cfg.data.get("overlap", 1.0), cfg.data.get("psi", "auto")
    if audits and (overlap != 1 or psi != "auto"):
        raise ConfigError(
            f"audit={','.join(audits)} writes its canaries into every party's training rows, but "
            f"data.overlap={overlap} data.psi={psi} aligns the rows by the PSI: run the audit "
            "with data.overlap=1 data.psi=auto"
        )
    protocol = get_class(cfg.algo._target_)
    mechanism = get_class(cfg.mechanism._target_)
    for callback in (cfg.get("callbacks") or {}).values():
        target = callback.get("_target_") if hasattr(callback, "get") else None
        if not target:
            continue
        try:  # a class or a factory function; an unimportable one is named when the callbacks are built
            found = locate(target)
        except Exception:
            continue
        check = getattr(found, "check_protocol", None) if isinstance(found, type) else None
        if check is not None:
            check(protocol, callback.get("name", target.rsplit(".", 1)[-1]), mechanism)
