"""Attacks run by the server: feature reconstruction of one party's raw features from what the
server received (``attack=feature_reconstruction``)."""

from __future__ import annotations

import torch

from vfl_lightning.privacy.attacks.feature_reconstruction import (
    FeatureReconstructor,
    r2_per_feature,
    relative_mse,
)
from vfl_lightning.privacy.attacks.harness import WireAttack
from vfl_lightning.privacy.attacks.views import server_view


class FeatureReconstructionAttack(WireAttack):
    """Training-based back mapping (model inversion) by the server.

    Assumption: the server knows the raw features of ``target_party`` for a random fraction
    ``aux_fraction`` of the training samples (and, as always, their labels). From each observed
    sample it keeps the last value it received that carries the target party: the party's own
    message where the wire carries messages apart (noisy under LDP), else the fused value it
    computed itself: from pairwise-masked messages (the secure sum), or by the protocol's
    :meth:`~vfl_lightning.algorithms.base.VFLModule.server_decoder` of the responders' coded
    embeddings (the quantized average of every client's embedding). A ridge decoder (linear or
    quadratic, chosen by leave-one-out error) fitted on the auxiliary rows reconstructs every
    other observed row.

    Metrics: ``rel_mse`` (MSE over the MSE of predicting the auxiliary mean; 1 learns nothing),
    ``r2`` (per feature; None for a constant feature), ``r2_mean``, ``label_baseline_rel_mse``
    (the server's class means of the auxiliary rows: what the labels alone give),
    ``performance`` = max(0, 1 − rel_mse) for the DCS (AP* = 0).
    """

    name = "feature_reconstruction"
    role = "server"
    headline = "rel_mse"
    headline_label = "reconstruction relative MSE (1 = learns nothing)"
    assumptions = "raw features of target_party for an aux_fraction of training samples"

    def __init__(
        self,
        aux_fraction: float = 0.1,
        target_party: int = 0,
        seed: int = 0,
        reference_metric: float | None = None,
    ) -> None:
        super().__init__(seed, reference_metric)
        if not 0.0 < float(aux_fraction) < 1.0:
            raise ValueError(f"attack.aux_fraction must be in (0, 1), got {aux_fraction}")
        if int(target_party) < 0:
            raise ValueError(f"attack.target_party must be >= 0, got {target_party}")
        self.aux_fraction = float(aux_fraction)
        self.target_party = int(target_party)
        self.adversary: FeatureReconstructor | None = None
        self._secure_sum = None
        self._decode = None

    def config(self) -> dict:
        return super().config() | {
            "aux_fraction": self.aux_fraction,
            "target_party": self.target_party,
        }

    def check(self, pl_module, datamodule) -> None:
        if self.target_party >= pl_module.num_parties:
            self.refuse(
                f"attack.target_party must be in [0, {pl_module.num_parties - 1}], "
                f"got {self.target_party}"
            )
        masked = pl_module.mechanism.uses_pair_masks
        self._secure_sum = pl_module.mechanism.fuse if masked else None
        # a coded protocol's server sees only its own decoding of the responders' messages
        self._decode = pl_module.server_decoder()
        self.adversary = FeatureReconstructor(len(self.true_labels), pl_module.num_classes)

    def observe_batch(self, pl_module, idx, labels) -> None:
        view = server_view(
            self.recorder,
            idx,
            labels,
            target_party=self.target_party,
            num_parties=pl_module.num_parties,
            secure_sum=self._secure_sum,
            decode=self._decode,
        )
        if view is not None:
            self.adversary.observe(view)

    def target_columns(self, pl_module, datamodule) -> torch.Tensor:
        """The target party's training columns: the attack's auxiliary data and its ground
        truth. Under ``runtime=ray`` the server's data module holds no party column, so the
        harness (an experiment's instrument, not the protocol) reads them with the run's party
        factory after training, as the party's actor does."""
        factory = getattr(pl_module.party_side, "factory", None)
        if factory is not None:
            return factory.own_columns(self.target_party)[0]["train"]
        return datamodule.splits["train"].xs[self.target_party]

    def evaluate(self, pl_module, datamodule) -> dict:
        observed = self.adversary.seen.nonzero().squeeze(1)
        order = torch.randperm(len(observed), generator=self.generator())
        aux_count = max(2, round(self.aux_fraction * len(observed)))
        if aux_count >= len(observed):
            self.refuse(f"observed only {len(observed)} samples, too few for an auxiliary set")
        aux_idx, rest_idx = observed[order[:aux_count]], observed[order[aux_count:]]
        features = self.target_columns(pl_module, datamodule)
        aux_features = features[aux_idx]
        out = self.adversary.reconstruct(aux_idx, aux_features, rest_idx)
        truth = features[rest_idx]
        aux_mean = aux_features.reshape(aux_count, -1).to(torch.float64).mean(0)
        rel_mse = relative_mse(out["decoded"], truth, aux_mean)
        r2 = r2_per_feature(out["decoded"], truth)
        defined = [value for value in r2 if value is not None]
        return {
            "rel_mse": rel_mse,
            "label_baseline_rel_mse": relative_mse(out["label_baseline"], truth, aux_mean),
            "r2": r2,
            "r2_mean": sum(defined) / len(defined) if defined else None,
            "decoder_degree": out["degree"],
            "observed_samples": len(observed),
            "aux_samples": aux_count,
            "separate_messages": bool(self.adversary.separate),
            "performance": max(0.0, 1.0 - rel_mse),
            "num_classes": pl_module.num_classes,
        }

    def attack_baseline(self, num_classes: int) -> float:
        return 0.0
