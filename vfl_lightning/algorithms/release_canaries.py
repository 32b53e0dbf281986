"""A party's message canaries (``audit=canary_message``): in the training releases of its canary
rows, the party's clipped embedding is replaced by one of the mechanism's two worst-case inputs,
chosen by the row's coin, before the mechanism encodes it. The release is otherwise ordinary: the
same mechanism, noise, round and accounting as every other row's."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vfl_lightning.data.canaries import CanaryRecord


class ReleaseCanaries:
    """Party-side: rows ``rows`` (training indices) of a training split of ``train_size`` rows
    release ``mechanism.neighbouring_extremes`` of their coin instead of the embedding."""

    def __init__(self, rows: torch.Tensor, coins: torch.Tensor, train_size: int, mechanism):
        self.mechanism = mechanism
        self.coins = coins.to(torch.int64).cpu()
        self.slot = torch.full((int(train_size),), -1, dtype=torch.int64)
        self.slot[rows.to(torch.int64).cpu()] = torch.arange(len(rows))

    def __call__(self, idx: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``embedding`` (rows ``idx`` of the training split, detached) with every canary row
        replaced by its coin's worst-case input."""
        slots = self.slot[idx.detach().cpu()]
        hit = slots >= 0
        if not bool(hit.any()):
            return embedding
        extremes = self.mechanism.neighbouring_extremes(self.coins[slots[hit]], embedding.shape[1:])
        released = embedding.clone()
        released[hit.to(embedding.device)] = extremes.to(embedding.device, embedding.dtype)
        return released


def release_canaries(
    records: Mapping[str, CanaryRecord], party: int, mechanism, train_size: int
) -> ReleaseCanaries | None:
    """Party ``party``'s message canaries from the data's canary records (every process that
    builds the data draws the same rows and coins from the run's seed), or None."""
    mine = [r for r in records.values() if r.level == "message" and party in r.parties]
    if not mine:
        return None
    rows = torch.cat([r.rows for r in mine])
    coins = torch.cat([r.coins for r in mine])
    return ReleaseCanaries(rows, coins, train_size, mechanism)
