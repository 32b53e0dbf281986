"""A dataset outside the library: Gaussian blobs (scikit-learn's ``make_blobs``), generated from
``seed``, no download."""

from __future__ import annotations

from sklearn.datasets import make_blobs

from vfl_lightning.data.raw import RawDataset


def load_blobs(
    data_dir: str | None = None, samples: int = 600, features: int = 12, classes: int = 3, seed=0
) -> RawDataset:
    x, y = make_blobs(
        n_samples=samples, n_features=features, centers=classes, cluster_std=3.0, random_state=seed
    )
    return RawDataset("blobs", x, y, classes)
