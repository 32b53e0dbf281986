"""The Ray session of ``runtime=ray``: connect (or start a local instance), move a module's
parties into actors built by the run's party factory, and disconnect what this run started."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.errors import ConfigError
from vfl_lightning.run.checks import check_time_scale


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


def stop_ray() -> None:
    import ray

    ray.shutdown()


def attach_ray_parties(cfg: DictConfig, module: VFLModule) -> None:
    """Move the parties of ``module`` into Ray actors built by the run's :class:`PartyFactory`;
    the server's mechanism keeps no secure-aggregation pair seed."""
    from vfl_lightning.runtime.registry import ray_parties

    resources = cfg.runtime.get("party_resources")
    if OmegaConf.is_config(resources):
        resources = OmegaConf.to_container(resources, resolve=True)
    parties = ray_parties(
        module,
        PartyFactory.from_config(cfg),
        time_scale=check_time_scale(cfg.runtime.get("time_scale")),
        party_resources=resources,
        party_dir=cfg.runtime.get("party_dir"),
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
