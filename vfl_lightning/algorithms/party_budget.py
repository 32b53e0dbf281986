"""A party's own count of what it released and the privacy it spent: per split, how often each row
was released, with or without noise; the feature ε of its most-released row by the accountant's
analysis of its mechanism; and the refusal, before it is made, of any release its policy does not
allow."""

from __future__ import annotations

import math

import numpy as np
import torch

from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.errors import PartyRefusal
from vfl_lightning.privacy.accountant import ANALYSES, composed_rdp
from vfl_lightning.privacy.analysis import DEFAULT_ORDERS, rdp_to_dp

TRAINING = "train"
"""The split whose releases make the training ε (every other split's make the evaluation ε)."""


class PartyBudget:
    """Party ``party``'s releases and its privacy, counted by the party.

    Every release names its split, its rows (sample indices of that split; None: rows the party
    cannot name, counted as a release of every row) and its noise (the release's noise multiplier,
    None for a release without noise). :meth:`admit` refuses, before the release is made, one its
    ``policy`` does not allow: without noise where clean releases are not allowed, with less
    noise than ``policy.min_noise``, a row past ``policy.max_releases_per_row``, or a row whose
    feature ε at ``policy.delta`` would pass ``policy.max_feature_eps``; it then records it.

    ε: ``mechanism``'s analysis (:func:`~vfl_lightning.privacy.accountant.composed_rdp`, PBM's or
    the LDP baseline's, at ``embedding_dim``) composed over the releases of the party's most
    released row, training and evaluation apart (their rows are disjoint); infinite once a
    release without noise was made; None for noisy releases the library has no analysis for
    (Wait-DP). The server's accountant composes the expected uses T·B/N instead: both agree when
    every training row was released equally often (whole epochs), and the party's is the larger
    otherwise.
    """

    def __init__(
        self, party: int, policy: PartyPolicy, mechanism=None, *, embedding_dim: int = 1
    ) -> None:
        self.party = int(party)
        self.policy = policy
        accounted = getattr(mechanism, "accounting", None) in ANALYSES
        self.mechanism = mechanism if accounted else None
        self.embedding_dim = int(embedding_dim)
        self._counts: dict[str, np.ndarray] = {}
        self._pending: dict[str, list[np.ndarray]] = {}
        self.whole: dict[str, int] = {}
        self.clean: set[str] = set()
        self.unaccounted: set[str] = set()
        self._eps: dict[int, float] = {}
        self._allowed: int | None = None

    @property
    def counts(self) -> dict[str, np.ndarray]:
        """Per split, how often each row was released (index: the row), every recorded release
        included. A release's rows are kept as they are recorded and added to these counts when
        they are read (:meth:`check` under a row limit, :meth:`spent`, :meth:`state_dict`), so a
        training step without a row limit costs one list append."""
        if self._pending:
            self._fold()
        return self._counts

    @counts.setter
    def counts(self, counts: dict[str, np.ndarray]) -> None:
        self._pending = {}
        self._counts = counts

    # ----------------------------------------------------------------- releases
    def admit(self, call: str, split: str, rows: np.ndarray | None, noise: float | None) -> None:
        """Refuse (:class:`PartyRefusal`, one line naming the party, ``call`` and its budget) or
        record the release of ``rows`` of ``split`` with ``noise``."""
        self.check(call, split, rows, noise)
        self.record(split, rows, noise)

    def check(self, call: str, split: str, rows: np.ndarray | None, noise: float | None) -> None:
        """Refuse a release the policy does not allow; nothing is recorded."""
        policy = self.policy
        if noise is None:
            if policy.needs_noise:
                self._refuse(call, self._clean_rule())
        elif policy.min_noise is not None and noise < policy.min_noise:
            self._refuse(
                call,
                f"its noise {noise:.4g} (standard deviation over the clipping bound) is below "
                f"its {policy.setting('min_noise')}",
            )
        elif policy.max_feature_eps is not None and self.mechanism is None:
            self._refuse(
                call,
                f"it has no analysis of its noise to count its ε, so it cannot keep its "
                f"{policy.setting('max_feature_eps')}",
            )
        limit = self._row_limit(noise)
        if limit is None:
            return
        whole = self.whole.get(split, 0)
        counts = self.counts.get(split)
        if rows is None:
            most = whole + 1 + (0 if counts is None else int(counts.max(initial=0)))
            if most > limit:
                self._refuse_row(call, split, None, most, limit)
            return
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size == 0:
            return
        unique, repeats = np.unique(rows, return_counts=True)
        before = np.zeros(len(unique), dtype=np.int64)
        if counts is not None:
            held = unique < len(counts)
            before[held] = counts[unique[held]]
        after = before + repeats + whole
        worst = int(after.argmax())
        if int(after[worst]) > limit:
            self._refuse_row(call, split, int(unique[worst]), int(after[worst]), limit)

    def record(self, split: str, rows: np.ndarray | None, noise: float | None) -> None:
        """Count a release :meth:`check` allowed."""
        counted = self._row_limit(noise) is not None or (
            noise is not None and self.mechanism is not None
        )
        if counted:
            if rows is None:
                self.whole[split] = self.whole.get(split, 0) + 1
            else:
                self._count(split, rows)
        if noise is None:
            self.clean.add(split)
        elif self.mechanism is None:
            self.unaccounted.add(split)

    def _clean_rule(self) -> str:
        policy = self.policy
        if not policy.allow_clean:
            reason = policy.setting("allow_clean")
        elif policy.min_noise is not None:
            reason = policy.setting("min_noise")
        else:
            reason = f"{policy.setting('max_feature_eps')} (a release without noise has ε = ∞)"
        return f"it releases nothing without noise under its {reason}"

    def _row_limit(self, noise: float | None) -> int | None:
        """How often one row may be released under the policy (None: no limit)."""
        limits = [self.policy.max_releases_per_row]
        if noise is not None and self.policy.max_feature_eps is not None:
            limits.append(self.allowed_releases())
        limits = [limit for limit in limits if limit is not None]
        return min(limits) if limits else None

    def _count(self, split: str, rows: np.ndarray) -> None:
        """Keep a copy of ``rows`` for the split's counts (:meth:`_fold`)."""
        rows = np.array(rows, dtype=np.int64).reshape(-1)
        if rows.size:
            self._pending.setdefault(split, []).append(rows)

    def _fold(self) -> None:
        """Add the kept releases to the counts: the counts and array lengths that adding each
        release as it was recorded gives (an array grows to the larger of its row count and
        twice its length when a release names a row past its end; a negative row counts at its
        place from the end of the array as it was then)."""
        pending, self._pending = self._pending, {}
        for split, releases in pending.items():
            every = np.concatenate(releases) if len(releases) > 1 else releases[0]
            if every.min() < 0:
                for rows in releases:
                    self._add(split, rows, int(rows.max()) + 1)
                continue
            sizes = [0, *(len(rows) for rows in releases[:-1])]
            tops = np.maximum.reduceat(every, np.cumsum(sizes)) + 1
            counts = self._counts.get(split)
            length = None if counts is None else len(counts)
            for top in tops.tolist():
                if length is None or length < top:
                    length = max(top, 0 if length is None else 2 * length)
            self._add(split, every, length)

    def _add(self, split: str, rows: np.ndarray, top: int) -> None:
        """Count ``rows`` of ``split`` once each, the array grown to ``top`` rows if shorter (to
        the larger of ``top`` and twice its length)."""
        counts = self._counts.get(split)
        if counts is None or len(counts) < top:
            grown = np.zeros(max(top, 0 if counts is None else 2 * len(counts)), dtype=np.int64)
            if counts is not None:
                grown[: len(counts)] = counts
            counts = self._counts[split] = grown
        np.add.at(counts, rows, 1)

    def row_budget(self, limit: int) -> str:
        """The policy setting that allows ``limit`` releases of a row, as a refusal names it."""
        policy = self.policy
        if policy.max_releases_per_row is not None and limit == policy.max_releases_per_row:
            return policy.setting("max_releases_per_row")
        return (
            f"{policy.setting('max_feature_eps')} at δ = {policy.delta:g}, which allows "
            f"{limit} release(s) of a row"
        )

    def _refuse_row(self, call, split, row, count: int, limit: int) -> None:
        which = "every row" if row is None else f"row {row}"
        self._refuse(
            call,
            f"its budget {self.row_budget(limit)}: this would be release {count} of {which} of "
            f"{split}",
        )

    def _refuse(self, call: str, rule: str) -> None:
        raise PartyRefusal(f"party {self.party} refused {call}: {rule}")

    # ----------------------------------------------------------------- privacy spent
    def epsilon(self, uses: int) -> float:
        """Feature ε at ``policy.delta`` of ``uses`` releases of one row (the accountant's
        analysis of the party's mechanism)."""
        if uses <= 0:
            return 0.0
        if uses not in self._eps:
            rdp = composed_rdp(
                self.mechanism,
                "feature",
                orders=DEFAULT_ORDERS,
                embedding_dim=self.embedding_dim,
                uses=float(uses),
            )
            self._eps[uses] = rdp_to_dp(orders=DEFAULT_ORDERS, rdp=rdp, delta=self.policy.delta)[0]
        return self._eps[uses]

    def allowed_releases(self) -> int:
        """The most releases of one row whose ε stays within ``policy.max_feature_eps`` (ε grows
        with the count: a doubling search, then bisection)."""
        if self._allowed is None:
            cap = self.policy.max_feature_eps
            if self.epsilon(1) > cap:
                self._allowed = 0
            else:
                low, high = 1, 2
                while self.epsilon(high) <= cap:
                    low, high = high, 2 * high
                while high - low > 1:
                    middle = (low + high) // 2
                    low, high = (middle, high) if self.epsilon(middle) <= cap else (low, middle)
                self._allowed = low
        return self._allowed

    def most_released(self, training: bool) -> int:
        """Releases of the most-released row of the training split, or of the evaluation splits."""
        splits = set(self.counts) | set(self.whole)
        chosen = [s for s in splits if (s == TRAINING) == training]
        return max(
            (
                self.whole.get(s, 0) + (int(self.counts[s].max()) if s in self.counts else 0)
                for s in chosen
            ),
            default=0,
        )

    def _spent(self, training: bool) -> float | None:
        splits = {s for s in self.clean | self.unaccounted if (s == TRAINING) == training}
        if splits & self.clean:
            return math.inf
        if splits:
            return None
        return self.epsilon(self.most_released(training)) if self.mechanism is not None else 0.0

    def spent(self) -> dict[str, float | None]:
        """``feature_eps`` (training) and ``eval_feature_eps`` at ``policy.delta`` as this party
        counted them (∞ after a release without noise; None where it has no analysis), and its
        most-released rows."""
        return {
            "feature_eps": self._spent(True),
            "eval_feature_eps": self._spent(False),
            "max_row_releases": self.most_released(True),
            "eval_max_row_releases": self.most_released(False),
        }

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "counts": {split: torch.from_numpy(c.copy()) for split, c in self.counts.items()},
            "whole": dict(self.whole),
            "clean": sorted(self.clean),
            "unaccounted": sorted(self.unaccounted),
        }

    def load_state_dict(self, state: dict) -> None:
        self.counts = {split: c.numpy().copy() for split, c in state["counts"].items()}
        self.whole = {split: int(n) for split, n in state["whole"].items()}
        self.clean = set(state["clean"])
        self.unaccounted = set(state["unaccounted"])
