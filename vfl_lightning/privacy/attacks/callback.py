"""The label-inference attack as a training callback (``attack=label_inference``): after every
training step it attacks the batch from what one client observed, and reports the accuracy."""

from __future__ import annotations

import lightning as L
import torch

from vfl_lightning.privacy.attacks.label_inference import ClientObservation, infer_labels
from vfl_lightning.wire.ledger import DOWNLINK, UPLINK


class LabelInferenceAttack(L.Callback):
    """Fu et al.'s direct label inference by client ``party`` (curious client) and by an
    eavesdropper on its downlink who does not know the client's perturbation.

    The attack assumes Fu et al.'s threat model: the server sums the parties' outputs (no split
    head; ``head=bias`` adds only a per-class bias) and each output has ``num_classes`` entries.
    The client's view is read from the wire (:attr:`Wire.exchanged`): a received ``gradient``,
    or for zeroth-order exchanges the returned ``loss`` values with its own displacements
    c_hat_k - c (its ``perturbed_embedding`` minus its ``embedding`` uplinks). Accuracies are over
    every training sample the party exchanged; logged per epoch as ``attack/label_inference_acc``
    and ``attack/eavesdropper_acc`` and written to results.json.
    """

    def __init__(self, party: int = 0, seed: int = 0) -> None:
        if int(party) < 0:
            raise ValueError(f"attack party must be >= 0, got {party}")
        self.party = int(party)
        self.seed = int(seed)
        self.client_correct = 0
        self.eavesdropper_correct = 0
        self.samples = 0
        self._pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._rounds_before = 0
        self._generator: torch.Generator | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.party >= pl_module.num_parties:
            raise ValueError(
                f"attack party must be in [0, {pl_module.num_parties - 1}], got {self.party}"
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

    def _observation(self, pl_module) -> ClientObservation | None:
        wire = pl_module.wire
        if wire.exchanged_round[self.party] < self._rounds_before:
            return None
        sent: dict[str, list] = {}
        for message in wire.exchanged[self.party]:
            sent.setdefault(f"{message.direction}:{message.kind}", []).append(message.payload)
        if f"{DOWNLINK}:gradient" in sent:
            return ClientObservation("gradient", sent[f"{DOWNLINK}:gradient"][-1])
        if f"{DOWNLINK}:loss" in sent:
            embedding = sent[f"{UPLINK}:embedding"][-1]
            perturbed = torch.stack(sent[f"{UPLINK}:perturbed_embedding"])
            return ClientObservation("loss", sent[f"{DOWNLINK}:loss"][-1], perturbed - embedding)
        return None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._rounds_before = pl_module.wire.ledger.rounds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        observation = self._observation(pl_module)
        if observation is None:
            return
        y = batch[1]
        if self._generator is None or self._generator.device != y.device:
            self._generator = torch.Generator(device=y.device).manual_seed(self.seed + 2_147)
        client = infer_labels(observation)
        eavesdropper = infer_labels(
            observation, knows_perturbation=False, generator=self._generator
        )
        self._pending.append(((client == y).sum(), (eavesdropper == y).sum(), len(y)))

    def _collect(self) -> None:
        for client, eavesdropper, size in self._pending:
            self.client_correct += int(client)
            self.eavesdropper_correct += int(eavesdropper)
            self.samples += size
        self._pending = []

    def accuracies(self) -> dict[str, float | int | None]:
        self._collect()
        if self.samples == 0:
            return {"attack/label_inference_acc": None, "attack/eavesdropper_acc": None}
        return {
            "attack/label_inference_acc": self.client_correct / self.samples,
            "attack/eavesdropper_acc": self.eavesdropper_correct / self.samples,
        }

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        values = {k: v for k, v in self.accuracies().items() if v is not None}
        if values:
            pl_module.log_dict(values, on_step=False, on_epoch=True)

    def results(self) -> dict:
        return {**self.accuracies(), "attack/observed_samples": self.samples}

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
