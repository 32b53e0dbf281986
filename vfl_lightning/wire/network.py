"""The simulated network and compute model every protocol's clock runs on (``conf/network``):
link bandwidth and latency, compute rate, and per-party straggler delays."""

from __future__ import annotations

import numpy as np

from vfl_lightning.wire.stragglers import StragglerDelays, transfer_seconds


class Network:
    """One model of time for every protocol.

    A message of ``bits`` takes ``latency_s + bits / (mbps · 10^6)`` seconds; local compute takes
    multiply-adds / ``macs_per_second`` (a field multiply-add of FedVS counts ``field_op_cost``);
    the sample alignment's group operations (a hash to ristretto255 or a scalar multiplication)
    take 1 / ``group_ops_per_second`` each.
    Stragglers: each party's work in a round is also delayed by Exp(mean) seconds, mean
    ``fast_mean`` for the first parties and ``straggler_base + straggler_slope · i / N`` for the
    last ``straggler_fraction`` of them (FedVS §6.2, :class:`StragglerDelays`); all zero by
    default (``conf/network/default.yaml``), the paper's values in ``conf/network/fedvs.yaml``.
    (A plain class, not a dataclass: Hydra would turn a dataclass argument into a config.)
    """

    def __init__(
        self,
        mbps: float = 300.0,
        latency_s: float = 0.0,
        macs_per_second: float = 1e9,
        field_op_cost: float = 3.0,
        fast_mean: float = 0.0,
        straggler_base: float = 0.0,
        straggler_slope: float = 0.0,
        straggler_fraction: float = 0.0,
        group_ops_per_second: float = 2.5e4,
    ) -> None:
        self.mbps = float(mbps)
        self.latency_s = float(latency_s)
        self.macs_per_second = float(macs_per_second)
        self.field_op_cost = float(field_op_cost)
        self.fast_mean = float(fast_mean)
        self.straggler_base = float(straggler_base)
        self.straggler_slope = float(straggler_slope)
        self.straggler_fraction = float(straggler_fraction)
        self.group_ops_per_second = float(group_ops_per_second)
        for label in ("mbps", "macs_per_second", "field_op_cost", "group_ops_per_second"):
            if not getattr(self, label) > 0:
                raise ValueError(f"network.{label} must be > 0, got {getattr(self, label)}")
        for label in ("latency_s", "fast_mean", "straggler_base", "straggler_slope"):
            if not getattr(self, label) >= 0:
                raise ValueError(f"network.{label} must be >= 0, got {getattr(self, label)}")
        if not 0.0 <= self.straggler_fraction <= 1.0:
            raise ValueError(
                f"network.straggler_fraction must be in [0, 1], got {self.straggler_fraction}"
            )

    @property
    def has_stragglers(self) -> bool:
        """Whether any party's work is randomly delayed."""
        slow = self.straggler_fraction > 0 and (self.straggler_base > 0 or self.straggler_slope > 0)
        return self.fast_mean > 0 or slow

    def transfer_seconds(self, bits: float | np.ndarray) -> float | np.ndarray:
        """Time for messages of ``bits`` to cross one link: latency plus size over bandwidth."""
        return self.latency_s + transfer_seconds(bits, self.mbps)

    def link_seconds(self, bits: int) -> float:
        """:meth:`transfer_seconds` of one message, in plain Python floats (per-round path)."""
        return self.latency_s + bits / (self.mbps * 1e6)

    def compute_seconds(self, macs: float | np.ndarray, *, field: bool = False):
        """Time for ``macs`` multiply-adds (field ones cost ``field_op_cost`` each)."""
        cost = self.field_op_cost if field else 1.0
        return np.asarray(macs, dtype=np.float64) * cost / self.macs_per_second

    def stragglers(self, num_parties: int, seed: int) -> StragglerDelays:
        """The seeded per-party delay draws of this network."""
        return StragglerDelays(
            num_parties,
            fast_mean=self.fast_mean,
            straggler_base=self.straggler_base,
            straggler_slope=self.straggler_slope,
            straggler_fraction=self.straggler_fraction,
            seed=seed,
        )
