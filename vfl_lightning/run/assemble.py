"""Assembly: the data module, parties, head, mechanism and protocol from a Hydra config (the party
side through the same :class:`PartyFactory` the Ray actors use), the callbacks, loggers, trainer."""

from __future__ import annotations

import lightning as L
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.checkpoints import AtomicCheckpointIO
from vfl_lightning.errors import ConfigError
from vfl_lightning.run.checks import runtime_name
from vfl_lightning.run.outcome import root_cause


def build(cfg: DictConfig):
    """Instantiate (datamodule, module) from ``cfg``; runtime sizes are passed at instantiation.

    ``runtime=ray`` (Ray already started): the data module and the party widths come from
    :func:`~vfl_lightning.runtime.server_data.server_setup` (no party column, no party model in
    this process; the parties' actors build their own)."""
    get_class(cfg.algo._target_).check_party_class(get_class(cfg.party._target_), cfg.algo.name)
    factory = PartyFactory.from_config(cfg)
    if runtime_name(cfg) == "ray":
        from vfl_lightning.runtime.server_data import server_setup

        setup = server_setup(factory)
        datamodule, widths, parties = setup.datamodule, list(setup.widths), []
        sizes = {"party_widths": widths}
    else:
        datamodule = factory.datamodule()
        parties = factory.party_models(datamodule.party_shapes)
        widths, sizes = [p.embedding_dim for p in parties], {}
    num_parties = len(widths)
    # An active label holder (data.active_party=true) gets its own party model for its own slice.
    server_shape = getattr(datamodule, "server_shape", None)
    server_party = None if server_shape is None else factory.party_models([server_shape])[0]
    mechanism = factory.mechanism(num_parties)
    if server_party is not None:
        widths = [*widths, server_party.embedding_dim]
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
        optimizer=factory.optimizer(),
        num_classes=datamodule.num_classes,
        seed=cfg.seed,
        network=network,
        **sizes,
        **active,
    )
    return datamodule, module


def build_in_data_dir(cfg: DictConfig):
    """:func:`build`, with a filesystem error under ``paths.data_dir`` named as that key."""
    try:
        return build(cfg)
    except Exception as error:
        cause = root_cause(error)
        data_dir = str(cfg.paths.get("data_dir", ""))
        if isinstance(cause, OSError) and str(cause.filename or "").startswith(data_dir or "\0"):
            raise ConfigError(
                f"paths.data_dir={data_dir} cannot be used: {cause.strerror or cause} "
                f"({cause.filename})"
            ) from error
        raise


def make_loggers(cfg: DictConfig) -> list:
    return [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]


def make_callbacks(cfg: DictConfig) -> list:
    """The configured callbacks; the progress bar only when ``trainer.enable_progress_bar``."""
    from lightning.pytorch.callbacks import ProgressBar

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def make_trainer(
    cfg: DictConfig, callbacks: list, loggers: list, resuming: bool = False
) -> L.Trainer:
    """The configured trainer, writing checkpoints atomically. A resumed run skips the sanity
    check: the run it continues made it, and its evaluation releases are accounted once."""
    skip_sanity = {"num_sanity_val_steps": 0} if resuming else {}
    return instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO()],
        **skip_sanity,
    )
