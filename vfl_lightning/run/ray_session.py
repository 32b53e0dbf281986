"""``runtime=ray`` (:class:`RayRuntime`): connect (or start a local instance), take the server's
data from a Ray task, move a module's parties into actors built by the run's party factory, and
disconnect what this run started."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.checkpoints import resumable_checkpoint
from vfl_lightning.errors import ConfigError
from vfl_lightning.run.checks import check_ray_runtime, check_time_scale, party_seeds
from vfl_lightning.run.runtimes import LocalRuntime, party_policy
from vfl_lightning.runtime.party_trust import PartyTrust

log = logging.getLogger(__name__)


def start_ray(cfg: DictConfig) -> bool:
    """Connect to Ray for ``runtime=ray``: start a local instance (``runtime.address=null``) or
    join a cluster (``auto``, ``ray://host:port``); returns whether this call started it."""
    try:
        import ray
        from ray._private import ray_constants
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
    # Ray's C++ handler would print a stack dump for a SIGTERM (the run stops with one line,
    # vfl_lightning.run.signals); Python's faulthandler still reports a crash. The environment
    # reaches the actors' processes, the constant this process (read when Ray was imported).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = (
        os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] == "1"
    )
    ray.init(address=address, include_dashboard=False, log_to_driver=False, **options)
    return True


def stop_ray() -> None:
    import ray

    ray.shutdown()


def party_trust(cfg: DictConfig) -> PartyTrust:
    """The run's :class:`PartyTrust` from ``runtime.party_seeds``, ``runtime.party_dir``
    (made absolute: the actors may run in another working directory; null: each party's machine
    names it) and ``runtime.known_parties``."""
    party_dir = cfg.runtime.get("party_dir")
    known = cfg.runtime.get("known_parties")
    if OmegaConf.is_config(known):
        known = OmegaConf.to_container(known, resolve=True)
    if known is not None and not isinstance(known, dict):
        raise ConfigError(
            f"runtime.known_parties must be a mapping {{party index: 64 hex digits}} or null, "
            f"got {known!r}"
        )
    return PartyTrust(
        party_seeds=party_seeds(cfg),
        party_dir=None if party_dir is None else str(Path(party_dir).resolve()),
        known_parties=known,
    )


def attach_ray_parties(cfg: DictConfig, module: VFLModule, datamodule=None) -> None:
    """Move the parties of ``module`` into Ray actors built by the run's :class:`PartyFactory`;
    the server's mechanism keeps no secure-aggregation pair seed. When the rows of ``datamodule``
    (the server's) await the PSI, the server runs it with the actors and keeps the aligned rows."""
    from vfl_lightning.runtime.registry import ray_parties

    resources = cfg.runtime.get("party_resources")
    if OmegaConf.is_config(resources):
        resources = OmegaConf.to_container(resources, resolve=True)
    trust = party_trust(cfg)
    if trust.party_seeds == "derived":
        log.warning(
            "runtime.party_seeds=derived: every party's noise (PBM counts, LDP noise, ZOO "
            "directions, FedVS shares) is derived from the run's seed and known to whoever holds "
            "the config; runtime.party_seeds=private keeps it inside each party"
        )
    parties = ray_parties(
        module,
        PartyFactory.from_config(cfg),
        time_scale=check_time_scale(cfg.runtime.get("time_scale")),
        party_resources=resources,
        trust=trust,
        ledger=module.wire.ledger,
        round_fn=lambda: module.wire.ledger.rounds,
        checkpoint_fn=lambda: resumable_checkpoint(module._trainer),
        device_fn=lambda: module.device,
        codec_fn=lambda: module.wire.downlink_codec,
        policy=party_policy(cfg),
        label_holder_ids=None if datamodule is None else datamodule.label_holder_ids,
        exchange=cfg.runtime.get("exchange", "tasks"),
    )
    if parties.alignment is not None:
        datamodule.apply_alignment(parties.alignment)
    if module.mechanism.uses_pair_masks:
        module.mechanism.set_pair_seeds({})
    speeds = cfg.algo.get("client_speeds")
    if speeds is not None:
        parties.set_work_delays([float(s) for s in speeds], float(cfg.runtime.time_scale))
    module.attach_parties(parties)


class RayRuntime(LocalRuntime):
    """Every party a Ray actor holding only its own columns, model, optimizer, state and secrets;
    the server (this Lightning process) holds sample ids, labels and the head (docs/runtime.md)."""

    PRIVATE_SEEDS = True

    SETTINGS = (
        "name",
        "address",
        "num_cpus",
        "party_resources",
        "exchange",
        "time_scale",
        "party_seeds",
        "party_dir",
        "known_parties",
    )

    def __init__(self, name: str = "ray", **settings) -> None:
        super().__init__(name, **settings)
        self.started = False
        self.datamodule = None

    @classmethod
    def check(cls, cfg: DictConfig, protocol: type) -> None:
        check_ray_runtime(cfg, protocol)

    def start(self, cfg: DictConfig) -> bool:
        self.started = start_ray(cfg)
        return self.started

    def server_side(self, factory: PartyFactory):
        """The data module (labels and ids only) and the party widths from a Ray task
        (:func:`~vfl_lightning.runtime.server_data.server_setup`); no party model here."""
        from vfl_lightning.runtime.server_data import server_setup

        setup = server_setup(factory)
        self.datamodule = setup.datamodule
        return setup.datamodule, [], list(setup.widths)

    def attach(self, cfg: DictConfig, module: VFLModule) -> None:
        attach_ray_parties(cfg, module, self.datamodule)

    def stop(self) -> None:
        if self.started:
            stop_ray()
            self.started = False
