"""The canary audit (``audit=canary``, ``audit=canary_sample``): an empirical lower bound on ε from
the server's view, beside the accountant's ε for exactly the releases audited.

Two objects, as for the attacks: the :class:`CanaryAuditor` is the adversary (the server role),
which receives only the server's view of each training batch (what the wire carried to it:
plain or noisy per-party embeddings, or the secure sum it computed from masked messages), the
canaries' sample ids and the coins of the ``known`` canaries it is told; the :class:`CanaryAudit`
callback is the trusted harness, which holds the other coins and scores the guesses.
"""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import torch

from vfl_lightning.data.canaries import DATA_LEVELS
from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.accountant import ANALYSES, composed_rdp
from vfl_lightning.privacy.analysis import DEFAULT_ORDERS, rdp_to_dp
from vfl_lightning.privacy.analysis.audit import canary_audit_bound, linear_scores
from vfl_lightning.privacy.attacks.views import BatchRecorder, ServerView, server_view

log = logging.getLogger(__name__)


class CanaryAuditor:
    """The server's guesser. It knows which samples are canaries (``canary_ids``, in the order of
    their coins), the coins of the first ``len(known_coins)`` of them, and what it received for
    each canary in every training batch (:meth:`observe`); it averages the values received for
    each canary over all its releases and guesses the others' coins with a linear rule fitted on
    the known ones (:func:`~vfl_lightning.privacy.analysis.audit.linear_scores`)."""

    def __init__(self, canary_ids: torch.Tensor, known_coins: torch.Tensor, num_samples: int):
        self.canary_ids = canary_ids.to(torch.int64).cpu()
        self.known_coins = known_coins.to(torch.int64).cpu()
        self.position = torch.full((int(num_samples),), -1, dtype=torch.int64)
        self.position[self.canary_ids] = torch.arange(len(self.canary_ids))
        self.sums: torch.Tensor | None = None
        self.counts = torch.zeros(len(self.canary_ids), dtype=torch.int64)

    def observe(self, idx: torch.Tensor, received: torch.Tensor) -> None:
        """What the auditor received of training rows ``idx`` (one row each) in one batch."""
        slots = self.position[idx.detach().cpu()]
        hit = slots >= 0
        if not bool(hit.any()):
            return
        received = received.detach().cpu().to(torch.float64).reshape(len(slots), -1)[hit]
        if self.sums is None:
            self.sums = torch.zeros(len(self.canary_ids), received.shape[1], dtype=torch.float64)
        self.sums.index_add_(0, slots[hit], received)
        self.counts.index_add_(0, slots[hit], torch.ones_like(slots[hit]))

    def state_dict(self) -> dict:
        return {"sums": self.sums, "counts": self.counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        counts = state["counts"]
        if counts.shape != self.counts.shape:
            raise ValueError(
                f"the checkpoint's audit observed {len(counts)} canaries, this run has "
                f"{len(self.counts)}"
            )
        self.sums = None if state["sums"] is None else state["sums"].clone()
        self.counts = counts.clone()

    def scores(self) -> np.ndarray:
        """One score per canary after the known ones (> 0: coin 1; NaN: never observed, or no
        guess at all while the known canaries observed so far do not show both coins)."""
        known = len(self.known_coins)
        seen = set(self.known_coins[self.counts[:known] > 0].tolist())
        if self.sums is None or seen != {0, 1}:
            return np.full(len(self.canary_ids) - known, np.nan)
        means = (self.sums / self.counts[:, None]).numpy()  # 0/0 = NaN: never observed
        return linear_scores(
            known_releases=means[:known],
            known_coins=self.known_coins.numpy(),
            releases=means[known:],
        )


def accountant_epsilon(
    mechanism, level: str, *, embedding_dim: int, releases: int, delta: float
) -> float | str:
    """The accountant's ε at ``delta`` after ``releases`` releases of one sample's P-dim
    embedding(s): the composition over exactly the releases a canary took part in; ``"inf"``
    for a mechanism without noise."""
    if releases == 0:
        return 0.0
    if not getattr(mechanism, "noisy", False):
        return "inf"
    rdp = composed_rdp(
        mechanism, level, orders=DEFAULT_ORDERS, embedding_dim=embedding_dim, uses=releases
    )
    return rdp_to_dp(orders=DEFAULT_ORDERS, rdp=rdp, delta=delta)[0]


def check_confidence_and_delta(name: str, confidence: float, delta: float) -> None:
    """``audit.<name>.confidence`` and its δ, each in (0, 1), or one ValueError naming it."""
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"audit.{name}.confidence must be in (0, 1), got {confidence}")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"audit.{name}.delta must be in (0, 1), got {delta}")


