"""A DataLoader that remembers how far into the current epoch it is, so a checkpoint written in
the middle of an epoch (``every_n_train_steps``) resumes with the next batch of that epoch."""

from __future__ import annotations

from torch.utils.data import DataLoader


class ResumableLoader(DataLoader):
    """Lightning saves ``state_dict()`` of loaders that have one in every checkpoint and calls
    ``load_state_dict`` on resume. The state is (epoch, batches served); the next iteration of
    that same epoch skips the batches already served (the batch order depends only on the seed
    and the epoch, see ``EpochBatchSampler``), any other epoch starts from its first batch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._epoch = -1
        self._served = 0
        self._resume: tuple[int, int] | None = None

    def __iter__(self):
        epoch = int(getattr(self.sampler, "epoch", 0))
        skip = 0
        if self._resume is not None and self._resume[0] == epoch:
            skip = self._resume[1]
        self._resume = None
        self._epoch, self._served = epoch, 0
        for index, batch in enumerate(super().__iter__()):
            self._served = index + 1
            if index >= skip:
                yield batch

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "served": self._served}

    def load_state_dict(self, state: dict) -> None:
        self._resume = (int(state["epoch"]), int(state["served"]))
