"""Dataset loaders: each returns a :class:`RawDataset` (all samples, before splitting or scaling).

Plain numpy. Loaders take ``data_dir`` (the download cache, unused by embedded sets) and keyword
options from the data config's ``options``; :data:`LOADERS` maps the public ``data.name`` (or
``data.loader``) to them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vfl_lightning.data import images, licensed, multiview, tables
from vfl_lightning.data.raw import RawDataset, named_or_imported
from vfl_lightning.errors import ConfigError


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
    "modelnet10": multiview.load_modelnet10,
    "caltech7": multiview.load_caltech7,
    "nus_wide": multiview.load_nus_wide,
    "imagenet100": licensed.load_imagenet100,
    "mimic3": licensed.load_mimic3,
}


def load_dataset(name: str, data_dir: str | None = None, **options) -> RawDataset:
    """Load the dataset called ``name``: a key of :data:`LOADERS`, or the dotted path of a loader
    ``(data_dir, **options) -> RawDataset`` outside the library."""
    loader = named_or_imported(name, LOADERS, "dataset")
    try:
        return loader(data_dir, **options)
    except (TypeError, ValueError) as error:
        problem = options_problem(name, options, error)
        if problem is None:
            raise
        raise ConfigError(problem) from error


def options_problem(name: str, options: dict, error: BaseException) -> str | None:
    """The one line for a loader that refused ``data.options`` (an option it does not take, or a
    value out of its range), naming the option when the error names it; None when ``options`` is
    empty or the error is not about them."""
    if not options:
        return None
    text = " ".join(str(error).split())
    unknown = re.search(r"unexpected keyword argument '(\w+)'", text)
    if isinstance(error, TypeError) and unknown:
        key = unknown.group(1)
        return (
            f"data.options.{key} is not an option of the {name} dataset's loader: drop it with "
            f"~data.options.{key}"
        )
    named = [key for key in options if f"'{key}'" in text or f'"{key}"' in text]
    if not named:
        return None
    key = named[0]
    return f"data.options.{key}={options[key]!r} is refused by the {name} dataset's loader: {text}"
