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
    """The config ``python train.py <overrides>`` would run (without Hydra's run directory)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if not (config_dir / "train.yaml").is_file():
        raise PartyFilesError(f"--config-dir {config_dir} holds no train.yaml")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(config_dir)):
            return compose("train", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def export(overrides: list[str], out: Path, config_dir: Path = CONF_DIR) -> Manifest:
    """Build the data module of ``overrides`` and write its party files into ``out``."""
    import lightning as L
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from vfl_lightning.algorithms.party_factory import PartyFactory
    from vfl_lightning.data.datamodule import VerticalDataModule
    from vfl_lightning.data.files_datamodule import PartyFilesDataModule

    cfg = compose_run_config(overrides, config_dir)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    target = get_class(cfg.data._target_)
    if issubclass(target, PartyFilesDataModule) or not issubclass(target, VerticalDataModule):
        raise PartyFilesError(
            f"export needs a dataset config (data=digits, data=mnist, ...), got "
            f"{cfg.data.get('_target_')}"
        )
    datamodule = PartyFactory.from_config(cfg).datamodule(psi="always", defer_alignment=True)
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
