"""FedVS batches: the training set is split into K horizontal segments and a batch takes the same
|B| positions from every segment (FedVS §4.3), so one coded row stands for K real samples.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler

from vfl_lightning.data.datamodule import VerticalDataModule, as_is
from vfl_lightning.data.resumable import ResumableLoader
from vfl_lightning.seeding import derive_seed


def check_segments(size: int, segments: int, per_segment_batch: int) -> None:
    """Every segment must hold at least one batch of positions."""
    if segments < 1:
        raise ValueError(f"segments (algo.K) must be >= 1, got {segments}")
    if size // segments < per_segment_batch:
        raise ValueError(
            f"each of the K={segments} segments holds {size // segments} samples, fewer than "
            f"the per-segment batch {per_segment_batch}; lower data.batch_size or algo.K"
        )


class SegmentBatchSampler(Sampler[torch.Tensor]):
    """Yields sample indices ``[k*S + j for k in 0..K-1 for j in positions]``, segment-major.

    ``S = size // K`` samples per segment (the last ``size % K`` samples are never used). Each
    epoch draws a permutation of ``0..S-1`` from (seed, epoch) and cuts it into position sets of
    ``per_segment_batch``; the first ``per_segment_batch`` indices of a batch are the positions.
    """

    def __init__(self, size: int, segments: int, per_segment_batch: int, *, seed: int) -> None:
        check_segments(size, segments, per_segment_batch)
        self.size = size
        self.segments = segments
        self.segment_size = size // segments
        self.per_segment_batch = per_segment_batch
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.segment_size // self.per_segment_batch

    def __iter__(self):
        gen = torch.Generator().manual_seed(
            derive_seed(self.seed, "server", "shuffle", index=self.epoch)
        )
        order = torch.randperm(self.segment_size, generator=gen)
        offsets = torch.arange(self.segments)[:, None] * self.segment_size
        for start in range(0, len(self) * self.per_segment_batch, self.per_segment_batch):
            positions = order[start : start + self.per_segment_batch]
            yield (offsets + positions[None, :]).reshape(-1)


class SegmentedDataModule(VerticalDataModule):
    """A :class:`VerticalDataModule` whose training batches come from :class:`SegmentBatchSampler`.

    ``batch_size`` is the total per round, K|B|; it must be a multiple of ``segments`` (K).
    Validation and test batches are unchanged.
    """

    def __init__(self, *args, segments: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise ValueError(f"segments (algo.K) must be an integer >= 1, got {segments!r}")
        if self.batch_size % segments:
            raise ValueError(
                f"data.batch_size={self.batch_size} must be a multiple of algo.K={segments} "
                f"(each round takes |B| = batch_size / K samples from each segment)"
            )
        self.segments = segments
        self.per_segment_batch = self.batch_size // segments
        if self.pending is None:  # else checked once the PSI has aligned the rows
            check_segments(len(self.splits["train"]), segments, self.per_segment_batch)

    @property
    def segment_size(self) -> int:
        return len(self.splits["train"]) // self.segments

    def train_dataloader(self) -> DataLoader:
        sampler = SegmentBatchSampler(
            len(self.splits["train"]), self.segments, self.per_segment_batch, seed=self.seed
        )
        return ResumableLoader(
            self.splits["train"], sampler=sampler, batch_size=None, num_workers=0, collate_fn=as_is
        )
