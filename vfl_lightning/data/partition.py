"""Vertical partitions: which features each party holds.

Plain numpy. A partition maps a sample's feature shape (``(F,)`` for tables, ``(C, H, W)`` for
images) to one :class:`PartySlice` per party: the flat indices (C-order) of its features and the
shape its slice has. Every feature belongs to exactly one party.

``data.partition`` names one (a key of :data:`PARTITIONS`, or a dotted path), or is a config node
``{_target_: function, option: value, ...}``: the function is called with the feature shape, the
number of parties, its options, and those of ``seed`` (the run's), ``x_train``/``y_train`` (the
training rows), ``columns`` and ``view_sizes`` that its signature takes
(:func:`make_partition`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vfl_lightning.data.partition_options import check_options
from vfl_lightning.data.raw import named_or_imported
from vfl_lightning.data.vertibench import (
    assign_by_importance,
    correlation_split,
    feature_importance,
    sample_rows,
    spearman,
)


@dataclass(frozen=True)
class PartySlice:
    """The features one party holds: flat indices into the sample and the slice's shape."""

    index: np.ndarray
    shape: tuple[int, ...]


def _check_num_parties(num_parties: int, num_features: int) -> None:
    if not isinstance(num_parties, (int, np.integer)) or num_parties < 1:
        raise ValueError(f"data.num_parties must be an integer >= 1, got {num_parties!r}")
    if num_parties > num_features:
        raise ValueError(
            f"data.num_parties must be at most the number of features ({num_features}), got "
            f"{num_parties}: lower data.num_parties"
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
        raise ValueError(
            f"data.partition=quadrants needs num_parties == 4, got {num_parties}: set "
            "data.num_parties=4, or data.partition=strips (any number up to the image width)"
        )
    shape = _image_shape(feature_shape, "quadrants")
    return _grid(shape, _block_sizes(shape[1], 2), _block_sizes(shape[2], 2))


def halves(feature_shape: Sequence[int], num_parties: int) -> list[PartySlice]:
    """Left and right image halves."""
    if num_parties != 2:
        raise ValueError(
            f"data.partition=halves needs num_parties == 2, got {num_parties}: set "
            "data.num_parties=2, or data.partition=strips (any number up to the image width)"
        )
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
            f"data.partition=explicit needs one column list per party ({num_parties}), got "
            f"{got}: give data.columns one list of column indices per party (or set "
            "data.num_parties to the number of lists)"
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


def vertibench_importance(
    feature_shape: Sequence[int],
    num_parties: int,
    *,
    alpha: float = 1.0,
    x_train: np.ndarray | None = None,
    y_train: np.ndarray | None = None,
    seed: int = 0,
) -> list[PartySlice]:
    """VertiBench's importance split: the parties' shares of the total feature importance drawn
    from a symmetric Dirichlet(``alpha``) (seeded by the run's ``seed``), the features assigned
    most important first to the party furthest below its share; every party gets at least one
    feature. Small α: a few parties hold most of the importance; large α: balanced."""
    num_features = int(np.prod(feature_shape))
    _check_num_parties(num_parties, num_features)
    alpha = _positive("vertibench_importance", "alpha", alpha)
    if x_train is None or y_train is None:
        raise ValueError("partition 'vertibench_importance' needs the training rows")
    x, y = sample_rows(x_train, y_train)
    shares = np.random.default_rng([seed, 1_000_003]).dirichlet(np.full(num_parties, alpha))
    parts = assign_by_importance(feature_importance(x, y), shares)
    return [PartySlice(index, (len(index),)) for index in parts]


def vertibench_correlation(
    feature_shape: Sequence[int],
    num_parties: int,
    *,
    beta: float = 0.5,
    evaluations: int = 300,
    x_train: np.ndarray | None = None,
    seed: int = 0,
) -> list[PartySlice]:
    """VertiBench's correlation split: parties of (nearly) equal size whose Icor lies a share
    ``beta`` of the way from its minimum (correlated features inside the same party) to its
    maximum (correlated features spread across parties), found by a seeded swap search of
    ``evaluations`` proposals per step (:func:`~vfl_lightning.data.vertibench.correlation_split`)."""
    num_features = int(np.prod(feature_shape))
    _check_num_parties(num_parties, num_features)
    if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0 <= beta <= 1:
        raise ValueError(f"data.partition.beta must be a number in [0, 1], got {beta!r}")
    if isinstance(evaluations, bool) or not isinstance(evaluations, int) or evaluations < 1:
        raise ValueError(f"data.partition.evaluations must be an integer >= 1, got {evaluations!r}")
    if x_train is None:
        raise ValueError("partition 'vertibench_correlation' needs the training rows")
    x, _ = sample_rows(x_train)
    corr = spearman(x)
    parts = correlation_split(
        corr, _block_sizes(num_features, num_parties), float(beta), seed, evaluations
    )
    return [PartySlice(index, (len(index),)) for index in parts]


def _positive(name: str, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"data.partition.{key} must be a number > 0 for {name}, got {value!r}")
    return float(value)


PARTITIONS = {
    "even": even,
    "quadrants": quadrants,
    "halves": halves,
    "strips": strips,
    "explicit": explicit,
    "views": views,
    "importance": importance,
    "vertibench_importance": vertibench_importance,
    "vertibench_correlation": vertibench_correlation,
}


def partition_function(spec) -> tuple[typing.Callable, dict]:
    """(function, options) of ``data.partition``: a name or dotted path (no options), a config
    node ``{_target_: ..., **options}``, or a ``functools.partial`` of one. Unknown names and
    targets, and options the function does not take or of the wrong type, are one line each."""
    if isinstance(spec, functools.partial):
        function, options = spec.func, dict(spec.keywords)
    elif isinstance(spec, typing.Mapping):
        options = {k: v for k, v in spec.items() if k not in ("_target_", "_partial_")}
        target = spec.get("_target_")
        if not isinstance(target, str) or "." not in target:
            raise ValueError(
                f"data.partition._target_ must be a dotted path package.module.function, got "
                f"{target!r}"
            )
        module, _, attribute = target.rpartition(".")
        try:
            function = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(
                f"data.partition._target_={target} cannot be imported: {error}"
            ) from None
    else:
        function, options = named_or_imported(spec, PARTITIONS, "partition"), {}
    check_options(function, options)
    return function, options


def make_partition(
    kind,
    feature_shape: Sequence[int],
    num_parties: int,
    *,
    columns: Sequence[Sequence[int]] | None = None,
    view_sizes: Sequence[int] | None = None,
    x_train: np.ndarray | None = None,
    y_train: np.ndarray | None = None,
    seed: int = 0,
) -> list[PartySlice]:
    """Build the partition ``kind`` for ``num_parties`` parties: one of :data:`PARTITIONS`, the
    dotted path of a function ``(feature_shape, num_parties, ...) -> list[PartySlice]`` outside
    the library, or a config node with its ``_target_`` and options (:func:`partition_function`).

    Each function also gets, when its signature takes them, the run's ``seed``, the training rows
    ``x_train``/``y_train`` (``importance``, the VertiBench splits), ``columns`` (``explicit``)
    and ``view_sizes`` (``views``).
    """
    function, options = partition_function(kind)
    context = {
        "seed": seed,
        "x_train": x_train,
        "y_train": y_train,
        "columns": columns,
        "view_sizes": view_sizes,
    }
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = {}
    given = {k: v for k, v in context.items() if k in parameters and k not in options}
    return function(feature_shape, num_parties, **options, **given)
