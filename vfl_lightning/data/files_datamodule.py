"""PartyFilesDataModule (``data=party_files data.dir=DIR``): the VerticalDataModule's batches, read
from exported party files; with ``party_columns=False`` the label holder's ids and labels only.

``party_columns=True`` (the local simulation) reads every file and yields ``(xs, y, idx)`` exactly
as the data module the files were exported from. ``party_columns=False`` (chosen by the runtime
whose parties read their own files, not by the data config) reads ``server.npz`` alone: a batch
is ``(xs, y, idx)`` with ``xs`` empty (or only the label holder's own slice when it holds
features), so no party's column ever exists in this process.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from vfl_lightning.data.datamodule import PartyTensors, VerticalDataModule
from vfl_lightning.data.party_files import (
    STAGES,
    PartyFilesError,
    check_aligned,
    check_settings,
    read_manifest,
    read_party_file,
    read_server_file,
)
from vfl_lightning.data.segments import SegmentedDataModule


class PartyFilesDataModule(VerticalDataModule):
    """Splits and batches from the files in ``dir``; loaders, samplers and the batch order (a
    function of ``seed`` and the epoch) are the VerticalDataModule's.

    The dataset settings (``num_parties``, ``partition``, ...) were fixed at export; one that a
    config sets anyway (an experiment does) must equal the value the manifest recorded.
    """

    def __init__(
        self,
        dir: str,
        name: str = "party_files",
        batch_size: int = 32,
        eval_batch_size: int = 512,
        seed: int = 0,
        drop_last: bool = False,
        party_columns: bool = True,
        num_parties: int | None = None,
        partition: str | None = None,
        columns: list | None = None,
        val_fraction: float | None = None,
        test_fraction: float | None = None,
        scaling: str | None = None,
        options: dict | None = None,
        active_party: bool | None = None,
        binary: bool | None = None,
    ) -> None:
        L.LightningDataModule.__init__(self)
        for label, size in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if not isinstance(size, int) or size < 1:
                raise PartyFilesError(f"data.{label} must be an integer >= 1, got {size!r}")
        if dir is None or str(dir) == "":
            raise PartyFilesError(
                "data=party_files needs data.dir=DIR, a directory written by "
                "python -m vfl_lightning.data.export <overrides> --out DIR"
            )
        self.dir = Path(dir).expanduser().resolve()
        self.name = name
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.party_columns = bool(party_columns)
        self.settings = {
            "num_parties": num_parties,
            "partition": partition,
            "columns": columns,
            "val_fraction": val_fraction,
            "test_fraction": test_fraction,
            "scaling": scaling,
            "options": options,
            "active_party": active_party,
            "binary": binary,
        }
        self.splits: dict[str, PartyTensors] = {}
        self.prepare()

    def prepare(self) -> None:
        manifest = read_manifest(self.dir)
        check_settings(manifest, self.dir, self.settings)
        server = read_server_file(self.dir)
        self.raw_name = manifest.dataset
        self.num_classes = manifest.num_classes
        self.active_party = manifest.server_shape is not None
        self._party_shapes = list(manifest.party_shapes)
        self._server_shape = manifest.server_shape
        self.num_parties = manifest.num_parties + int(self.active_party)
        columns = []
        if self.party_columns:
            for m in range(manifest.num_parties):
                party = read_party_file(self.dir, m)
                check_aligned(server, party, self.dir)
                columns.append(party.features)
        if server.features is not None:
            columns.append(server.features)
        for stage in STAGES:
            xs = [torch.from_numpy(features[stage]) for features in columns]
            self.splits[stage] = PartyTensors(xs, torch.from_numpy(server.labels[stage]))
        self.split_index = server.ids
        self._prepared = True

    @property
    def party_shapes(self) -> list[tuple[int, ...]]:
        """Input shape of one sample for each party on the wire (from the manifest)."""
        return list(self._party_shapes)

    @property
    def server_shape(self) -> tuple[int, ...] | None:
        """Input shape of the label holder's own slice, or ``None`` when it holds no features."""
        return self._server_shape


class SegmentedPartyFilesDataModule(SegmentedDataModule, PartyFilesDataModule):
    """FedVS's segmented training batches (:class:`SegmentedDataModule`) from party files: the
    FedVS algo configs set ``data._target_``, so select this one with
    ``data._target_=vfl_lightning.data.files_datamodule.SegmentedPartyFilesDataModule``."""
