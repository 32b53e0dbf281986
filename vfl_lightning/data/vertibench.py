"""Feature splits after VertiBench ("VertiBench: Advancing Feature Distribution Diversity in
Vertical Federated Learning Benchmarks", Wu et al.): the imbalance of feature importance across
parties (α) and the correlation inside parties (β), as partitions and as the measures its
evaluators report of any split. Plain numpy.

- α: party m's importance is the sum of its features' importance (mutual information with the
  label, :func:`~vfl_lightning.data.partition.feature_importance`; VertiBench's evaluator sums
  Shapley values of a trained model instead). With s the parties' normalized importances and v
  their (population) variance, the evaluator's α = (M - 1 - M² v) / (M³ v): the symmetric
  Dirichlet parameter whose shares have that variance (∞ for equal shares).
- β: Pcor(A) of a correlation block is the standard deviation (ddof 1) of its singular values
  over sqrt(min(A's shape)); Icor of a split is the mean over parties i of the mean over j ≠ i of
  Pcor(C_ji) - Pcor(C_ii), C the Spearman correlation of the training rows (a constant column
  correlates 0 with everything, itself too). β = (Icor - Icor_min) / (Icor_max - Icor_min),
  clipped to [0, 1], the extremes taken over the splits with the same party sizes. VertiBench
  finds them with a genetic search; here a seeded swap search from two clustered starting splits,
  with a fixed budget of evaluations, so β is an estimate of the same definition.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_BETA_FEATURES = 1024
"""Above this many features β is not estimated (each candidate split costs SVDs of the blocks of
an F x F correlation matrix)."""
MAX_ROWS = 2000
"""Training rows (evenly spaced) the correlation and the importance of a split are measured on."""


def sample_rows(x: np.ndarray, y: np.ndarray | None = None, max_rows: int = MAX_ROWS):
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    if len(flat) <= max_rows:
        return flat, y
    rows = np.linspace(0, len(flat) - 1, max_rows).astype(np.int64)
    return flat[rows], None if y is None else np.asarray(y)[rows]


# ----------------------------------------------------------------------------- α
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


def dirichlet_alpha(party_importance: Sequence[float]) -> float:
    """VertiBench's importance evaluator: the α whose symmetric Dirichlet shares have the
    variance of the normalized ``party_importance`` (∞ when the shares are equal)."""
    scores = np.asarray(party_importance, dtype=np.float64)
    parties = len(scores)
    if parties < 2 or scores.sum() <= 0:
        return float("nan")
    shares = scores / scores.sum()
    variance = float(np.var(shares))
    if variance <= 0:
        return float("inf")
    return (parties - 1 - parties**2 * variance) / (parties**3 * variance)


def party_importance(importance: np.ndarray, parts: Sequence[np.ndarray]) -> np.ndarray:
    """Each party's importance: the sum of its features' importance."""
    return np.array([float(importance[np.asarray(index)].sum()) for index in parts])


def assign_by_importance(importance: np.ndarray, shares: np.ndarray) -> list[np.ndarray]:
    """Features to parties so that party m's share of the total importance comes near
    ``shares[m]``: most important first, each to the party furthest below its target; then
    every party left empty takes the least important feature of the party with the most."""
    parties = len(shares)
    total = float(importance.sum())
    if total <= 0:  # no feature carries importance: shares of the features instead
        importance, total = np.ones_like(importance), float(len(importance))
    target = shares * total
    held = np.zeros(parties)
    owner = np.empty(len(importance), dtype=np.int64)
    for feature in np.argsort(-importance, kind="stable"):
        party = int(np.argmax(target - held))
        owner[feature] = party
        held[party] += importance[feature]
    for party in range(parties):
        if not (owner == party).any():
            counts = np.bincount(owner, minlength=parties)
            donor = int(np.argmax(counts))
            mine = np.flatnonzero(owner == donor)
            owner[mine[np.argmin(importance[mine])]] = party
    return [np.flatnonzero(owner == m) for m in range(parties)]


# ----------------------------------------------------------------------------- β
def spearman(x: np.ndarray) -> np.ndarray:
    """Spearman correlation of the columns of ``x`` (rows: samples); 0 for a constant column."""
    from scipy.stats import rankdata

    ranks = rankdata(x, axis=0)
    ranks -= ranks.mean(axis=0)
    norms = np.sqrt((ranks**2).sum(axis=0))
    constant = norms == 0
    norms[constant] = 1.0
    ranks /= norms
    corr = ranks.T @ ranks
    corr[constant, :] = 0.0
    corr[:, constant] = 0.0
    return corr


def pcor(block: np.ndarray) -> float:
    """VertiBench's Pcor of a correlation block: std (ddof 1) of its singular values over
    sqrt(min(shape)); 0 when the block has at most one singular value."""
    if min(block.shape) <= 1:
        return 0.0
    values = np.linalg.svd(block, compute_uv=False)
    return float(np.std(values, ddof=1) / np.sqrt(min(block.shape)))


def icor(corr: np.ndarray, parts: Sequence[np.ndarray]) -> float:
    """VertiBench's Icor of the split ``parts`` (feature indices per party): the mean over
    parties i of the mean over j != i of Pcor(C_ji) - Pcor(C_ii)."""
    parties = len(parts)
    if parties < 2:
        return 0.0
    scores = np.zeros((parties, parties))
    for i in range(parties):
        for j in range(i + 1):
            scores[i, j] = scores[j, i] = pcor(corr[np.ix_(parts[i], parts[j])])
    inner = np.diag(scores)
    inter = (scores.sum(axis=0) - inner) / (parties - 1)
    return float(np.mean(inter - inner))


def cut(order: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    bounds = np.cumsum([0, *sizes])
    return [np.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def clustered_order(corr: np.ndarray) -> np.ndarray:
    """Features ordered so that correlated ones sit together (average-linkage clustering on
    1 - |corr|)."""
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import squareform

    if len(corr) < 3:
        return np.arange(len(corr))
    distance = 1.0 - np.abs(corr)
    np.fill_diagonal(distance, 0.0)
    distance = np.clip((distance + distance.T) / 2, 0.0, None)
    return leaves_list(linkage(squareform(distance, checks=False), method="average"))


def evaluation_budget(sizes: Sequence[int], evaluations: int) -> int:
    """Swap proposals per search: ``evaluations``, fewer for large blocks (the SVD work of one
    candidate split, sum over block pairs of f_i f_j min(f_i, f_j), kept near 10^8 per search
    step budget), at least 10."""
    work = sum(a * b * min(a, b) for i, a in enumerate(sizes) for b in sizes[: i + 1])
    return int(max(10, min(evaluations, 2e8 / max(work, 1))))


def swap_search(corr, order, sizes, score, rng, evaluations: int):
    """Hill-climb over swaps of two features of different parties, keeping a swap that lowers
    ``score(parts)``: returns (best order, its score)."""
    owner = np.repeat(np.arange(len(sizes)), sizes)
    order = order.copy()
    best = score(cut(order, sizes))
    for _ in range(evaluations):
        a, b = rng.integers(len(order), size=2)
        if owner[a] == owner[b]:
            continue
        order[[a, b]] = order[[b, a]]
        candidate = score(cut(order, sizes))
        if candidate < best:
            best = candidate
        else:
            order[[a, b]] = order[[b, a]]
    return order, best


def icor_range(corr: np.ndarray, sizes: Sequence[int], seed: int, evaluations: int = 300):
    """(Icor_min, Icor_max) estimated over the splits with party sizes ``sizes``: a swap search
    from the clustered split (correlated features together) for the minimum and from the
    round-robin split of the same order (spread apart) for the maximum."""
    rng = np.random.default_rng([seed, 7919])
    budget = evaluation_budget(sizes, evaluations)
    order = clustered_order(corr)
    spread = np.concatenate([order[m :: len(sizes)] for m in range(len(sizes))])
    _, low = swap_search(corr, order, sizes, lambda p: icor(corr, p), rng, budget)
    _, high = swap_search(corr, spread, sizes, lambda p: -icor(corr, p), rng, budget)
    return low, -high


def split_beta(corr: np.ndarray, parts: Sequence[np.ndarray], seed: int) -> float:
    """β of the split ``parts``: where its Icor lies between the estimated extremes (clipped)."""
    sizes = [len(p) for p in parts]
    value = icor(corr, parts)
    low, high = icor_range(corr, sizes, seed)
    low, high = min(low, value), max(high, value)
    if high - low <= 1e-12:
        return float("nan")
    return float(np.clip((value - low) / (high - low), 0.0, 1.0))


def correlation_split(
    corr: np.ndarray, sizes: Sequence[int], beta: float, seed: int, evaluations: int = 300
) -> list[np.ndarray]:
    """A split with party sizes ``sizes`` whose Icor is near Icor_min + β (Icor_max - Icor_min)
    (the extremes of :func:`icor_range` with the same seed and budget, so :func:`split_beta`
    of the result is near β): a swap search towards that target from the clustered split
    (β < 1/2) or the spread one."""
    low, high = icor_range(corr, sizes, seed, evaluations)
    target = low + beta * (high - low)
    order = clustered_order(corr)
    if beta >= 0.5:
        order = np.concatenate([order[m :: len(sizes)] for m in range(len(sizes))])
    rng = np.random.default_rng([seed, 104_729])
    budget = evaluation_budget(sizes, evaluations)
    order, _ = swap_search(
        corr, order, sizes, lambda p: abs(icor(corr, p) - target), rng, 4 * budget
    )
    return cut(order, sizes)


def split_scores(x_train, y_train, parts: Sequence[np.ndarray], seed: int) -> dict[str, float]:
    """``data/split_alpha`` and ``data/split_beta`` of the split ``parts`` (flat feature indices
    per party, the label holder's own slice included), measured on the training rows; β is NaN
    above :data:`MAX_BETA_FEATURES` features."""
    x, y = sample_rows(x_train, y_train)
    alpha = dirichlet_alpha(party_importance(feature_importance(x, y), parts))
    beta = float("nan")
    if x.shape[1] <= MAX_BETA_FEATURES and len(parts) > 1:
        beta = split_beta(spearman(x), parts, seed)
    return {"data/split_alpha": alpha, "data/split_beta": beta}
