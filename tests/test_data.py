"""VerticalDataModule: batch contract, seeded splits, scaling fit on train only, bad inputs."""

import numpy as np
import pytest
import torch

from vfl_lightning.data import VerticalDataModule


def test_digits_batches_follow_the_contract():
    dm = VerticalDataModule("digits", num_parties=4, partition="quadrants", batch_size=50)
    assert dm.party_shapes == [(1, 4, 4)] * 4
    assert dm.num_classes == 10
    assert sum(len(s) for s in dm.splits.values()) == 1797
    xs, y, idx = next(iter(dm.train_dataloader()))
    assert len(xs) == 4 and all(x.shape == (50, 1, 4, 4) for x in xs)
    assert y.dtype == torch.long and y.shape == (50,)
    split = dm.splits["train"]
    for m in range(4):
        torch.testing.assert_close(xs[m], split.xs[m][idx])
    torch.testing.assert_close(y, split.y[idx])


def test_quadrants_hold_the_right_pixels():
    from sklearn.datasets import load_digits

    dm = VerticalDataModule("digits", num_parties=4, partition="quadrants", scaling="none")
    images = load_digits().images.astype(np.float32)
    rows = dm.split_index["train"]
    np.testing.assert_array_equal(dm.splits["train"].xs[3][:, 0].numpy(), images[rows, 4:, 4:])


def test_splits_are_seeded_disjoint_and_scaled_on_train_only():
    a = VerticalDataModule("breast_cancer", num_parties=3, partition="even", seed=3)
    b = VerticalDataModule("breast_cancer", num_parties=3, partition="even", seed=3)
    c = VerticalDataModule("breast_cancer", num_parties=3, partition="even", seed=4)
    for stage in ("train", "val", "test"):
        np.testing.assert_array_equal(a.split_index[stage], b.split_index[stage])
    assert not np.array_equal(a.split_index["test"], c.split_index["test"])
    assert not set(a.split_index["train"]) & set(a.split_index["test"])
    train = torch.cat(a.splits["train"].xs, dim=1)
    torch.testing.assert_close(train.mean(0), torch.zeros(30), atol=1e-4, rtol=0)
    torch.testing.assert_close(train.std(0, unbiased=False), torch.ones(30), atol=1e-4, rtol=0)
    test = torch.cat(a.splits["test"].xs, dim=1)
    assert test.mean(0).abs().max() > 1e-3  # test rows are not re-centred on their own mean


def test_clipped_scaling_keeps_every_row_inside_the_training_range():
    standard = VerticalDataModule("breast_cancer", num_parties=3, partition="even", seed=3)
    clipped = VerticalDataModule(
        "breast_cancer", num_parties=3, partition="even", seed=3, scaling="clipped"
    )
    train = torch.cat(standard.splits["train"].xs, dim=1)
    low, high = train.min(0).values, train.max(0).values
    # the case has an answer to find: standard scaling leaves test rows beyond the training range
    test = torch.cat(standard.splits["test"].xs, dim=1)
    outside = (test < low) | (test > high)
    assert outside.any()
    torch.testing.assert_close(torch.cat(clipped.splits["train"].xs, dim=1), train)
    for stage in ("val", "test"):
        was = torch.cat(standard.splits[stage].xs, dim=1)
        now = torch.cat(clipped.splits[stage].xs, dim=1)
        assert ((now >= low - 1e-6) & (now <= high + 1e-6)).all()
        inside = (was >= low) & (was <= high)
        torch.testing.assert_close(now[inside], was[inside])
    clipped_test = torch.cat(clipped.splits["test"].xs, dim=1)
    above, below = test > high, test < low
    torch.testing.assert_close(clipped_test[above], high.expand_as(test)[above], atol=1e-5, rtol=0)
    torch.testing.assert_close(clipped_test[below], low.expand_as(test)[below], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="scaling must be one of standard, clipped, none"):
        VerticalDataModule("breast_cancer", num_parties=3, partition="even", scaling="minmax")


SYNTHETIC = {"n_samples": 200, "n_features": 8, "n_informative": 4, "n_classes": 2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_samples": -5}, r"^data.options.n_samples=-5 is refused by the synthetic dataset's "),
        (
            {"foo": 1},
            r"^data.options.foo is not an option of the synthetic dataset's loader: drop ",
        ),
        ({"n_classes": 1}, r"^data=synthetic \(data.options=.*\) gives 1 class, and a classifier"),
    ],
)
def test_loader_options_it_refuses_are_named_in_one_line(options, message):
    from vfl_lightning.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        VerticalDataModule(
            "synthetic", num_parties=2, partition="even", options=SYNTHETIC | options
        )


def test_epoch_order_depends_only_on_seed_and_epoch():
    dm = VerticalDataModule("digits", batch_size=64, seed=1)
    loader = dm.train_dataloader()

    def first_batch(epoch):
        loader.sampler.set_epoch(epoch)
        return next(iter(loader))[2]

    e1 = first_batch(1)
    first_batch(0)
    assert torch.equal(first_batch(1), e1)
    assert not torch.equal(first_batch(2), e1)


def test_uneven_even_partition_of_breast_cancer():
    dm = VerticalDataModule("breast_cancer", num_parties=7, partition="even")
    assert [s[0] for s in dm.party_shapes] == [5, 5, 4, 4, 4, 4, 4]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(name="imagenet"), "unknown dataset 'imagenet'; choose one of"),
        (
            dict(name="breast_cancer", num_parties=0, partition="even"),
            "num_parties must be an integer >= 1, got 0",
        ),
        (
            dict(name="breast_cancer", num_parties=31, partition="even"),
            r"at most the number of features \(30\), got 31",
        ),
        (
            dict(name="digits", num_parties=3, partition="quadrants"),
            "needs num_parties == 4, got 3",
        ),
        (dict(name="digits", batch_size=0), "batch_size must be >= 1, got 0"),
        (
            dict(name="digits", val_fraction=0.6, test_fraction=0.5),
            "val_fraction \\+ test_fraction must be < 1",
        ),
    ],
)
def test_bad_data_inputs_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VerticalDataModule(**kwargs)


def test_empty_validation_split_is_allowed():
    dm = VerticalDataModule("breast_cancer", num_parties=2, partition="even", val_fraction=0.0)
    assert len(dm.splits["val"]) == 0
    assert [x.shape[1] for x in dm.splits["val"].xs] == [15, 15]
    assert len(dm.val_dataloader()) == 0


def test_batches_already_on_the_device_are_not_walked_again():
    dm = VerticalDataModule(name="digits", num_parties=4, partition="quadrants", batch_size=8)
    batch = next(iter(dm.train_dataloader()))
    assert dm.transfer_batch_to_device(batch, torch.device("cpu"), 0) is batch
    moved = dm.transfer_batch_to_device(batch, torch.device("meta"), 0)
    xs, y, idx = moved
    assert all(x.device.type == "meta" for x in xs) and y.is_meta and idx.is_meta
