"""PartyFilesDataModule (``data=party_files data.dir=DIR``): the VerticalDataModule's batches, read
from exported party files and aligned by the ECDH-PSI; with ``party_columns=False`` the label
holder's ids and labels only.

``party_columns=True`` (the local simulation) reads every file, runs the PSI between the label
holder and every party in this process, and yields ``(xs, y, idx)`` of the aligned rows, in the
label holder's order (with every row held by every party: exactly as the data module the files
were exported from). ``party_columns=False`` (chosen by the runtime whose parties read their own
files, not by the data config) reads ``server.npz`` alone and leaves the PSI to the runtime: a
batch is ``(xs, y, idx)`` with ``xs`` empty (or only the label holder's own slice when it holds
features), so no party's column ever exists in this process.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from vfl_lightning.data.alignment import LabelHolderRows, PartyTable, check_overlap
from vfl_lightning.data.datamodule import VerticalDataModule, check_psi
from vfl_lightning.data.partition_options import partition_setting
from vfl_lightning.data.party_files import (
    PartyFilesError,
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
        partition=None,
        columns: list | None = None,
        val_fraction: float | None = None,
        test_fraction: float | None = None,
        scaling: str | None = None,
        options: dict | None = None,
        active_party: bool | None = None,
        binary: bool | None = None,
        overlap: float | None = None,
        psi: str = "auto",
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
        self.psi = check_psi(psi)
        self.settings = {
            "num_parties": num_parties,
            "partition": partition_setting(partition),
            "columns": columns,
            "val_fraction": val_fraction,
            "test_fraction": test_fraction,
            "scaling": scaling,
            "options": options,
            "active_party": active_party,
            "binary": binary,
            "overlap": None if overlap is None else check_overlap(overlap),
        }
        self.splits = {}
        self.start_alignment()
        self.prepare()

    def prepare(self) -> None:
        manifest = read_manifest(self.dir)
        check_settings(manifest, self.dir, self.settings)
        server = read_server_file(self.dir)
        self.raw_name = manifest.dataset
        self.split_scores = dict(manifest.split_scores)
        self.num_classes = manifest.num_classes
        self.active_party = manifest.server_shape is not None
        self._party_shapes = list(manifest.party_shapes)
        self._server_shape = manifest.server_shape
        self.num_parties = manifest.num_parties + int(self.active_party)
        self.split_index = dict(server.ids)
        self.pending = LabelHolderRows(ids=server.ids, labels=server.labels, own=server.features)
        if self.party_columns:
            for m in range(manifest.num_parties):
                party = read_party_file(self.dir, m)
                self.party_tables.append(PartyTable(party.ids, party.features))
            self.align_here()
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