class AuditState:
    """The checkpointed part of an audit callback: what its ``auditor`` observed so far (its
    ``state_dict``), so a resumed audit equals the uninterrupted one; a checkpoint written
    without it is refused in one line (the resumed audit would miss every earlier release)."""

    name = ""
    auditor = None
    _pending_state: dict | None = None

    @property
    def state_key(self) -> str:
        return L.Callback._generate_state_key(self, name=self.name)

    def state_dict(self) -> dict:
        if self.auditor is None:
            return dict(self._pending_state or {})
        return self.auditor.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        if self.auditor is None:
            self._pending_state = dict(state_dict)
        else:
            self.auditor.load_state_dict(state_dict)

    headline = "eps_lower"
    """The metric that sums an audit up; printed and drawn beside ``eps_accountant``."""

    def headline_result(self, label: str) -> dict:
        """``audit/<name>/headline``: its metric, the metric to show beside it, and its label."""
        return {"metric": self.headline, "versus": "eps_accountant", "label": label}

    def restore_pending(self) -> None:
        """Hand the auditor built at setup a state loaded before it existed."""
        if self._pending_state is not None:
            self.auditor.load_state_dict(self._pending_state)
            self._pending_state = None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self.state_key not in checkpoint.get("callbacks", {}):
            raise ConfigError(
                f"audit={self.name}: the checkpoint holds no state of this audit (it was written "
                "without it), so the resumed audit would miss the releases before it: resume "
                f"without audit={self.name}, or start the run afresh"
            )


