"""Attacks run by a passive party: norm and direction scoring of the gradients it received
(``attack=norm_scoring``, ``attack=direction_scoring``) and passive model completion
(``attack=model_completion``)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from vfl_lightning.privacy.attacks.harness import WireAttack
from vfl_lightning.privacy.attacks.label_scoring import GradientScorer
from vfl_lightning.privacy.attacks.model_completion import (
    complete_model,
    frozen_embeddings,
    labelled_rows,
    predict,
)
from vfl_lightning.privacy.attacks.scores import leak_auc
from vfl_lightning.privacy.attacks.views import party_view


class PartyAttack(WireAttack):
    """A passive party ``party``'s attack; refuses a party index outside [0, M−1]."""

    role = "party"

    def __init__(self, party: int = 0, seed: int = 0, reference_metric: float | None = None):
        super().__init__(seed, reference_metric)
        if int(party) < 0:
            raise ValueError(f"attack.party must be >= 0, got {party}")
        self.party = int(party)

    def check(self, pl_module, datamodule) -> None:
        if self.party >= pl_module.num_parties:
            self.refuse(
                f"attack.party must be in [0, {pl_module.num_parties - 1}], got {self.party}"
            )

    def config(self) -> dict:
        return super().config() | {"party": self.party}


class GradientScoringAttack(PartyAttack):
    """Li et al.'s label scoring from the gradients party ``party`` received, on binary tasks.

    Every training row the party received a gradient for is scored (norm, or cosine with one
    known positive row of the same batch, which is then left out). The party ranks each epoch's
    rows: ``auc_by_epoch`` is the leak AUC max(AUC, 1 − AUC) of each epoch's scores against the
    true labels (0.5: no leak), and ``auc`` its maximum over epochs (the defender's worst case:
    the norms separate the classes most before the model fits, and the order can flip later);
    ``performance`` = ``auc`` (AP* = 0.5).
    """

    scoring = ""

    def __init__(self, party: int = 0, seed: int = 0, reference_metric: float | None = None):
        super().__init__(party, seed, reference_metric)
        self.adversary = GradientScorer(self.scoring)
        self.scores: dict[int, list[torch.Tensor]] = {}
        self.truth: dict[int, list[torch.Tensor]] = {}

    def check(self, pl_module, datamodule) -> None:
        super().check(pl_module, datamodule)
        if pl_module.num_classes != 2:
            self.refuse(f"needs a binary task, got {pl_module.num_classes} classes")
        if pl_module.party_answers == "losses":
            self.refuse(
                f"algo={pl_module.name} clients receive loss values, not gradients "
                "(zeroth-order clients): use attack=label_inference"
            )
        if not pl_module.PER_PARTY_MESSAGES:
            self.refuse(
                f"algo={pl_module.name} broadcasts one gradient of the segment-decoded sum, not "
                "per-sample gradients of the party's own rows"
            )

    def observe_batch(self, pl_module, idx, labels) -> None:
        view = party_view(self.recorder, idx, self.party)
        if view is None:
            return
        labels = labels.cpu()
        keep = torch.ones(len(labels), dtype=torch.bool)
        known = None
        if self.scoring == "direction":
            positives = (labels == 1).nonzero()
            if len(positives) == 0:
                return
            known = int(positives[0, 0])
            keep[known] = False
        epoch = int(pl_module.current_epoch)
        self.scores.setdefault(epoch, []).append(self.adversary.score(view, known).cpu()[keep])
        self.truth.setdefault(epoch, []).append(labels[keep])

    def evaluate(self, pl_module, datamodule) -> dict:
        if not self.scores:
            self.refuse(f"party {self.party} received no gradient during training")
        by_epoch = []
        for epoch in sorted(self.scores):
            truth = torch.cat(self.truth[epoch])
            if 0 < int(truth.sum()) < len(truth):
                by_epoch.append(leak_auc(torch.cat(self.scores[epoch]), truth))
        rows = sum(len(t) for parts in self.truth.values() for t in parts)
        auc = max(by_epoch)
        return {
            "auc": auc,
            "auc_by_epoch": by_epoch,
            "scored_rows": rows,
            "performance": auc,
            "num_classes": 2,
        }

    def attack_baseline(self, num_classes: int) -> float:
        return 0.5


class NormScoringAttack(GradientScoringAttack):
    name = "norm_scoring"
    headline = "auc"
    headline_label = "norm-scoring leak AUC (0.5 = no leak)"
    scoring = "norm"
    assumptions = "none beyond the party's own received gradients"


class DirectionScoringAttack(GradientScoringAttack):
    name = "direction_scoring"
    headline = "auc"
    headline_label = "direction-scoring leak AUC (0.5 = no leak)"
    scoring = "direction"
    assumptions = "the label of one positive sample in every batch"


class ModelCompletionAttack(PartyAttack):
    """Passive model completion: party ``party`` fits a softmax head on its own frozen party
    model from ``labels_per_class`` labelled training samples per class; ``acc`` is its top-1
    accuracy on the test split (``performance``; AP* = 1/classes). ``raw_features_acc`` is the
    same head fitted on the party's raw features: what its own data give without the trained
    model (the attack shows a leak where ``acc`` beats it). It reads no message: its knowledge
    is its own trained model (local runtime: the party model lives in this process).
    """

    name = "model_completion"
    headline = "acc"
    headline_label = "model-completion test accuracy"
    assumptions = "labels of labels_per_class training samples per class"

    def __init__(
        self,
        labels_per_class: int = 4,
        party: int = 0,
        seed: int = 0,
        reference_metric: float | None = None,
    ) -> None:
        super().__init__(party, seed, reference_metric)
        if int(labels_per_class) < 1:
            raise ValueError(f"attack.labels_per_class must be >= 1, got {labels_per_class}")
        self.labels_per_class = int(labels_per_class)

    def config(self) -> dict:
        return super().config() | {"labels_per_class": self.labels_per_class}

    def check(self, pl_module, datamodule) -> None:
        super().check(pl_module, datamodule)
        if len(pl_module.parties) == 0:
            self.refuse("the party model lives in a party process (runtime=ray): use runtime=local")
        if "test" not in datamodule.splits or len(datamodule.splits["test"]) == 0:
            self.refuse("needs a test split (data.test_fraction > 0)")

    def observe_batch(self, pl_module, idx, labels) -> None:
        """Nothing to observe: the attack uses the party's own model after training."""

    def evaluate(self, pl_module, datamodule) -> dict:
        party_model = copy.deepcopy(pl_module.parties[self.party]).cpu()
        train, test = datamodule.splits["train"], datamodule.splits["test"]
        rows = labelled_rows(self.true_labels, self.labels_per_class, self.generator())
        head = complete_model(
            frozen_embeddings(party_model, train.xs[self.party][rows].cpu()),
            self.true_labels[rows],
            pl_module.num_classes,
        )
        guesses = predict(head, frozen_embeddings(party_model, test.xs[self.party].cpu()))
        acc = float((guesses == test.y.cpu()).double().mean())
        flat = nn.Flatten()
        raw_head = complete_model(
            flat(train.xs[self.party][rows].cpu()).double(),
            self.true_labels[rows],
            pl_module.num_classes,
        )
        raw_guesses = predict(raw_head, flat(test.xs[self.party].cpu()).double())
        return {
            "acc": acc,
            "raw_features_acc": float((raw_guesses == test.y.cpu()).double().mean()),
            "labelled_samples": len(rows),
            "performance": acc,
            "num_classes": pl_module.num_classes,
        }

    def attack_baseline(self, num_classes: int) -> float:
        return 1.0 / num_classes
