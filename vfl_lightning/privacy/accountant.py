"""Privacy accountant for PBM-VFL and its LDP baseline: records training and evaluation releases,
reports (ε, δ).

Every formula is in :mod:`vfl_lightning.privacy.analysis`; this object keeps history and state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vfl_lightning.privacy.analysis import (
    DEFAULT_ORDERS,
    ldp_feature_rdp,
    ldp_sample_rdp,
    pbm_feature_rdp,
    pbm_sample_rdp,
    rdp_to_dp,
)

LEVELS = ("feature", "sample")


ANALYSES = ("pbm", "ldp")
"""The analyses a mechanism may name as its ``accounting`` (PBM's, the LDP baseline's)."""


def check_accounted(mechanism) -> None:
    """Refuse a mechanism the accountant has no analysis for."""
    if getattr(mechanism, "accounting", None) not in ANALYSES:
        raise TypeError(
            f"no privacy accounting for mechanism {type(mechanism).__name__}; use PBM or "
            "GaussianLDP"
        )


def composed_rdp(
    mechanism, level: str, *, orders: Sequence[float], embedding_dim: int, uses: float
) -> np.ndarray:
    """The RDP curve after ``uses`` releases of every training sample's P-dim fused embedding.

    Only picks the :mod:`vfl_lightning.privacy.analysis` function of ``mechanism`` and ``level``
    and passes the mechanism's parameters: PBM's exact ε(α) (:func:`pbm_feature_rdp`,
    :func:`pbm_sample_rdp`), the LDP baseline's Gaussian ε(α) (:func:`ldp_feature_rdp`,
    :func:`ldp_sample_rdp`).
    """
    check_accounted(mechanism)
    if level not in LEVELS:
        raise ValueError(f"privacy level must be one of {LEVELS}, got {level!r}")
    common = {"orders": orders, "embedding_dim": embedding_dim, "uses": uses}
    parameters = mechanism.parameters_state()
    if mechanism.accounting == "pbm":
        pbm = {key: parameters[key] for key in ("b", "beta", "num_parties")}
        analysis = pbm_feature_rdp if level == "feature" else pbm_sample_rdp
        return analysis(**common, **pbm)
    ldp = {key: parameters[key] for key in ("sigma", "C")}
    if level == "feature":
        return ldp_feature_rdp(**common, **ldp)
    return ldp_sample_rdp(**common, **ldp, num_parties=parameters["num_parties"])


class PrivacyAccountant:
    """Records how many training samples were released and turns that into (ε, δ).

    What the numbers assume (the paper's Theorems 6.1 and 6.2): every training step releases the
    noisy embedding sum of each sample of its batch once; different samples are disjoint releases
    (parallel composition), so a sample's privacy loss composes over its expected number of uses
    T·B/N = (samples released so far) / N, with no subsampling amplification (every party knows
    which samples are in a batch). Feature ε protects one party's embedding of a sample; sample ε
    protects all M embeddings of a sample. The conversion to (ε, δ) is dp_accounting's,
    minimized over ``orders``.

    Evaluation releases (:meth:`record_evaluation`) are accounted apart: a validation or test
    batch releases each of its samples' noisy embedding sum once, with fresh noise (every
    evaluation draws its own). Validation and test samples are disjoint from the training samples
    and from each other, so by parallel composition the evaluation ε is that of the most-released
    evaluation sample: the same formula at ``eval_uses`` = the largest number of releases of one
    validation or test sample (a validation sample is released once per validation epoch, the
    sanity check included; a test sample once per test). It is reported beside the training ε
    (``eval_feature_eps``), not added to it: no sample is in both. An evaluation without the
    mechanism (``apply_at_eval=false``) releases clean embeddings: once one has happened
    (:meth:`record_evaluation` with ``clean``) the evaluation ε is infinite.
    """

    def __init__(
        self,
        mechanism,
        *,
        embedding_dim: int,
        num_samples: int,
        delta: float = 1e-5,
        orders: Sequence[float] = DEFAULT_ORDERS,
    ) -> None:
        if int(embedding_dim) < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {embedding_dim}")
        if int(num_samples) < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.orders = tuple(float(a) for a in orders)
        self.embedding_dim = int(embedding_dim)
        self.num_samples = int(num_samples)
        self.delta = float(delta)
        check_accounted(mechanism)
        self.mechanism = mechanism
        self.mechanism_state = {"name": type(mechanism).__name__, **mechanism.state_dict()}
        self.samples_released = 0
        self.epoch_history: list[int] = []
        self.eval_counts: dict[str, np.ndarray] = {}
        self.clean_eval_releases = 0
        self._spent: tuple[tuple[int, int], dict[str, float]] | None = None

    def record(self, batch_size: int) -> None:
        """One training step released the fused embeddings of ``batch_size`` samples."""
        self.samples_released += int(batch_size)

    def end_epoch(self) -> None:
        """Remember the cumulative count at the end of an epoch."""
        self.epoch_history.append(self.samples_released)

    def record_evaluation(self, split: str, indices, split_size: int, clean: bool = False) -> None:
        """One evaluation batch of ``split`` (val, test) released samples ``indices`` (indices
        into that split of ``split_size`` samples) once each; ``clean``: without noise."""
        if clean:
            self.clean_eval_releases += len(indices)
            return
        counts = self.eval_counts.get(split)
        if counts is None or len(counts) != int(split_size):
            counts = self.eval_counts[split] = np.zeros(int(split_size), dtype=np.int64)
        np.add.at(counts, np.asarray(indices, dtype=np.int64), 1)

    @property
    def uses(self) -> float:
        """Expected releases of one training sample so far: T·B/N."""
        return self.samples_released / self.num_samples

    @property
    def eval_uses(self) -> int:
        """Releases of the most-released validation or test sample so far."""
        return max((int(counts.max()) for counts in self.eval_counts.values()), default=0)

    def eval_epsilon(self, level: str) -> tuple[float, float]:
        """(ε, optimal α) of the evaluation releases at ``delta``; (0, nan) before any; (∞, nan)
        once one was clean."""
        if self.clean_eval_releases:
            return math.inf, float("nan")
        if self.eval_uses == 0:
            return 0.0, float("nan")
        rdp = composed_rdp(
            self.mechanism,
            level,
            orders=self.orders,
            embedding_dim=self.embedding_dim,
            uses=self.eval_uses,
        )
        return rdp_to_dp(orders=self.orders, rdp=rdp, delta=self.delta)

    def rdp(self, level: str) -> np.ndarray:
        """The composed RDP curve over ``orders`` for ``level`` 'feature' or 'sample'."""
        return composed_rdp(
            self.mechanism,
            level,
            orders=self.orders,
            embedding_dim=self.embedding_dim,
            uses=self.uses,
        )

    def epsilon(self, level: str) -> tuple[float, float]:
        """(ε, optimal α) at ``delta``; (0, nan) before any release."""
        if self.samples_released == 0:
            return 0.0, float("nan")
        return rdp_to_dp(orders=self.orders, rdp=self.rdp(level), delta=self.delta)

    def spent(self) -> dict[str, float]:
        """Feature and sample ε at δ, the optimal α of the feature ε, and the evaluation
        releases' feature and sample ε (computed once per count of released samples: the epoch's
        log, curve.csv and results.json ask for it)."""
        key = (self.samples_released, self.eval_uses, self.clean_eval_releases)
        if self._spent is None or self._spent[0] != key:
            feature_eps, feature_alpha = self.epsilon("feature")
            sample_eps, sample_alpha = self.epsilon("sample")
            values = {
                "feature_eps": feature_eps,
                "sample_eps": sample_eps,
                "alpha": feature_alpha,
                "sample_alpha": sample_alpha,
                "eval_feature_eps": self.eval_epsilon("feature")[0],
                "eval_sample_eps": self.eval_epsilon("sample")[0],
            }
            self._spent = (key, values)
        return dict(self._spent[1])

    def _identity(self) -> dict:
        return {
            "mechanism": self.mechanism_state,
            "embedding_dim": self.embedding_dim,
            "num_samples": self.num_samples,
            "delta": self.delta,
            "orders": list(self.orders),
        }

    def state_dict(self) -> dict:
        return {
            **self._identity(),
            "samples_released": self.samples_released,
            "epoch_history": list(self.epoch_history),
            "eval_counts": {split: c.tolist() for split, c in self.eval_counts.items()},
            "clean_eval_releases": self.clean_eval_releases,
        }

    def load_state_dict(self, state: dict) -> None:
        saved = {key: state.get(key) for key in self._identity()}
        if saved != self._identity():
            raise ValueError(
                f"privacy accountant state was written for {saved}, this run accounts for "
                f"{self._identity()}"
            )
        self.samples_released = int(state["samples_released"])
        self.epoch_history = [int(n) for n in state["epoch_history"]]
        self.eval_counts = {
            split: np.asarray(counts, dtype=np.int64)
            for split, counts in state.get("eval_counts", {}).items()
        }
        self.clean_eval_releases = int(state.get("clean_eval_releases", 0))
