"""Vertical partitions: which features each party holds.

Plain numpy. A partition maps a sample's feature shape (``(F,)`` for tables, ``(C, H, W)`` for
images) to one :class:`PartySlice` per party: the flat indices (C-order) of its features and the
shape its slice has. Every feature belongs to exactly one party.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PartySlice:
    """The features one party holds: flat indices into the sample and the slice's shape."""

    index: np.ndarray
    shape: tuple[int, ...]


def _check_num_parties(num_parties: int, num_features: int) -> None:
    if not isinstance(num_parties, (int, np.integer)) or num_parties < 1:
        raise ValueError(f"num_parties must be an integer >= 1, got {num_parties!r}")
    if num_parties > num_features:
        raise ValueError(
            f"num_parties must be at most the number of features ({num_features}), got {num_parties}"
        )


def _block_sizes(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` contiguous sizes that differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + (1 if m < extra else 0) for m in range(parts)]


def even(feature_shape: Sequence[int], num_parties: int) -> list[PartySlice]:
    """Contiguous blocks of the flattened features; sizes differ by at most one."""
    num_features = int(np.prod(feature_shape))
    _check_num_parties(num_parties, num_features)
    bounds = np.cumsum([0, *_block_sizes(num_features, num_parties)])
    return [
        PartySlice(np.arange(lo, hi), (int(hi - lo),))
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def _image_shape(feature_shape: Sequence[int], kind: str) -> tuple[int, int, int]:
    if len(feature_shape) == 2:
        return (1, *feature_shape)
    if len(feature_shape) != 3:
        raise ValueError(
            f"partition '{kind}' needs image features of shape (C, H, W), got {tuple(feature_shape)}"
        )
    return tuple(int(s) for s in feature_shape)


def _grid(
    feature_shape: Sequence[int], row_sizes: list[int], col_sizes: list[int]
) -> list[PartySlice]:
    channels, height, width = feature_shape
    flat = np.arange(channels * height * width).reshape(channels, height, width)
    rows = np.cumsum([0, *row_sizes])
    cols = np.cumsum([0, *col_sizes])
    slices = []
    for r0, r1 in zip(rows[:-1], rows[1:], strict=True):
        for c0, c1 in zip(cols[:-1], cols[1:], strict=True):
            block = flat[:, r0:r1, c0:c1]
            slices.append(PartySlice(block.reshape(-1), tuple(int(s) for s in block.shape)))
    return slices


def quadrants(feature_shape: Sequence[int], num_parties: int) -> list[PartySlice]:
    """Four image quadrants: top-left, top-right, bottom-left, bottom-right."""
    if num_parties != 4:
        raise ValueError(f"partition 'quadrants' needs num_parties == 4, got {num_parties}")
    shape = _image_shape(feature_shape, "quadrants")
    return _grid(shape, _block_sizes(shape[1], 2), _block_sizes(shape[2], 2))


def halves(feature_shape: Sequence[int], num_parties: int) -> list[PartySlice]:
    """Left and right image halves."""
    if num_parties != 2:
        raise ValueError(f"partition 'halves' needs num_parties == 2, got {num_parties}")
    shape = _image_shape(feature_shape, "halves")
    return _grid(shape, [shape[1]], _block_sizes(shape[2], 2))


def strips(feature_shape: Sequence[int], num_parties: int) -> list[PartySlice]:
    """Vertical image strips of (nearly) equal width, any number of parties up to the width."""
    shape = _image_shape(feature_shape, "strips")
    if not isinstance(num_parties, (int, np.integer)) or not 1 <= num_parties <= shape[2]:
        raise ValueError(
            f"partition 'strips' needs 1 <= num_parties <= image width ({shape[2]}), got {num_parties!r}"
        )
    return _grid(shape, [shape[1]], _block_sizes(shape[2], num_parties))


def explicit(
    feature_shape: Sequence[int], num_parties: int, columns: Sequence[Sequence[int]]
) -> list[PartySlice]:
    """Parties hold the flat feature indices listed in ``columns`` (one list per party)."""
    num_features = int(np.prod(feature_shape))
    if columns is None or len(columns) != num_parties:
        got = None if columns is None else len(columns)
        raise ValueError(
            f"partition 'explicit' needs one column list per party ({num_parties}), got {got}"
        )
    seen: dict[int, int] = {}
    for m, cols in enumerate(columns):
        if len(cols) == 0:
            raise ValueError(f"partition 'explicit': party {m} has no columns")
        for c in cols:
            c = int(c)
            if not 0 <= c < num_features:
                raise ValueError(
                    f"partition 'explicit': column {c} of party {m} is out of range [0, {num_features - 1}]"
                )
            if c in seen:
                raise ValueError(
                    f"partition 'explicit': column {c} is listed for party {seen[c]} and party {m}; "
                    "lists must not overlap"
                )
            seen[c] = m
    missing = sorted(set(range(num_features)) - set(seen))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise ValueError(
            f"partition 'explicit': columns {shown} are held by no party; every column in "
            f"[0, {num_features - 1}] must be listed once"
        )
    return [PartySlice(np.asarray(cols, dtype=np.int64), (len(cols),)) for cols in columns]


def views(
    feature_shape: Sequence[int], num_parties: int, view_sizes: Sequence[int] | None
) -> list[PartySlice]:
    """Whole views of multi-view data per party: contiguous groups of views whose counts differ by
    at most one (one view each when ``num_parties`` equals the number of views).

    Views are contiguous blocks of columns (tables, ``(F,)``) or of channels (images, ``(C, H, W)``:
    ``view_sizes`` counts channels and a party's slice keeps its image shape ``(c, H, W)``).
    """
    if not view_sizes:
        raise ValueError("partition 'views' needs a multi-view dataset (this dataset has no views)")
    if not isinstance(num_parties, (int, np.integer)) or not 1 <= num_parties <= len(view_sizes):
        raise ValueError(
            f"partition 'views' needs 1 <= num_parties <= number of views ({len(view_sizes)}), "
            f"got {num_parties!r}"
        )
    image = len(feature_shape) == 3
    width = int(feature_shape[0]) if image else int(np.prod(feature_shape))
    if sum(view_sizes) != width:
        unit = "channels" if image else "features"
        raise ValueError(f"view sizes {list(view_sizes)} do not add up to {width} {unit}")
    view_bounds = np.cumsum([0, *view_sizes])
    group_bounds = np.cumsum([0, *_block_sizes(len(view_sizes), num_parties)])
    flat = np.arange(int(np.prod(feature_shape))).reshape(width, -1)
    slices = []
    for first, last in zip(group_bounds[:-1], group_bounds[1:], strict=True):
        block = flat[view_bounds[first] : view_bounds[last]]
        shape = (len(block), *feature_shape[1:]) if image else (block.size,)
        slices.append(PartySlice(block.reshape(-1), tuple(int(s) for s in shape)))
    return slices


def feature_importance(
    x_train: np.ndarray, y_train: np.ndarray, *, bins: int = 16, max_rows: int = 10_000
) -> np.ndarray:
    """Importance of each flat feature: its mutual information (nats) with the label.

    Plug-in estimate on equal-frequency bins: each feature is cut at its ``bins``-quantiles of the
    training rows (ties stay together, so a constant feature scores exactly 0), then
    I(X_j; Y) = sum p(b, c) log(p(b, c) / (p(b) p(c))) from one joint histogram of all features.
    At most ``max_rows`` evenly spaced rows are used. Deterministic and vectorized.
    """
    flat = np.asarray(x_train, dtype=np.float64).reshape(len(x_train), -1)
    labels = np.asarray(y_train)
    if len(flat) != len(labels):
        raise ValueError(f"x_train has {len(flat)} rows but y_train has {len(labels)} labels")
    if len(flat) > max_rows:
        rows = np.linspace(0, len(flat) - 1, max_rows).astype(np.int64)
        flat, labels = flat[rows], labels[rows]
    _, label_codes = np.unique(labels, return_inverse=True)
    num_rows, num_features = flat.shape
    num_labels = int(label_codes.max()) + 1
    inner_edges = np.quantile(flat, np.linspace(0, 1, bins + 1)[1:-1], axis=0)
    codes = np.zeros((num_rows, num_features), dtype=np.int64)
    for edge in inner_edges:
        codes += flat > edge
    cell = (np.arange(num_features) * bins + codes) * num_labels + label_codes[:, None]
    joint = np.bincount(cell.ravel(), minlength=num_features * bins * num_labels)
    joint = joint.reshape(num_features, bins, num_labels) / num_rows
    p_bin = joint.sum(axis=2, keepdims=True)
    p_label = joint.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = joint * np.log(joint / (p_bin * p_label))
    return np.nansum(terms, axis=(1, 2))


def importance(
    feature_shape: Sequence[int],
    num_parties: int,
    x_train: np.ndarray | None,
    y_train: np.ndarray | None,
) -> list[PartySlice]:
    """Parties with (nearly) equal total feature importance, in the spirit of VertiBench's
    importance-based split (Wu et al. 2024) at its balanced end.

    Importance is estimated on the training rows (:func:`feature_importance`); features are then
    assigned greedily, most important first, each to the party whose total is lowest (ties: fewer
    features, then lower index). Deterministic; every party gets at least one feature.
    """
    num_features = int(np.prod(feature_shape))
    _check_num_parties(num_parties, num_features)
    if x_train is None or y_train is None:
        raise ValueError("partition 'importance' needs the training rows (x_train and y_train)")
    scores = feature_importance(x_train, y_train)
    if len(scores) != num_features:
        raise ValueError(
            f"partition 'importance': x_train has {len(scores)} features, expected {num_features}"
        )
    totals = np.zeros(num_parties)
    counts = np.zeros(num_parties, dtype=np.int64)
    owner = np.empty(num_features, dtype=np.int64)
    for feature in np.argsort(-scores, kind="stable"):
        party = min(range(num_parties), key=lambda m: (totals[m], counts[m], m))
        owner[feature] = party
        totals[party] += scores[feature]
        counts[party] += 1
    slices = []
    for m in range(num_parties):
        index = np.flatnonzero(owner == m)
        slices.append(PartySlice(index, (len(index),)))
    return slices


PARTITIONS = {
    "even": even,
    "quadrants": quadrants,
    "halves": halves,
    "strips": strips,
    "explicit": explicit,
    "views": views,
    "importance": importance,
}


def make_partition(
    kind: str,
    feature_shape: Sequence[int],
    num_parties: int,
    *,
    columns: Sequence[Sequence[int]] | None = None,
    view_sizes: Sequence[int] | None = None,
    x_train: np.ndarray | None = None,
    y_train: np.ndarray | None = None,
) -> list[PartySlice]:
    """Build the partition ``kind`` (one of :data:`PARTITIONS`) for ``num_parties`` parties.

    ``x_train``/``y_train`` (training rows only) are needed by ``importance``.
    """
    if kind not in PARTITIONS:
        raise ValueError(f"unknown partition {kind!r}; choose one of {sorted(PARTITIONS)}")
    if kind == "explicit":
        return explicit(feature_shape, num_parties, columns)
    if kind == "views":
        return views(feature_shape, num_parties, view_sizes)
    if kind == "importance":
        return importance(feature_shape, num_parties, x_train, y_train)
    return PARTITIONS[kind](feature_shape, num_parties)
