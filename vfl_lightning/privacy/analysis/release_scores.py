"""The server's likelihood-ratio scores of message canaries (pure numpy): for each release it
received, log P(release | coin 1) / P(release | coin 0), where the coin put the audited party's
clipped embedding at +C or −C in every coordinate; a canary's score sums its releases."""

from __future__ import annotations

import numpy as np
from scipy.stats import binom


def gaussian_release_scores(received: np.ndarray, *, clip_bound: float, sigma: float) -> np.ndarray:
    """The audited party's own noisy message y = ±C·1 + N(0, σ² I) (the LDP baseline sends it
    apart): log-likelihood ratio (2C/σ²) Σ_j y_j, one per row."""
    received = np.asarray(received, dtype=np.float64)
    return (2.0 * clip_bound / sigma**2) * received.reshape(len(received), -1).sum(axis=1)


def pbm_count_scores(*, b: int, beta: float, num_parties: int) -> np.ndarray:
    """Per value of the count Σq in [0, M·b]: log P(Σq | audited party high) / P(Σq | low), the
    other parties' (M − 1)·b trials taken as fair coins (the server knows nothing of their
    values; a prior, not fitted to the run)."""
    others = binom.pmf(np.arange((num_parties - 1) * b + 1), (num_parties - 1) * b, 0.5)
    high = np.convolve(binom.pmf(np.arange(b + 1), b, 0.5 + beta), others)
    low = np.convolve(binom.pmf(np.arange(b + 1), b, 0.5 - beta), others)
    return np.log(high) - np.log(low)


def pbm_release_scores(
    received: np.ndarray, *, b: int, beta: float, clip_bound: float, num_parties: int
) -> np.ndarray:
    """The secure sum the server dequantized, (C/(βb))(Σq − bM/2) per coordinate: the count Σq is
    read back from it, and the row's score is the sum over coordinates of
    :func:`pbm_count_scores`."""
    received = np.asarray(received, dtype=np.float64)
    counts = np.rint(received * (beta * b / clip_bound) + b * num_parties / 2.0)
    counts = np.clip(counts, 0, num_parties * b).astype(np.int64)
    table = pbm_count_scores(b=b, beta=beta, num_parties=num_parties)
    return table[counts.reshape(len(counts), -1)].sum(axis=1)
