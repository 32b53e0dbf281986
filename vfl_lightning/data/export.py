"""``python -m vfl_lightning.data.export <hydra overrides> --out DIR``: the run's data, built as
train.py builds it, written as one file per party, one for the server and a manifest.

The overrides are train.py's (``data=mnist data.num_parties=4 data.overlap=0.8 seed=1``); the
split, partition and scaling are the data module's. Each party's file holds the rows it holds
(``data.overlap``: the share of the label holder's rows that every party holds, the others
missing at one party or more) with their sample ids, in its own shuffled order; the server's file
every row of the label holder's split. ``data=party_files data.dir=DIR`` aligns them by the PSI
and, at ``data.overlap=1``, trains on the same batches as the dataset itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vfl_lightning.data.party_files import (
    CHECKED_SETTINGS,
    STAGES,
    Manifest,
    PartyFilesError,
    write_party_files,
)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_run_config(overrides: list[str], config_dir: Path = CONF_DIR):
    """The config ``python train.py <overrides>`` would run (without Hydra's run directory); an
    override Hydra refuses (an unknown key or group option, an unreadable value) is a
    ConfigError worded as train.py words it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from vfl_lightning.errors import ConfigError
    from vfl_lightning.run.hydra_cli import explain

    if not (config_dir / "train.yaml").is_file():
        raise PartyFilesError(f"--config-dir {config_dir} holds no train.yaml")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(config_dir)):
            try:
                return compose("train", overrides=list(overrides))
            except Exception as error:
                line = explain(error)  # while Hydra knows the config folders it suggests from
                if line is None:
                    raise
                raise ConfigError(line) from None
    finally:
        GlobalHydra.instance().clear()


OUT_FIX = "choose a new directory you can write"


def check_out(out: Path) -> None:
    """``--out`` is a new or empty directory this process can make and write (nothing is made
    yet), else one PartyFilesError line naming it."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PartyFilesError(f"--out {out} exists and is not an empty directory; choose a new one")
    folder = out.absolute()
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        problem = f"{folder} is a file"
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = f"{folder} is not writable"
    else:
        return
    raise PartyFilesError(f"--out {out} cannot be used: {problem}; {OUT_FIX}")


def export(overrides: list[str], out: Path, config_dir: Path = CONF_DIR) -> Manifest:
    """Build the data module of ``overrides`` and write its party files into ``out``; the
    overrides and ``out`` are checked before torch is imported."""
    cfg = compose_run_config(overrides, config_dir)
    cfg.paths.output_dir = str(out)  # train.py's is Hydra's run directory; export writes to --out
    if config_dir.resolve() == CONF_DIR:  # the key index describes the shipped config files
        from vfl_lightning.run.early import check_early

        check_early(cfg)  # every key, type and range as train.py checks them
    check_out(Path(out))

    import lightning as L
    from hydra.utils import get_class

    from vfl_lightning.algorithms.party_factory import PartyFactory
    from vfl_lightning.data.datamodule import VerticalDataModule
    from vfl_lightning.data.files_datamodule import PartyFilesDataModule

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    target = get_class(cfg.data._target_)
    if issubclass(target, PartyFilesDataModule) or not issubclass(target, VerticalDataModule):
        raise PartyFilesError(
            f"export needs a dataset config (data=digits, data=mnist, ...), got "
            f"{cfg.data.get('_target_')}"
        )
    from vfl_lightning.run.outcome import data_dir_error

    try:
        datamodule = PartyFactory.from_config(cfg).datamodule(psi="always", defer_alignment=True)
    except Exception as error:
        named = data_dir_error(error, str(cfg.paths.get("data_dir", "")))
        if named is not None:
            raise named from error
        raise
    try:
        return write(datamodule, cfg, out)
    except OSError as error:
        reason = error.strerror or " ".join(str(error).split())
        raise PartyFilesError(f"--out {out} cannot be used: {reason}; {OUT_FIX}") from None


def write(datamodule, cfg, out: Path) -> Manifest:
    """The party files of ``datamodule`` (awaiting its PSI) in ``out``."""
    from omegaconf import OmegaConf

    pending = datamodule.pending
    tables = datamodule.party_tables
    return write_party_files(
        out,
        dataset=datamodule.raw_name,
        num_classes=datamodule.num_classes,
        ids=pending.ids,
        labels=pending.labels,
        party_ids=[table.ids for table in tables],
        party_features=[table.features for table in tables],
        server_features=pending.own,
        export_settings=export_settings(OmegaConf.to_container(cfg.data, resolve=True)),
        split_scores=datamodule.split_scores,
    )


def export_settings(data_config: dict) -> dict:
    """What the manifest records of the data config: the dataset's name, the split's seed and
    the settings a later run is checked against (:data:`CHECKED_SETTINGS`)."""
    recorded = {key: data_config.get(key) for key in ("name", "seed")}
    recorded |= {key: data_config[key] for key in CHECKED_SETTINGS if key in data_config}
    return recorded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vfl_lightning.data.export",
        description="Write the run's data as one file per party, one for the server, a manifest.",
        epilog=(
            "The overrides are train.py's and are checked as train.py checks them (an unknown "
            "key or option, a wrong type or range is one 'error:' line, exit 2). Example: "
            "python -m vfl_lightning.data.export data=digits data.num_parties=2 "
            "data.partition=halves data.overlap=0.8 --out parties/"
        ),
    )
    parser.add_argument(
        "overrides", nargs="*", help="train.py's Hydra overrides (data=..., seed=...)"
    )
    parser.error = lambda message: parser.exit(2, f"error: {message} (see --help)\n")
    parser.add_argument("--out", required=True, type=Path, help="new or empty directory")
    parser.add_argument("--config-dir", type=Path, default=CONF_DIR, help="Hydra config directory")
    args = parser.parse_args(argv)
    from vfl_lightning.run.outcome import error_summary, exit_code

    try:
        manifest = export(args.overrides, args.out, args.config_dir.resolve())
    except Exception as error:
        code = exit_code(error)
        if code is None:
            raise
        print(f"error: {error_summary(error)}", file=sys.stderr)
        return code
    sizes = ", ".join(f"{s} {manifest.split_sizes[s]}" for s in STAGES)
    rows = ", ".join(str(n) for n in manifest.party_rows)
    print(
        f"wrote {manifest.num_parties} party files, server.npz and manifest.json to {args.out} "
        f"({manifest.dataset}: label holder {sizes}; parties' rows {rows}; "
        f"{manifest.num_classes} classes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
