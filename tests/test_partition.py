"""Partitions cover every feature exactly once; bad inputs raise one clear message."""

import numpy as np
import pytest

from vfl_lightning.data.partition import make_partition


def _covered(slices, num_features):
    joined = np.concatenate([s.index for s in slices])
    return np.array_equal(np.sort(joined), np.arange(num_features))


@pytest.mark.parametrize("num_parties", [1, 2, 3, 5, 7, 30])
def test_even_covers_every_column_once_with_uneven_sizes(num_parties):
    slices = make_partition("even", (30,), num_parties)
    assert len(slices) == num_parties
    assert _covered(slices, 30)
    sizes = [s.shape[0] for s in slices]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("kind", "num_parties", "shape"),
    [
        ("quadrants", 4, (1, 8, 8)),
        ("quadrants", 4, (3, 7, 5)),
        ("halves", 2, (1, 8, 8)),
        ("halves", 2, (3, 5, 7)),
        ("strips", 1, (1, 8, 8)),
        ("strips", 3, (1, 8, 8)),
        ("strips", 8, (2, 8, 8)),
        ("even", 4, (1, 8, 8)),
    ],
)
def test_image_partitions_cover_every_pixel_once(kind, num_parties, shape):
    slices = make_partition(kind, shape, num_parties)
    assert len(slices) == num_parties
    assert _covered(slices, int(np.prod(shape)))
    for s in slices:
        assert int(np.prod(s.shape)) == len(s.index)


def test_quadrant_slice_is_the_image_block():
    image = np.arange(2 * 8 * 8).reshape(2, 8, 8)
    slices = make_partition("quadrants", image.shape, 4)
    flat = image.reshape(-1)
    np.testing.assert_array_equal(flat[slices[1].index].reshape(slices[1].shape), image[:, :4, 4:])
    np.testing.assert_array_equal(flat[slices[2].index].reshape(slices[2].shape), image[:, 4:, :4])


def test_explicit_and_views_cover_every_column_once():
    slices = make_partition("explicit", (6,), 3, columns=[[5, 0], [1, 3], [2, 4]])
    assert _covered(slices, 6)
    assert list(slices[0].index) == [5, 0]
    slices = make_partition("views", (10,), 3, view_sizes=[2, 5, 3])
    assert _covered(slices, 10)
    assert [s.shape for s in slices] == [(2,), (5,), (3,)]


def test_views_group_whole_views_when_parties_are_fewer_than_views():
    slices = make_partition("views", (17 * 3,), 5, view_sizes=[3] * 17)
    assert _covered(slices, 51)
    assert [s.shape for s in slices] == [(12,), (12,), (9,), (9,), (9,)]
    assert list(slices[2].index) == list(range(24, 33))


def test_views_of_image_channels_keep_the_image_shape():
    views = np.arange(12 * 4 * 4).reshape(12, 4, 4)
    slices = make_partition("views", views.shape, 6, view_sizes=[1] * 12)
    assert [s.shape for s in slices] == [(2, 4, 4)] * 6
    flat = views.reshape(-1)
    np.testing.assert_array_equal(flat[slices[3].index].reshape(2, 4, 4), views[6:8])
    assert [s.shape for s in make_partition("views", views.shape, 12, view_sizes=[1] * 12)] == [
        (1, 4, 4)
    ] * 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(kind="even", feature_shape=(10,), num_parties=0),
            "num_parties must be an integer >= 1, got 0",
        ),
        (
            dict(kind="even", feature_shape=(10,), num_parties=11),
            r"at most the number of features \(10\), got 11",
        ),
        (
            dict(kind="quadrants", feature_shape=(1, 8, 8), num_parties=3),
            "needs num_parties == 4, got 3",
        ),
        (
            dict(kind="halves", feature_shape=(1, 8, 8), num_parties=4),
            "needs num_parties == 2, got 4",
        ),
        (
            dict(kind="strips", feature_shape=(1, 8, 8), num_parties=9),
            r"1 <= num_parties <= image width \(8\), got 9",
        ),
        (
            dict(kind="quadrants", feature_shape=(30,), num_parties=4),
            r"image features of shape \(C, H, W\)",
        ),
        (dict(kind="diagonal", feature_shape=(30,), num_parties=4), "unknown partition 'diagonal'"),
        (
            dict(kind="explicit", feature_shape=(4,), num_parties=2, columns=[[0, 1], [1, 2, 3]]),
            "column 1 is listed for party 0 and party 1",
        ),
        (
            dict(kind="explicit", feature_shape=(4,), num_parties=2, columns=[[0], [1, 2]]),
            "columns 3 are held by no party",
        ),
        (
            dict(kind="explicit", feature_shape=(4,), num_parties=2, columns=[[0, 1], [2, 3, 4]]),
            r"column 4 of party 1 is out of range \[0, 3\]",
        ),
        (
            dict(kind="explicit", feature_shape=(4,), num_parties=3, columns=[[0, 1], [2, 3]]),
            r"one column list per party \(3\), got 2",
        ),
        (dict(kind="views", feature_shape=(4,), num_parties=2), "needs a multi-view dataset"),
        (
            dict(kind="views", feature_shape=(4,), num_parties=3, view_sizes=[2, 2]),
            r"1 <= num_parties <= number of views \(2\), got 3",
        ),
        (
            dict(kind="views", feature_shape=(3, 4, 4), num_parties=2, view_sizes=[1, 1]),
            r"view sizes \[1, 1\] do not add up to 3 channels",
        ),
    ],
)
def test_bad_partitions_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_partition(**kwargs)
