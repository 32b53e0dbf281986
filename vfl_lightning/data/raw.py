"""RawDataset: all samples of a dataset before splitting or scaling, and its binary view.

Plain numpy; every loader module (datasets, images, tables) builds these.
"""

from __future__ import annotations

import importlib
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


def named_or_imported(name: str, known: dict[str, Callable], key: str) -> Callable:
    """``known[name]``, or the function a dotted ``name`` (``package.module.function``) imports:
    a dataset loader or a partition outside the library (config ``key`` for the message)."""
    if name in known:
        return known[name]
    module, _, attribute = str(name).rpartition(".")
    if module:
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"{key}={name} cannot be imported: {error}") from None
    raise ValueError(
        f"unknown {key} {name!r}; choose one of {sorted(known)} or a dotted path "
        "package.module.function"
    )