class CanaryAudit(AuditState, L.Callback):
    """The trusted harness of one canary audit ``name`` (its canaries are written into the data
    by ``data.canaries.<name>``, :mod:`~vfl_lightning.data.canaries`).

    ``level``: ``feature`` (one party's features are audited, ``data.canaries.<name>.party``; the auditor reads that party's
    own message where the wire carries messages apart, else the secure sum) or ``sample`` (every
    party's features; it reads every party's message, or the secure sum). ``known`` of the
    ``count`` canaries have coins the auditor is told (its calibration); the other
    n = count − known are audited. The bound is the one-run bound at ``confidence`` and ``delta``
    (:func:`~vfl_lightning.privacy.analysis.audit.canary_audit_bound`); ``eps_accountant`` is the
    accountant's ε at ``delta`` for the releases of the most-released audited canary.

    What the two numbers cover: each canary's releases are PBM or Gaussian releases of its
    embeddings, which the accountant composes. The canary's features also reach the party's own
    model through its local training, and so every later release of every sample; neither the
    paper's analysis nor the accountant counts that channel, and the bound, valid for everything
    the auditor's guesses depend on (the known canaries' releases included), could exceed the
    accountant's ε through it. Results: ``audit/<name>/<key>`` (:meth:`results`).
    """

    def __init__(
        self,
        name: str = "canary",
        level: str = "feature",
        count: int = 200,
        known: int = 40,
        confidence: float = 0.95,
        delta: float = 1e-5,
    ) -> None:
        if level not in DATA_LEVELS:
            raise ValueError(f"audit.{name} level must be one of {DATA_LEVELS}, got {level!r}")
        if isinstance(known, bool) or not isinstance(known, int) or not 2 <= known <= count - 10:
            raise ValueError(
                f"audit.{name}.known must be an integer in [2, count - 10] = [2, {count - 10}] "
                f"(calibration canaries, leaving at least 10 audited), got {known!r}"
            )
        check_confidence_and_delta(name, confidence, delta)
        self.name, self.level = name, level
        self.count, self.known = int(count), int(known)
        self.confidence, self.delta = float(confidence), float(delta)
        self.recorder = BatchRecorder()
        self.auditor: CanaryAuditor | None = None
        self.coins: torch.Tensor | None = None
        self.parties: tuple[int, ...] = ()
        self.metrics: dict = {}
        self._fuse = None
        self._mechanism = None
        self._width = 0

    def refuse(self, reason: str) -> None:
        raise ConfigError(f"audit={self.name}: {reason}")

    @classmethod
    def check_protocol(cls, protocol: type, name: str, mechanism: type | None = None) -> None:
        """Refuse, from the configuration alone (before anything is built), a protocol whose
        server never receives an embedding of a party: the FedVS family's coded messages."""
        if getattr(protocol, "CODED_MESSAGES", False):
            raise ConfigError(
                f"audit={name}: the FedVS family sends coded embeddings; audit the sync protocols"
            )

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        record = getattr(trainer.datamodule, "canary_records", {}).get(self.name)
        if record is None:
            self.refuse(f"the training data hold no canaries data.canaries.{self.name}")
        if len(record.rows) != self.count:
            self.refuse(
                f"data.canaries.{self.name} has {len(record.rows)} canaries, not {self.count}"
            )
        self.check_protocol(type(pl_module), self.name)
        mechanism = pl_module.mechanism
        if getattr(mechanism, "noisy", False) and mechanism.accounting not in ANALYSES:
            self.refuse(f"no privacy accounting for mechanism {type(mechanism).__name__}")
        self._mechanism = mechanism
        self._fuse = mechanism.fuse if mechanism.uses_pair_masks else None
        self._width = int(pl_module.widths[record.parties[0]])
        self.parties = record.parties
        self.coins = record.coins.clone()
        known_coins = record.coins[: self.known]
        if len(set(known_coins.tolist())) < 2:
            self.refuse(
                f"the {self.known} known canaries all have one coin: raise audit.{self.name}.known"
            )
        train_size = len(trainer.datamodule.splits["train"])
        self.auditor = CanaryAuditor(record.rows, known_coins, train_size)
        self.restore_pending()
        if self.recorder not in pl_module.wire.listeners:
            pl_module.wire.listeners.append(self.recorder)

    def server_view(self, idx: torch.Tensor, labels: torch.Tensor, num_parties: int):
        """The server's view for the audit: the secure sum, or the audited parties' own messages
        side by side; None when an audited party sent nothing for the batch."""
        common = {"num_parties": num_parties, "secure_sum": self._fuse}
        if self._fuse is not None:
            return server_view(self.recorder, idx, labels, target_party=0, **common)
        views = [
            server_view(self.recorder, idx, labels, target_party=m, **common) for m in self.parties
        ]
        if any(view is None for view in views):
            return None
        received = torch.cat([view.received for view in views], dim=1)
        return ServerView(idx, labels, received, separate=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.recorder.clear()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        view = self.server_view(batch[2], batch[1], pl_module.num_parties)
        if view is not None:
            self.auditor.observe(view.idx, view.received)
        self.recorder.clear()

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.wire.listeners.remove(self.recorder)
        self.metrics = self.evaluate()

    def evaluate(self) -> dict:
        truth = self.coins[self.known :].numpy()
        bound = canary_audit_bound(
            scores=self.auditor.scores(), coins=truth, delta=self.delta, confidence=self.confidence
        )
        audited = self.auditor.counts[self.known :]
        releases = int(audited.max())
        released = int((audited > 0).sum())
        if released < len(audited):
            log.warning(
                "audit=%s: %d of the %d audited canaries were released in training (the others "
                "never reached the server, e.g. under trainer.limit_train_batches): its bound "
                "rests on those %d alone",
                self.name,
                released,
                len(audited),
                released,
            )
        eps = accountant_epsilon(
            self._mechanism,
            self.level,
            embedding_dim=self._width,
            releases=releases,
            delta=self.delta,
        )
        return bound | {
            "eps_accountant": eps,
            "releases": releases,
            "released": released,
            "known": self.known,
            "level": self.level,
            "parties": list(self.parties),
            "confidence": self.confidence,
            "delta": self.delta,
        }

    def results(self) -> dict:
        """``audit/<name>/``: ``eps_lower`` (the bound), ``eps_accountant``, ``guess_acc`` (over
        every guess made), ``n`` (audited canaries), ``guesses`` and ``correct`` (of the number
        of guesses that gave the bound), ``eps_lower_max`` (the bound if every guess were right),
        ``releases`` (of the most-released audited canary), ``released`` (audited canaries
        released at least once: the others are never guessed), ``headline``, ``known``, ``level``,
        ``parties``, ``confidence``, ``delta``."""
        label = f"{self.level} privacy (input canaries): lower bound on ε"
        out = {f"audit/{self.name}/{key}": value for key, value in self.metrics.items()}
        return out | {f"audit/{self.name}/headline": self.headline_result(label)}
