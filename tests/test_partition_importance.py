"""Partition 'importance': feature importance estimated on train rows, balanced across parties."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.feature_selection import mutual_info_classif

from vfl_lightning.data import VerticalDataModule, make_partition
from vfl_lightning.data.partition import feature_importance


def informative_block(rows: int = 3000, seed: int = 0):
    """Features 0-3 carry the label, 4-15 are noise, so 'even' piles the signal on party 0."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, rows)
    signal = y[:, None] + 0.5 * rng.standard_normal((rows, 4))
    noise = rng.standard_normal((rows, 12))
    return np.concatenate([signal, noise], axis=1), y


def test_importance_matches_mutual_information_and_is_zero_for_constants():
    data = load_breast_cancer()
    ours = feature_importance(data.data, data.target)
    reference = mutual_info_classif(data.data, data.target, random_state=0)
    assert np.corrcoef(ours, reference)[0, 1] > 0.95
    x = np.concatenate([data.data, np.full((len(data.data), 1), 3.0)], axis=1)
    assert feature_importance(x, data.target)[-1] == 0.0


def test_importance_partition_balances_signal_that_even_concentrates():
    x, y = informative_block()
    scores = feature_importance(x, y)
    even = make_partition("even", (16,), 4)
    balanced = make_partition("importance", (16,), 4, x_train=x, y_train=y)
    even_totals = [scores[s.index].sum() for s in even]
    totals = [scores[s.index].sum() for s in balanced]
    assert max(even_totals) > 10 * min(even_totals)
    assert max(totals) - min(totals) < 0.1 * np.mean(totals)
    assert sorted(np.concatenate([s.index for s in balanced]).tolist()) == list(range(16))
    assert all(len(s.index) >= 1 and s.shape == (len(s.index),) for s in balanced)
    again = make_partition("importance", (16,), 4, x_train=x, y_train=y)
    assert all(np.array_equal(a.index, b.index) for a, b in zip(balanced, again, strict=True))


def test_importance_on_images_gives_flat_slices_covering_every_pixel():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (200, 1, 4, 4))
    y = (x[:, 0, 0, 0] > 0.5).astype(int)
    slices = make_partition("importance", (1, 4, 4), 3, x_train=x, y_train=y)
    assert sorted(np.concatenate([s.index for s in slices]).tolist()) == list(range(16))
    assert [len(s.shape) for s in slices] == [1, 1, 1]


def test_importance_needs_train_rows_and_valid_party_count():
    with pytest.raises(ValueError, match="'importance' needs the training rows"):
        make_partition("importance", (8,), 2)
    x, y = informative_block(rows=50)
    with pytest.raises(
        ValueError, match="num_parties must be at most the number of features \\(16\\), got 17"
    ):
        make_partition("importance", (16,), 17, x_train=x, y_train=y)
    with pytest.raises(ValueError, match="x_train has 50 rows but y_train has 49 labels"):
        make_partition("importance", (16,), 2, x_train=x, y_train=y[:-1])


def test_data_module_estimates_importance_on_train_rows_only():
    dm = VerticalDataModule("breast_cancer", num_parties=3, partition="importance", seed=0)
    expected = make_partition(
        "importance",
        (30,),
        3,
        x_train=load_breast_cancer().data[dm.split_index["train"]],
        y_train=load_breast_cancer().target[dm.split_index["train"]],
    )
    assert all(np.array_equal(a.index, b.index) for a, b in zip(dm.slices, expected, strict=True))
    assert sum(s[0] for s in dm.party_shapes) == 30
