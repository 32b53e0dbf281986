"""The message-canary audit (``audit=canary_message``): canaries placed where the accountant's
guarantee starts, at the party's clipped embedding, so the bound and the accountant's ε are about
exactly the same releases.

Party ``party``'s training releases of ``count`` rows (drawn with their coins from the run's
seed, ``data.canaries.<name>``) carry one of the mechanism's two worst-case inputs (every element
+C or −C, by the coin) instead of its embedding (:mod:`~vfl_lightning.algorithms.release_canaries`).
The coin reaches nothing else: the rows' features are untouched, and whatever the server does
with a release (its head's update, the gradient it sends back) is post-processing of it. The
:class:`MessageCanaryAuditor` is the server: from what it received in each training batch (the
audited party's own noisy message under LDP, the secure sum under PBM) it adds up each canary's
likelihood-ratio score (:mod:`~vfl_lightning.privacy.analysis.release_scores`). The
:class:`MessageCanaryAudit` callback is the trusted harness: it holds the coins, fixes the number
of guesses before the run from the accountant's ε, and turns the guesses into the f-DP one-run
bound (:mod:`~vfl_lightning.privacy.analysis.fdp_audit`) under the mechanism's own family of
trade-off functions: μ-GDP for LDP (a canary's releases are exactly that), PBM's worst case over
the other parties for PBM.
"""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import torch

from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.analysis.message_audit import message_canary_bound, write_scores
from vfl_lightning.privacy.analysis.release_scores import (
    gaussian_release_scores,
    pbm_release_scores,
)
from vfl_lightning.privacy.attacks.views import BatchRecorder, server_view
from vfl_lightning.privacy.audit.canary import (
    AuditState,
    accountant_epsilon,
    check_confidence_and_delta,
)

log = logging.getLogger(__name__)

MECHANISMS = ("pbm", "ldp")
"""The analyses (a mechanism's ``accounting``) whose releases this audit scores and bounds."""


class MessageCanaryAuditor:
    """The server's guesser: it knows which training rows are canaries (``canary_ids``) and how a
    release is scored (``release_scores``: received rows -> log-likelihood ratios); it adds up
    each canary's scores over its releases (:meth:`observe`). Never told a coin."""

    def __init__(self, canary_ids: torch.Tensor, num_samples: int, release_scores) -> None:
        self.release_scores = release_scores
        self.position = torch.full((int(num_samples),), -1, dtype=torch.int64)
        self.position[canary_ids.to(torch.int64).cpu()] = torch.arange(len(canary_ids))
        self.sums = np.zeros(len(canary_ids))
        self.counts = np.zeros(len(canary_ids), dtype=np.int64)

    def observe(self, idx: torch.Tensor, received: torch.Tensor) -> None:
        slots = self.position[idx.detach().cpu()]
        hit = (slots >= 0).numpy()
        if not hit.any():
            return
        rows = received.detach().cpu().to(torch.float64).numpy()[hit]
        np.add.at(self.sums, slots.numpy()[hit], self.release_scores(rows))
        np.add.at(self.counts, slots.numpy()[hit], 1)

    def scores(self) -> np.ndarray:
        """One score per canary (> 0: coin 1), NaN for a canary never released."""
        return np.where(self.counts > 0, self.sums, np.nan)

    def state_dict(self) -> dict:
        return {"sums": self.sums.tolist(), "counts": self.counts.tolist()}

    def load_state_dict(self, state: dict) -> None:
        sums, counts = np.asarray(state["sums"]), np.asarray(state["counts"], dtype=np.int64)
        if sums.shape != self.sums.shape or counts.shape != self.counts.shape:
            raise ValueError(
                f"the checkpoint's audit scored {len(sums)} canaries, this run has {len(self.sums)}"
            )
        self.sums, self.counts = sums, counts


