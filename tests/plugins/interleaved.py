"""A partition outside the library: feature f goes to party f mod M (flattened features)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vfl_lightning.data.partition import PartySlice


def interleaved(feature_shape: Sequence[int], num_parties: int) -> list[PartySlice]:
    total = math.prod(feature_shape)
    if not 1 <= num_parties <= total:
        raise ValueError(f"data.num_parties must be in [1, {total}], got {num_parties}")
    columns = [np.arange(m, total, num_parties) for m in range(num_parties)]
    return [PartySlice(index, (len(index),)) for index in columns]
