"""VerticalDataModule: a dataset split into train/val/test and vertically into party slices.

Batches are ``(xs, y, idx)``: ``xs`` a list with party m's slice of the batch, ``y`` the labels and
``idx`` the sample indices within the stage's split. All tensors are preloaded; a batch is one
index slice per party (no per-sample Python work).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from vfl_lightning.data.alignment import (
    LabelHolderRows,
    PartyTable,
    check_overlap,
    simulate_holdings,
)
from vfl_lightning.data.canaries import CanaryRecord, place_canaries, place_label_canaries
from vfl_lightning.data.datasets import load_dataset
from vfl_lightning.data.partition import PartySlice, make_partition
from vfl_lightning.data.raw import RawDataset, binary_view
from vfl_lightning.data.resumable import ResumableLoader
from vfl_lightning.data.splits import (
    AlignedSplits,
    PartyTensors,
    cached_split_scores,
    check_psi,
    column,
)
from vfl_lightning.errors import ConfigError
from vfl_lightning.seeding import derive_seed

STAGES = ("train", "val", "test")
SCALINGS = ("standard", "clipped", "none")


def as_is(batch):
    """The loaders' collate function: a batch is already made by :class:`PartyTensors` (torch's
    default would walk it element by element to convert what is already converted)."""
    return batch


class EpochBatchSampler(Sampler[torch.Tensor]):
    """Yields index batches (int64 tensors); the order of epoch e is a function of (seed, e) alone.

    Lightning calls :meth:`set_epoch`, so a run resumed at epoch e sees the same batches as an
    uninterrupted one.
    """

    def __init__(
        self, size: int, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool = False
    ):
        self.size = size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.drop_last:
            return self.size // self.batch_size
        return -(-self.size // self.batch_size)

    def __iter__(self):
        if self.shuffle:
            gen = torch.Generator().manual_seed(
                derive_seed(self.seed, "server", "shuffle", index=self.epoch)
            )
            order = torch.randperm(self.size, generator=gen)
        else:
            order = torch.arange(self.size)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield order[start : start + self.batch_size]


class VerticalDataModule(AlignedSplits, L.LightningDataModule):
    """Loads the dataset (``loader``: a built-in name or a loader's dotted path; by default
    ``name``, which otherwise only names the data), splits it (seeded, stratified), scales on
    train only, partitions it (``partition``: a name, or a config node with its ``_target_``
    and options, :func:`~vfl_lightning.data.partition.make_partition`).

    ``num_parties`` counts every feature holder. With ``active_party=True`` the label holder (the
    server) also holds features: the last of the ``num_parties`` slices is the server's, so
    ``party_shapes`` lists the other ``num_parties - 1`` (the parties on the wire) and
    ``server_shape`` the server's own; batches still carry all ``num_parties`` slices, the server's
    last. ``binary=True`` turns a multi-class dataset into a binary task (:func:`binary_view`).

    Splits: a dataset with an official test split keeps it as the test split, and ``val_fraction``
    is the share of its official training rows held out for validation (``test_fraction`` is
    unused). Otherwise ``test_fraction`` and ``val_fraction`` are shares of all rows: the test rows
    are drawn first, the validation rows from the rest (both stratified, seeded).

    Alignment (:class:`AlignedSplits`): with ``overlap`` < 1 (or ``psi="always"``) each party on
    the wire holds its own rows with their sample ids, in its own order
    (:func:`~vfl_lightning.data.alignment.simulate_holdings`: a share ``overlap`` of the rows is
    held by every party), and the splits keep the rows the ECDH-PSI finds at every party. The
    label holder holds every row and its split decides the stages. ``defer_alignment=True`` (the
    runtime's choice, not the config's) stops before the PSI: the runtime runs it between the
    processes that hold the rows.
    """

    def __init__(
        self,
        name: str = "digits",
        num_parties: int = 4,
        partition="quadrants",
        columns: Sequence[Sequence[int]] | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 512,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        scaling: str = "standard",
        seed: int = 0,
        data_dir: str | None = None,
        options: dict | None = None,
        drop_last: bool = False,
        active_party: bool = False,
        binary: bool = False,
        canaries: Mapping[str, Mapping] | None = None,
        overlap: float = 1.0,
        psi: str = "auto",
        defer_alignment: bool = False,
        score_split: bool = True,
        loader: str | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for label, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= frac < 1.0:
                raise ValueError(f"{label} must be in [0, 1), got {frac}")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}"
            )
        if active_party and num_parties < 2:
            raise ValueError(
                "data.active_party=true needs data.num_parties >= 2 (the last slice is the "
                f"server's, the others belong to the parties), got {num_parties}"
            )
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
        self.overlap = check_overlap(overlap)
        self.psi = check_psi(psi)
        self.defer_alignment = bool(defer_alignment)
        self.score_split = bool(score_split)
        self.name = name
        self.loader = loader or name
        self.num_parties = num_parties
        self.partition = partition
        self.columns = columns
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.scaling = scaling
        self.seed = seed
        self.data_dir = data_dir
        self.options = dict(options or {})
        self.drop_last = drop_last
        self.active_party = bool(active_party)
        self.binary = bool(binary)
        self.canaries = {name: dict(spec) for name, spec in (canaries or {}).items()}
        self.canary_records: dict[str, CanaryRecord] = {}
        self.splits: dict[str, PartyTensors] = {}
        self.start_alignment()
        self.slices: list[PartySlice] = []
        self.num_classes: int = 0
        self._prepared = False
        self.prepare()

    # The data are small and preloaded: everything happens once, at construction, so that
    # ``party_shapes`` and ``num_classes`` are known before the models are built.
    def prepare(self) -> None:
        raw = load_dataset(self.loader, self.data_dir, **self.options)
        if self.binary:
            raw = binary_view(raw)
        self.raw_name = raw.name
        if raw.num_classes < 2:
            options = f" (data.options={self.options})" if self.options else ""
            raise ConfigError(
                f"data={self.name}{options} gives {raw.num_classes} class, and a classifier needs "
                "at least 2: choose options or a dataset with two classes or more"
            )
        self.num_classes = raw.num_classes
        feature_shape = raw.x.shape[1:]
        num_features = int(np.prod(feature_shape))
        index = self._split_indices(raw)
        x_train = raw.x[index["train"]]
        self.slices = make_partition(
            self.partition,
            feature_shape,
            self.num_parties,
            columns=self.columns,
            view_sizes=raw.view_sizes,
            x_train=x_train,
            y_train=raw.y[index["train"]],
            seed=self.seed,
        )
        self.split_scores = (
            cached_split_scores(self.score_key(), x_train, raw.y[index["train"]], self.slices)
            if self.score_split
            else {}
        )
        scale = self._scaler(x_train, raw.is_image)
        self.split_index = index
        if self.simulates_holdings:
            self._hold_rows(raw, index, scale)
            self._prepared = True
            return
        for stage, rows in index.items():
            flat = scale(raw.x[rows]).reshape(len(rows), num_features)
            xs = [
                torch.from_numpy(np.ascontiguousarray(flat[:, s.index])).reshape(
                    len(rows), *s.shape
                )
                for s in self.slices
            ]
            self.splits[stage] = PartyTensors(xs, torch.from_numpy(raw.y[rows]))
        if self.canaries:
            self.canary_records = place_canaries(
                self.splits["train"].xs,
                self.canaries,
                seed=self.seed,
                num_wire_parties=len(self.party_shapes),
            )
            place_label_canaries(self.splits["train"].y, self.canary_records)
        self._prepared = True

    def score_key(self) -> tuple:
        """What the training rows and the split depend on (the key of the split scores' cache)."""
        return (
            self.loader,
            repr(sorted(self.options.items())),
            self.binary,
            self.val_fraction,
            self.test_fraction,
            self.seed,
            tuple(s.index.tobytes() for s in self.slices),
        )

    @property
    def simulates_holdings(self) -> bool:
        """Whether the parties hold rows of their own that the PSI aligns."""
        return self.overlap < 1.0 or self.psi == "always"

    def _hold_rows(self, raw: RawDataset, index: dict, scale) -> None:
        """Each wire party's own rows (ids and columns, its own order) and the label holder's
        (ids, labels, its own slice), then the PSI here unless the runtime runs it."""
        if self.canaries:
            raise ValueError(
                "an audit= writes canaries into the aligned training rows of every party; run "
                f"it with data.overlap=1 and data.psi=auto (got overlap={self.overlap:g}, "
                f"psi={self.psi})"
            )
        flat = scale(raw.x).reshape(len(raw.x), -1)
        wire = self.slices[:-1] if self.active_party else self.slices
        holdings = simulate_holdings(len(raw.x), self.overlap, len(wire), self.seed)
        self.party_tables = [
            PartyTable(rows, column(flat, rows, s)) for rows, s in zip(holdings, wire, strict=True)
        ]
        own = None
        if self.active_party:
            own = {stage: column(flat, rows, self.slices[-1]) for stage, rows in index.items()}
        self.pending = LabelHolderRows(
            ids={stage: rows.astype(np.int64) for stage, rows in index.items()},
            labels={stage: raw.y[rows] for stage, rows in index.items()},
            own=own,
        )
        if not self.defer_alignment:
            self.align_here()

    def _split_indices(self, raw: RawDataset) -> dict[str, np.ndarray]:
        everything = np.arange(len(raw.y))
        if raw.test_index is not None:
            test = np.asarray(raw.test_index)
            pool = np.setdiff1d(everything, test)
            val_share = self.val_fraction
        else:
            pool, test = self._stratified(
                everything, raw.y, self.test_fraction, derive_seed(self.seed, "server", "split")
            )
            val_share = self.val_fraction / (1.0 - self.test_fraction)
        train, val = self._stratified(
            pool, raw.y, val_share, derive_seed(self.seed, "server", "split", index=1)
        )
        return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}

    @staticmethod
    def _stratified(rows: np.ndarray, y: np.ndarray, fraction: float, seed: int):
        from sklearn.model_selection import train_test_split

        if fraction <= 0:
            return rows, rows[:0]
        labels = y[rows]
        _, counts = np.unique(labels, return_counts=True)
        # stratifying needs two rows of every class and room for every class on both sides
        held_out = int(np.ceil(fraction * len(rows)))
        room = min(held_out, len(rows) - held_out) >= len(counts)
        stratify = labels if counts.min() >= 2 and room else None
        return train_test_split(rows, test_size=fraction, random_state=seed, stratify=stratify)

    def _scaler(self, x_train: np.ndarray, is_image: bool):
        """``rows -> scaled rows`` with statistics of the training rows only: ``standard`` (mean
        and standard deviation per feature, one of each for images), ``clipped`` (the same after
        clipping every feature to its training rows' [min, max], so no validation or test row
        lies farther out than a training row), ``none``."""
        if self.scaling == "none":
            return lambda x: x
        if is_image:
            mean = np.float32(x_train.mean(dtype=np.float64))
            std = x_train.std(dtype=np.float64)
            std = np.float32(std if std > 0 else 1.0)
        else:
            mean = x_train.mean(axis=0, dtype=np.float64).astype(np.float32)
            std = x_train.std(axis=0, dtype=np.float64)
            std[std == 0] = 1.0
            std = std.astype(np.float32)
        if self.scaling == "clipped":
            low, high = x_train.min(axis=0), x_train.max(axis=0)
            return lambda x: (np.clip(x, low, high) - mean) / std
        return lambda x: (x - mean) / std

    @property
    def party_shapes(self) -> list[tuple[int, ...]]:
        """Input shape of one sample for each party on the wire (not the server's own slice)."""
        wire_slices = self.slices[:-1] if self.active_party else self.slices
        return [s.shape for s in wire_slices]

    @property
    def server_shape(self) -> tuple[int, ...] | None:
        """Input shape of the server's own slice (``active_party=True``), else ``None``."""
        return self.slices[-1].shape if self.active_party else None

    def _loader(self, stage: str) -> DataLoader:
        split = self.splits[stage]
        train = stage == "train"
        sampler = EpochBatchSampler(
            len(split),
            self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            seed=self.seed,
            drop_last=self.drop_last and train,
        )
        # the training loader keeps its position within the epoch for mid-epoch checkpoints
        loader = ResumableLoader if train else DataLoader
        return loader(split, sampler=sampler, batch_size=None, num_workers=0, collate_fn=as_is)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """A batch ``(xs, y, idx)`` already on ``device`` (the preloaded CPU data of a CPU run) is
        used as it is (Lightning would walk it element by element); others move as Lightning's."""
        xs, y, idx = batch
        if y.device == device and idx.device == device and all(x.device == device for x in xs):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
