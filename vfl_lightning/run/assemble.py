"""Assembly: the data module, parties, head, mechanism and protocol from a Hydra config (the party
side through the same :class:`PartyFactory` the Ray actors use), the callbacks, loggers, trainer."""

from __future__ import annotations

import lightning as L
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from vfl_lightning.algorithms.local_parties import LocalParties
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.checkpoints import AtomicCheckpointIO
from vfl_lightning.run.outcome import data_dir_error
from vfl_lightning.run.runtimes import LocalRuntime, make_runtime


def build(cfg: DictConfig, runtime: LocalRuntime | None = None):
    """Instantiate (datamodule, module) from ``cfg``; runtime sizes are passed at instantiation.

    The data module and the party models the server's process holds come from the
    ``runtime`` (default: the one ``cfg.runtime`` names, :meth:`LocalRuntime.server_side`):
    ``runtime=ray`` (Ray already started) holds no party column and no party model here."""
    get_class(cfg.algo._target_).check_party_class(get_class(cfg.party._target_), cfg.algo.name)
    factory = PartyFactory.from_config(cfg)
    runtime = make_runtime(cfg) if runtime is None else runtime
    datamodule, parties, party_widths = runtime.server_side(factory)
    widths = list(party_widths)
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
        party_widths=party_widths,
        **active,
    )
    records = getattr(datamodule, "canary_records", {})
    if records and isinstance(module.party_side, LocalParties):
        module.party_side.use_canaries(records, len(datamodule.splits["train"]))
    return datamodule, module


def charge_alignment(module, datamodule) -> None:
    """Count the sample alignment of ``datamodule`` (its PSI report, if one ran) on the module's
    wire before training: its bytes (``comm/psi_mb``) and its time on the simulated clock. A
    resumed run aligns again; the checkpoint's ledger and clock then replace these counts."""
    report = getattr(datamodule, "alignment", None)
    if report is None:
        return
    module.wire.ledger.record_psi(report.total_bytes)
    module.wire.clock.advance(report.seconds(module.wire.clock.network))


def build_in_data_dir(cfg: DictConfig, runtime: LocalRuntime):
    """:func:`build`, with a filesystem error under ``paths.data_dir`` named as that key."""
    try:
        return build(cfg, runtime)
    except Exception as error:
        named = data_dir_error(error, str(cfg.paths.get("data_dir", "")))
        if named is not None:
            raise named from error
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
