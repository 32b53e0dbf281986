"""FedVS's round costs on the :class:`Network`: message times from real sizes and modelled compute
times of each step of Algorithm 1 (host floats from shapes), and the one-time data sharing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vfl_lightning.wire.network import Network

FLOAT_BITS = 32


@dataclass(frozen=True)
class FedVSCosts:
    """Seconds of one round's pieces; arrays have one entry per client.

    FedVS: ``share_s`` (send N−1 model shares, encode N·(T+1) of them), ``coded_compute_s`` (one
    coded embedding), ``coded_upload_s``, ``decode_s`` (server). Wait / Ignore: ``plain_compute_s``,
    ``plain_upload_s``. Both: ``download_s`` (∇H to a client), ``update_s`` (the slowest local
    update, forward and backward).
    """

    share_s: np.ndarray
    coded_compute_s: float
    coded_upload_s: float
    decode_s: float
    plain_compute_s: np.ndarray
    plain_upload_s: np.ndarray
    download_s: float
    update_s: float


def fedvs_costs(
    network: Network,
    *,
    feature_counts: Sequence[int],
    width: int,
    per_segment_batch: int,
    K: int,
    T: int,
    threshold: int,
    element_bits: int,
) -> FedVSCosts:
    """Costs of a round with N clients of ``feature_counts`` power features, embedding ``width``,
    |B| = ``per_segment_batch`` positions of K segments, R = ``threshold``, F_p elements of
    ``element_bits`` bits (multiply-adds of the matrix products; field ones cost more)."""
    N, B, h = len(feature_counts), per_segment_batch, width
    share_bits = [f * h * element_bits for f in feature_counts]
    share_s = np.asarray(
        [
            network.transfer_seconds((N - 1) * bits)
            + network.compute_seconds(N * (T + 1) * f * h, field=True)
            for bits, f in zip(share_bits, feature_counts, strict=True)
        ]
    )
    plain_bits = K * B * h * FLOAT_BITS
    return FedVSCosts(
        share_s=share_s,
        coded_compute_s=float(network.compute_seconds(B * sum(feature_counts) * h, field=True)),
        coded_upload_s=float(network.transfer_seconds(B * h * element_bits)),
        decode_s=float(network.compute_seconds(K * threshold * B * h, field=True)),
        plain_compute_s=np.array(
            [float(network.compute_seconds(K * B * f * h)) for f in feature_counts]
        ),
        plain_upload_s=np.full(N, network.transfer_seconds(plain_bits)),
        download_s=float(network.transfer_seconds(plain_bits)),
        update_s=max(float(network.compute_seconds(2 * K * B * f * h)) for f in feature_counts),
    )


def data_sharing_seconds(
    network: Network, *, share_bits: Sequence[int], K: int, T: int, element_bits: int
) -> float:
    """Algorithm 1 lines 1–10 on the clock: each client encodes N·(K+T) shares of its data and
    sends N−1 of them; the slowest client decides."""
    N = len(share_bits)
    seconds = [
        network.transfer_seconds((N - 1) * bits)
        + network.compute_seconds(N * (K + T) * bits / element_bits, field=True)
        for bits in share_bits
    ]
    return float(max(seconds))
