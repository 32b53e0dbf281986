"""The label-canary audit (``audit=canary_label``): label privacy (``defense=label_dp``) audited
from a passive party's view.

``count`` training rows (drawn with their coins from the run's seed, ``data.canaries.<name>``,
level ``label``) have their training label set to their coin, class 0 or 1; their features are
untouched. The label holder trains on them as on every label: under ``defense=label_dp`` each
training label is released once by randomized response (ε-label-DP) and everything the server
does afterwards is post-processing of those released labels, so a passive party's view is ε-DP
with respect to each canary's coin. The auditor is party ``party``: it receives only the
gradients the server sends it (:func:`~vfl_lightning.privacy.attacks.views.party_view`), sums
each canary's gradient rows over its releases, and guesses the coins with a linear rule fitted on
the ``known`` canaries whose labels it is told (the same rule as the input canaries'). The bound
is the f-DP one-run analysis under the (ε, 0) hypotheses of pure label DP, beside the defense's ε
(∞ without a label defense: the labels are used as they are).
"""

from __future__ import annotations

import lightning as L

from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.analysis.audit import guess_counts
from vfl_lightning.privacy.analysis.fdp_audit import fdp_lower_bound
from vfl_lightning.privacy.analysis.tradeoff import EpsilonDeltaFamily
from vfl_lightning.privacy.attacks.views import BatchRecorder, party_view
from vfl_lightning.privacy.audit.canary import AuditState, CanaryAuditor


class LabelCanaryAudit(AuditState, L.Callback):
    """The trusted harness of label-canary audit ``name`` (see the module); results
    ``audit/<name>/<key>`` (:meth:`results`)."""

    def __init__(
        self,
        name: str = "canary_label",
        count: int = 200,
        known: int = 40,
        party: int = 0,
        confidence: float = 0.95,
    ) -> None:
        if isinstance(known, bool) or not isinstance(known, int) or not 2 <= known <= count - 10:
            raise ValueError(
                f"audit.{name}.known must be an integer in [2, count - 10] = [2, {count - 10}] "
                f"(calibration canaries, leaving at least 10 audited), got {known!r}"
            )
        if not 0.0 < float(confidence) < 1.0:
            raise ValueError(f"audit.{name}.confidence must be in (0, 1), got {confidence}")
        self.name, self.count, self.known = name, int(count), int(known)
        self.party, self.confidence = int(party), float(confidence)
        self.recorder = BatchRecorder()
        self.auditor: CanaryAuditor | None = None
        self.coins = None
        self.label_epsilon: float | None = None
        self.metrics: dict = {}

    @classmethod
    def check_protocol(cls, protocol: type, name: str, mechanism: type | None = None) -> None:
        """From the configuration alone: the FedVS family's coded messages are refused."""
        if getattr(protocol, "CODED_MESSAGES", False):
            raise ConfigError(
                f"audit={name}: the FedVS family sends coded embeddings; audit the sync protocols"
            )

    def refuse(self, reason: str) -> None:
        raise ConfigError(f"audit={self.name}: {reason}")

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        record = getattr(trainer.datamodule, "canary_records", {}).get(self.name)
        if record is None or record.level != "label":
            self.refuse(f"the data hold no label canaries data.canaries.{self.name}")
        if pl_module.party_answers != "gradients":
            self.refuse(
                f"algo={pl_module.name} sends its clients loss values, not gradients: a passive "
                "party's view of the labels is not per-sample"
            )
        if not 0 <= self.party < pl_module.num_parties:
            self.refuse(f"audit.{self.name}.party must be in [0, {pl_module.num_parties - 1}]")
        defenses = [getattr(c, "label_epsilon", None) for c in trainer.callbacks]
        self.label_epsilon = next((e for e in defenses if e is not None), None)
        self.coins = record.coins.clone()
        known_coins = record.coins[: self.known]
        if len(set(known_coins.tolist())) < 2:
            self.refuse(f"the {self.known} known canaries all have one label: raise known")
        train_size = len(trainer.datamodule.splits["train"])
        self.auditor = CanaryAuditor(record.rows, known_coins, train_size)
        self.restore_pending()
        if self.recorder not in pl_module.wire.listeners:
            pl_module.wire.listeners.append(self.recorder)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.recorder.clear()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        view = party_view(self.recorder, batch[2], self.party)
        if view is not None:
            self.auditor.observe(view.idx, view.gradient)
        self.recorder.clear()

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.wire.listeners.remove(self.recorder)
        self.metrics = self.evaluate()

    def evaluate(self) -> dict:
        audited = self.auditor.counts[self.known :]
        scores = self.auditor.scores()
        made = int((scores == scores).sum())  # NaN: never observed, or no rule yet
        setting = {
            "eps_accountant": "inf" if self.label_epsilon is None else self.label_epsilon,
            "releases": int(audited.max()),
            "released": int((audited > 0).sum()),
            "known": self.known,
            "party": self.party,
            "confidence": self.confidence,
            "statistic": "fdp_one_run",
        }
        if made == 0:
            return setting | {"eps_lower": 0.0, "guess_acc": None, "n": len(audited), "guesses": 0}
        bound = fdp_lower_bound(
            scores=scores,
            coins=self.coins[self.known :].numpy(),
            family=EpsilonDeltaFamily(0.0),
            delta=0.0,
            guesses=guess_counts(made),
            confidence=self.confidence,
        )
        return bound | setting

    def results(self) -> dict:
        """``audit/<name>/``: ``eps_lower`` (the f-DP one-run bound under pure label DP, at
        ``confidence``, over the numbers of guesses every canary, half of them, ... down to 10
        with a Bonferroni correction), ``eps_accountant`` (the label defense's ε; ``"inf"``
        without one), ``guess_acc``, ``n`` (audited canaries), ``guesses`` and ``correct``,
        ``eps_lower_max``, ``releases``, ``released``, ``known``, ``party``, ``confidence``,
        ``statistic``, ``family``, ``headline``."""
        label = f"label privacy (party {self.party}'s view): lower bound on ε"
        out = {f"audit/{self.name}/{key}": value for key, value in self.metrics.items()}
        return out | {f"audit/{self.name}/headline": self.headline_result(label)}
