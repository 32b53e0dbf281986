"""An attack outside the library: an eavesdropper on party ``party``'s uplink who knows the labels
of a fraction ``aux_fraction`` of the training samples infers every other observed sample's
label as the class whose mean observed embedding (over the known samples) is nearest."""

from __future__ import annotations

import torch

from vfl_lightning.privacy.attacks.harness import WireAttack
from vfl_lightning.wire import UPLINK


class UplinkCentroidAttack(WireAttack):
    name = "uplink_centroids"
    role = "eavesdropper"
    assumptions = "plain per-party uplink messages; labels of an auxiliary fraction of samples"
    headline = "acc"
    headline_label = "uplink-centroid label accuracy"

    def __init__(
        self,
        party: int = 0,
        aux_fraction: float = 0.2,
        seed: int = 0,
        reference_metric: float | None = None,
    ) -> None:
        super().__init__(seed, reference_metric)
        if not 0 < aux_fraction < 1:
            raise ValueError(f"attack.aux_fraction must be in (0, 1), got {aux_fraction}")
        self.party = int(party)
        self.aux_fraction = float(aux_fraction)
        self.observed: dict[int, torch.Tensor] = {}

    def config(self) -> dict:
        return super().config() | {"party": self.party, "aux_fraction": self.aux_fraction}

    def check(self, pl_module, datamodule) -> None:
        if not 0 <= self.party < pl_module.num_parties:
            self.refuse(f"attack.party must be in [0, {pl_module.num_parties - 1}]")
        if not pl_module.PER_PARTY_MESSAGES or pl_module.mechanism.uses_pair_masks:
            self.refuse(f"algo={pl_module.name} sends no plain per-party embedding")

    def observe_batch(self, pl_module, idx, labels) -> None:
        for message in self.recorder.messages.get(self.party, []):
            if message.direction == UPLINK and message.kind == "embedding":
                for row, embedding in zip(idx.tolist(), message.payload.detach().cpu()):
                    self.observed[row] = embedding.float().reshape(-1)

    def evaluate(self, pl_module, datamodule) -> dict:
        rows = torch.tensor(sorted(self.observed))
        embeddings = torch.stack([self.observed[r] for r in rows.tolist()])
        labels = self.true_labels[rows]
        known = torch.rand(len(rows), generator=self.generator()) < self.aux_fraction
        classes = pl_module.num_classes
        centroids = torch.stack(
            [
                embeddings[known & (labels == c)].mean(0)
                if (known & (labels == c)).any()
                else torch.full_like(embeddings[0], float("inf"))
                for c in range(classes)
            ]
        )
        guesses = torch.cdist(embeddings[~known], centroids).argmin(1)
        accuracy = float((guesses == labels[~known]).float().mean())
        return {"acc": accuracy, "performance": accuracy, "num_classes": classes}

    def attack_baseline(self, num_classes: int) -> float:
        return 1.0 / num_classes
