"""The label-inference attack as a training callback (``attack=label_inference``): after every
training step it attacks the batch from what one client observed, and reports the accuracy."""

from __future__ import annotations

import torch

from vfl_lightning.privacy.attacks.harness import WireAttack
from vfl_lightning.privacy.attacks.label_inference import ClientObservation, infer_labels
from vfl_lightning.seeding import derive_seed
from vfl_lightning.wire.ledger import DOWNLINK, UPLINK


class LabelInferenceAttack(WireAttack):
    """Fu et al.'s direct label inference by client ``party`` (curious client) and by an
    eavesdropper on its downlink who does not know the client's perturbation.

    The attack assumes Fu et al.'s threat model: the server sums the parties' outputs (no split
    head; ``head=bias`` adds only a per-class bias) and each output has ``num_classes`` entries.
    The client's view is what the wire carried for it in the batch: a received ``gradient``, or
    for zeroth-order exchanges the returned ``loss`` values with its own displacements
    c_hat_k - c (its ``perturbed_embedding`` minus its ``embedding`` uplinks). Accuracies are over
    every training sample the party exchanged, against the true labels; logged per epoch as
    ``attack/label_inference/acc`` and ``attack/label_inference/eavesdropper_acc`` and written to
    results.json (``performance`` = ``acc``, AP* = 1/classes).
    """

    name = "label_inference"
    role = "party"
    headline = "acc"
    headline_label = "label-inference accuracy"
    assumptions = "a sum-fusion server whose party outputs have one entry per class"

    def __init__(self, party: int = 0, seed: int = 0, reference_metric: float | None = None):
        super().__init__(seed, reference_metric)
        if int(party) < 0:
            raise ValueError(f"attack.party must be >= 0, got {party}")
        self.party = int(party)
        self.client_correct = 0
        self.eavesdropper_correct = 0
        self.samples = 0
        self.num_classes = 0
        self._pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._eavesdropper_generator: torch.Generator | None = None

    def config(self) -> dict:
        return super().config() | {"party": self.party}

    def check(self, pl_module, datamodule) -> None:
        if self.party >= pl_module.num_parties:
            raise ValueError(
                f"attack.party must be in [0, {pl_module.num_parties - 1}], got {self.party}"
            )
        width = pl_module.widths[self.party]
        if width != pl_module.num_classes:
            raise ValueError(
                f"label_inference (Fu et al. direct attack) needs party outputs with num_classes="
                f"{pl_module.num_classes} entries, got embedding_dim={width}: set "
                f"party.embedding_dim={pl_module.num_classes}"
            )
        if pl_module.mechanism.fusion not in ("sum", "mean"):
            raise ValueError(
                "label_inference (Fu et al. direct attack) needs a sum-fusion server, got "
                f"mechanism.fusion={pl_module.mechanism.fusion!r}"
            )
        self.num_classes = pl_module.num_classes

    def _observation(self) -> ClientObservation | None:
        sent: dict[str, list] = {}
        for message in self.recorder.messages.get(self.party, []):
            sent.setdefault(f"{message.direction}:{message.kind}", []).append(message.payload)
        if f"{DOWNLINK}:gradient" in sent:
            return ClientObservation("gradient", sent[f"{DOWNLINK}:gradient"][-1])
        if f"{DOWNLINK}:loss" in sent:
            embedding = sent[f"{UPLINK}:embedding"][-1]
            perturbed = torch.stack(sent[f"{UPLINK}:perturbed_embedding"])
            return ClientObservation("loss", sent[f"{DOWNLINK}:loss"][-1], perturbed - embedding)
        return None

    def observe_batch(self, pl_module, idx, labels) -> None:
        observation = self._observation()
        if observation is None:
            return
        generator = self._eavesdropper_generator
        if generator is None or generator.device != labels.device:
            generator = torch.Generator(device=labels.device).manual_seed(
                derive_seed(self.seed, "adversary", "eavesdropper")
            )
            self._eavesdropper_generator = generator
        client = infer_labels(observation)
        eavesdropper = infer_labels(observation, knows_perturbation=False, generator=generator)
        self._pending.append(
            ((client == labels).sum(), (eavesdropper == labels).sum(), len(labels))
        )

    def _collect(self) -> None:
        for client, eavesdropper, size in self._pending:
            self.client_correct += int(client)
            self.eavesdropper_correct += int(eavesdropper)
            self.samples += size
        self._pending = []

    def accuracies(self) -> dict[str, float | None]:
        self._collect()
        if self.samples == 0:
            return {"acc": None, "eavesdropper_acc": None}
        return {
            "acc": self.client_correct / self.samples,
            "eavesdropper_acc": self.eavesdropper_correct / self.samples,
        }

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        values = {
            f"attack/{self.name}/{key}": value
            for key, value in self.accuracies().items()
            if value is not None
        }
        if values:
            pl_module.log_dict(values, on_step=False, on_epoch=True)

    def evaluate(self, pl_module, datamodule) -> dict:
        accuracies = self.accuracies()
        return accuracies | {
            "observed_samples": self.samples,
            "performance": accuracies["acc"],
            "num_classes": pl_module.num_classes,
        }

    def attack_baseline(self, num_classes: int) -> float:
        return 1.0 / num_classes

    def state_dict(self) -> dict:
        self._collect()
        return {
            "client_correct": self.client_correct,
            "eavesdropper_correct": self.eavesdropper_correct,
            "samples": self.samples,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.client_correct = int(state_dict["client_correct"])
        self.eavesdropper_correct = int(state_dict["eavesdropper_correct"])
        self.samples = int(state_dict["samples"])
