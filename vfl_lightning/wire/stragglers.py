"""Straggler delays and round timelines on the simulated clock for FedVS and its baselines.

FedVS §6.2: half the clients draw Exp(mean 0.1 s) delays, the other half are stragglers with means
2 + 4i/N; model-sharing delays are scaled by (log^2 N)/|B|; messages move at 300 Mbps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def transfer_seconds(bits: float | np.ndarray, mbps: float) -> float | np.ndarray:
    """Time to move ``bits`` over a link of ``mbps`` megabits per second."""
    return np.asarray(bits, dtype=np.float64) / (mbps * 1e6)


class StragglerDelays:
    """Per-client exponential delays of FedVS §6.2, from a seeded numpy generator.

    The last ``round(straggler_fraction * N)`` clients are stragglers: the i-th of them
    (i = 1, 2, ...) has mean ``straggler_base + straggler_slope * i / N``; the others have mean
    ``fast_mean``. Every call to :meth:`draw` consumes the same number of variates whatever the
    algorithm does with them, so runs with the same seed see the same delays.
    """

    def __init__(
        self,
        num_clients: int,
        *,
        fast_mean: float = 0.1,
        straggler_base: float = 2.0,
        straggler_slope: float = 4.0,
        straggler_fraction: float = 0.5,
        seed: int = 0,
    ) -> None:
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        if not 0.0 <= straggler_fraction <= 1.0:
            raise ValueError(f"straggler_fraction must be in [0, 1], got {straggler_fraction}")
        for label, value in (
            ("fast_mean", fast_mean),
            ("straggler_base", straggler_base),
            ("straggler_slope", straggler_slope),
        ):
            if value < 0:
                raise ValueError(f"{label} must be >= 0, got {value}")
        stragglers = int(round(straggler_fraction * num_clients))
        self.non_stragglers = num_clients - stragglers
        ranks = np.arange(1, stragglers + 1)
        self.means = np.concatenate(
            [
                np.full(num_clients - stragglers, float(fast_mean)),
                straggler_base + straggler_slope * ranks / num_clients,
            ]
        )
        self.rng = np.random.default_rng(seed)

    @property
    def num_clients(self) -> int:
        return len(self.means)

    def draw(self, scale: float = 1.0) -> np.ndarray:
        """One delay per client, Exp(mean_n * scale)."""
        return self.rng.exponential(1.0, self.num_clients) * self.means * scale

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]


def model_sharing_scale(num_clients: int, per_segment_batch: int) -> float:
    """(log2^2 N) / |B|: the §6.2 factor of model-sharing delays relative to upload delays."""
    return math.log2(max(num_clients, 2)) ** 2 / per_segment_batch


@dataclass(frozen=True)
class RoundTiming:
    """One synchronous round on the simulated clock (seconds from the round's start).

    ``arrivals[n]``: when client n's upload reaches the server; ``used``: the clients whose uploads
    the server fuses, in arrival order; ``decision_s``: when the server stops waiting;
    ``duration_s``: the round's length, gradients delivered and applied included.
    """

    arrivals: np.ndarray
    used: tuple[int, ...]
    decision_s: float
    duration_s: float


def fedvs_timing(
    *,
    share_seconds: np.ndarray,
    share_delays: np.ndarray,
    coded_compute_s: float,
    upload_delays: np.ndarray,
    upload_seconds: float,
    threshold: int,
    server_s: float,
    download_s: float,
    update_s: float,
) -> RoundTiming:
    """FedVS round (Algorithm 1 lines 13-35): every coded embedding needs every client's model
    share, so computing starts once the slowest share has arrived; the server decodes at the
    ``threshold``-th (R-th) arrival."""
    shares_ready = float(np.max(share_delays + share_seconds))
    arrivals = shares_ready + coded_compute_s + upload_delays + upload_seconds
    order = np.argsort(arrivals, kind="stable")
    used = tuple(int(n) for n in order[:threshold])
    decision = float(arrivals[order[threshold - 1]])
    return RoundTiming(arrivals, used, decision, decision + server_s + download_s + update_s)


def non_straggler_deadline(arrivals: np.ndarray, non_stragglers: int) -> float:
    """When the last of the first ``non_stragglers`` clients (those with the fast mean) arrives:
    §6.2's Ignore, which "proceeds with aggregating embeddings from non-stragglers"."""
    return float(np.max(arrivals[: max(non_stragglers, 1)]))


def wait_timing(
    *,
    compute_s: np.ndarray,
    upload_delays: np.ndarray,
    upload_seconds: np.ndarray,
    server_s: float,
    download_s: float,
    update_s: float,
    deadline_s: float | None = None,
) -> RoundTiming:
    """Plain synchronous round: the server waits for every client (``deadline_s`` None: Wait), or
    until ``deadline_s`` and fuses what arrived by then (Ignore; if nothing did, the first arrival;
    if everyone did, it need not wait for the deadline)."""
    arrivals = compute_s + upload_delays + upload_seconds
    order = np.argsort(arrivals, kind="stable")
    arrived = len(order) if deadline_s is None else max(1, int(np.sum(arrivals <= deadline_s)))
    used = order[:arrived]
    decision = float(arrivals[used[-1]])
    if deadline_s is not None and arrived < len(order):
        decision = max(decision, float(deadline_s))
    return RoundTiming(
        arrivals, tuple(int(n) for n in used), decision, decision + server_s + download_s + update_s
    )
