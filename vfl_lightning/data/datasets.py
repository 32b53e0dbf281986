"""Dataset loaders: each returns a :class:`RawDataset` (all samples, before splitting or scaling).

Plain numpy. Loaders take ``data_dir`` (the download cache, unused by embedded sets) and keyword
options from the data config's ``options``; :data:`LOADERS` maps the public ``data.name`` to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RawDataset:
    """All samples of a dataset.

    ``x`` is float32 of shape ``(N, F)`` (tables) or ``(N, C, H, W)`` (images); ``y`` is int64 in
    ``[0, num_classes)``. ``test_index`` marks an official test split (``None``: the data module
    draws one). ``view_sizes`` lists the widths of the views of multi-view data (for ``views``).
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    test_index: np.ndarray | None = None
    view_sizes: list[int] | None = None
    is_image: bool = False
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.x = np.ascontiguousarray(self.x, dtype=np.float32)
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: {len(self.x)} samples but {len(self.y)} labels")
        if self.y.min() < 0 or self.y.max() >= self.num_classes:
            raise ValueError(
                f"{self.name}: labels must lie in [0, {self.num_classes - 1}], "
                f"got [{self.y.min()}, {self.y.max()}]"
            )


def load_digits(data_dir: str | None = None) -> RawDataset:
    """scikit-learn's digits: 1797 grey 8x8 images of 10 digits (bundled, no download)."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    return RawDataset("digits", bunch.images[:, None, :, :], bunch.target, 10, is_image=True)


def load_breast_cancer(data_dir: str | None = None) -> RawDataset:
    """scikit-learn's Wisconsin breast cancer: 569 samples, 30 features, binary (bundled)."""
    from sklearn.datasets import load_breast_cancer as sk_bc

    bunch = sk_bc()
    return RawDataset("breast_cancer", bunch.data, bunch.target, 2)


def load_synthetic(
    data_dir: str | None = None,
    *,
    n_samples: int = 2000,
    n_features: int = 64,
    n_informative: int = 16,
    n_classes: int = 2,
    random_state: int = 0,
) -> RawDataset:
    """scikit-learn's ``make_classification``: a tabular task of any size (for scaling benchmarks)."""
    from sklearn.datasets import make_classification

    if n_informative > n_features:
        raise ValueError(f"n_informative must be <= n_features ({n_features}), got {n_informative}")
    x, y = make_classification(
        n_samples=n_samples,
        n_features=n_features,
        n_informative=n_informative,
        n_redundant=0,
        n_classes=n_classes,
        n_clusters_per_class=1,
        random_state=random_state,
    )
    return RawDataset("synthetic", x, y, n_classes)


def binary_view(raw: RawDataset) -> RawDataset:
    """The binary task of a multi-class dataset: label 1 for classes below ``num_classes // 2``,
    0 for the rest (digits: 1 for 0-4, 0 for 5-9). Binary datasets are returned unchanged."""
    if raw.num_classes == 2:
        return raw
    positive = (raw.y < raw.num_classes // 2).astype(np.int64)
    return RawDataset(
        raw.name,
        raw.x,
        positive,
        2,
        test_index=raw.test_index,
        view_sizes=raw.view_sizes,
        is_image=raw.is_image,
        meta={**raw.meta, "binary_from_classes": raw.num_classes},
    )


# The papers' datasets live in their own modules, which import RawDataset from here.
from vfl_lightning.data import images, tables  # noqa: E402

LOADERS: dict[str, Callable[..., RawDataset]] = {
    "digits": load_digits,
    "breast_cancer": load_breast_cancer,
    "synthetic": load_synthetic,
    "mnist": images.load_mnist,
    "mnist_small": images.load_mnist_small,
    "fashion_mnist": images.load_fashion_mnist,
    "emnist": images.load_emnist,
    "cifar10": images.load_cifar10,
    "har": tables.load_har,
    "phishing": tables.load_phishing,
    "phishing_small": tables.load_phishing_small,
    "credit_default": tables.load_credit_default,
    "parkinson": tables.load_parkinson,
    "parkinson_small": tables.load_parkinson_small,
    "mfeat": tables.load_mfeat,
}


def load_dataset(name: str, data_dir: str | None = None, **options) -> RawDataset:
    """Load the dataset called ``name`` (a key of :data:`LOADERS`)."""
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(LOADERS)}")
    return LOADERS[name](data_dir, **options)
