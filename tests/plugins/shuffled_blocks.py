"""A partition outside the library that takes options and the run's seed: the flat features cut
into blocks of ``block`` columns, the blocks dealt to the parties in a random order drawn from
``seed``."""

from __future__ import annotations

import numpy as np

from vfl_lightning.data.partition import PartySlice


def shuffled_blocks(feature_shape, num_parties: int, *, block: int = 2, seed: int = 0):
    features = int(np.prod(feature_shape))
    if features % block:
        raise ValueError(f"data.partition.block={block} does not divide the {features} features")
    blocks = np.arange(features).reshape(-1, block)
    order = np.random.default_rng(seed).permutation(len(blocks))
    dealt = [np.sort(blocks[order[m::num_parties]].ravel()) for m in range(num_parties)]
    return [PartySlice(index, (len(index),)) for index in dealt]