class MessageCanaryAudit(AuditState, L.Callback):
    """The trusted harness of message-canary audit ``name`` (see the module).

    ``count`` canaries (rows) of party ``party``; ``guesses``: how many of its most confident
    canaries the auditor guesses (None: planned before the run from the accountant's ε and the
    canaries released, :func:`~vfl_lightning.privacy.analysis.fdp_audit.planned_guesses`); the
    bound holds at ``confidence`` and the accountant's ``delta``. ``scores_path``: where every
    canary's score and coin are written with the audit's setting, so that runs of one setting pool
    into a multi-run bound (:func:`~vfl_lightning.privacy.analysis.message_audit.pooled_bound`,
    the audit report's ``pooled`` column). Its state (every canary's score
    so far) travels in the checkpoint, so a resumed audit equals the uninterrupted one; a
    checkpoint without it is refused. Results: ``audit/<name>/<key>`` (:meth:`results`).
    """

    def __init__(
        self,
        name: str = "canary_message",
        count: int = 1000,
        party: int = 0,
        confidence: float = 0.95,
        guesses: int | None = None,
        delta: float = 1e-5,
        scores_path: str | None = None,
    ) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 10:
            raise ValueError(f"audit.{name}.count must be an integer >= 10, got {count!r}")
        if guesses is not None and (
            isinstance(guesses, bool) or not isinstance(guesses, int) or not 1 <= guesses <= count
        ):
            raise ValueError(
                f"audit.{name}.guesses must be null (planned) or an integer in [1, count = "
                f"{count}], got {guesses!r}"
            )
        check_confidence_and_delta(name, confidence, delta)
        self.name, self.count, self.party = name, int(count), int(party)
        self.confidence, self.delta, self.guesses = float(confidence), float(delta), guesses
        self.scores_path = scores_path
        self.recorder = BatchRecorder()
        self.auditor: MessageCanaryAuditor | None = None
        self.coins: np.ndarray | None = None
        self.metrics: dict = {}
        self._mechanism = None
        self._secure_sum = None
        self._width = 0

    @classmethod
    def check_protocol(cls, protocol: type, name: str, mechanism: type | None = None) -> None:
        """From the configuration alone: a protocol whose training releases go through the
        parties' send, where the canaries are put (the sync family), and a mechanism with
        privacy accounting (PBM, LDP)."""
        if getattr(protocol, "CODED_MESSAGES", False):
            raise ConfigError(
                f"audit={name}: the FedVS family sends coded embeddings; audit the sync protocols"
            )
        if not getattr(protocol, "RELEASE_CANARIES", False):
            raise ConfigError(
                f"audit={name}: {protocol.__name__} releases its embeddings outside the parties' "
                "batch messages, where message canaries are put; audit a sync protocol (pbm, ldp)"
            )
        accounting = getattr(mechanism, "accounting", None)
        if mechanism is not None and accounting not in MECHANISMS:
            raise ConfigError(
                f"audit={name}: mechanism {mechanism.__name__} has no privacy accounting (a "
                "release without noise has ε = ∞): audit mechanism=pbm or ldp"
            )

    def refuse(self, reason: str) -> None:
        raise ConfigError(f"audit={self.name}: {reason}")

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        record = getattr(trainer.datamodule, "canary_records", {}).get(self.name)
        if record is None or record.level != "message":
            self.refuse(f"the data hold no message canaries data.canaries.{self.name}")
        mechanism = pl_module.mechanism
        self.check_protocol(type(pl_module), self.name, type(mechanism))
        if not pl_module.party_side.canaries_from_run:
            self.refuse(
                f"the {pl_module.party_side.name} parties take no setting from the server, so "
                "none would put the canaries into its releases: audit runtime=local or ray"
            )
        self._mechanism = mechanism
        self._secure_sum = mechanism.fuse if mechanism.uses_pair_masks else None
        self._width = int(pl_module.widths[self.party])
        self.coins = record.coins.numpy().copy()
        train_size = len(trainer.datamodule.splits["train"])
        self.auditor = MessageCanaryAuditor(record.rows, train_size, self.release_scores())
        self.restore_pending()
        if self.recorder not in pl_module.wire.listeners:
            pl_module.wire.listeners.append(self.recorder)

    def release_scores(self):
        """The server's likelihood-ratio score of one received release, for this mechanism."""
        parameters = self._mechanism.parameters_state()
        if self._mechanism.accounting == "ldp":
            sigma, bound = parameters["sigma"], parameters["C"]
            return lambda rows: gaussian_release_scores(rows, clip_bound=bound, sigma=sigma)
        pbm = {key: parameters[key] for key in ("b", "beta", "num_parties")}
        return lambda rows: pbm_release_scores(rows, clip_bound=parameters["C"], **pbm)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.recorder.clear()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        view = server_view(
            self.recorder,
            batch[2],
            batch[1],
            target_party=self.party,
            num_parties=pl_module.num_parties,
            secure_sum=self._secure_sum,
        )
        if view is not None:
            self.auditor.observe(view.idx, view.received)
        self.recorder.clear()

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.wire.listeners.remove(self.recorder)
        self.metrics = self.evaluate()

    def evaluate(self) -> dict:
        counts = self.auditor.counts
        releases, released = int(counts.max()), int((counts > 0).sum())
        if released < len(counts):
            log.warning(
                "audit=%s: %d of the %d canaries were released in training (e.g. under "
                "trainer.limit_train_batches): its bound rests on those %d alone",
                self.name,
                released,
                len(counts),
                released,
            )
        accountant = accountant_epsilon(
            self._mechanism,
            "feature",
            embedding_dim=self._width,
            releases=releases,
            delta=self.delta,
        )
        parameters = self._mechanism.parameters_state()
        setting = {
            "accounting": self._mechanism.accounting,
            **{key: parameters.get(key) for key in ("C", "sigma", "b", "beta", "num_parties")},
            "width": self._width,
            "releases": releases,
            "delta": self.delta,
            "confidence": self.confidence,
            "eps_accountant": accountant,
        }
        if self.scores_path is not None:
            write_scores(self.scores_path, setting, self.auditor.scores(), self.coins)
        bound = message_canary_bound(
            setting=setting, scores=self.auditor.scores(), coins=self.coins, guesses=self.guesses
        )
        return bound | {
            "eps_accountant": accountant,
            "releases": releases,
            "released": released,
            "party": self.party,
            "confidence": self.confidence,
            "delta": self.delta,
            "statistic": "fdp_one_run",
        }

    def results(self) -> dict:
        """``audit/<name>/``: ``eps_lower`` (the f-DP one-run bound at ``confidence``),
        ``eps_accountant`` (the accountant's feature ε at ``delta`` for the releases of the
        most-released canary: exactly the releases the bound is about), ``guess_acc`` (over
        every canary released), ``n`` (canaries), ``guesses`` and ``correct``,
        ``eps_lower_max`` (the bound had every guess been right), ``strength_lower`` (the
        least private hypothesis rejected: μ for LDP, β for PBM) and ``family``, ``releases``,
        ``released``, ``party``, ``confidence``, ``delta``, ``statistic``, ``headline``."""
        label = "feature privacy (message canaries): lower bound on ε"
        out = {f"audit/{self.name}/{key}": value for key, value in self.metrics.items()}
        return out | {f"audit/{self.name}/headline": self.headline_result(label)}
