"""Defenses as training callbacks (``defense=<name>``), deployed by the role that would deploy
them: the server filters the gradients it sends over the wire, the label holder perturbs the
training labels. Each refuses, in one line, a protocol it cannot be applied to."""

from __future__ import annotations

from abc import ABC, abstractmethod

import lightning as L
import torch

from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.defenses.gradient import (
    NOISE_DISTRIBUTIONS,
    add_gradient_noise,
    dcor_gradient,
    sparsify,
)
from vfl_lightning.privacy.defenses.label_dp import randomized_response
from vfl_lightning.seeding import derive_seed
from vfl_lightning.wire import UPLINK
from vfl_lightning.wire.codecs import TopKCodec


def defense_generator(seed: int, name: str) -> torch.Generator:
    """The defense's own randomness (never the global RNG, never the protocol's streams)."""
    return torch.Generator().manual_seed(
        derive_seed(seed, "server", "defense", index=sum(map(ord, name)))
    )


class Defense(L.Callback):
    """Base: ``name``, its parameters for results.json (``defense/name``, ``defense/<param>``)."""

    is_defense = True
    name = ""
    label_epsilon: float | None = None
    """ε of the label-DP release every use of the training labels goes through (None: the
    labels are used as they are); what ``audit=canary_label`` compares its bound with."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def refuse(self, reason: str) -> None:
        raise ConfigError(f"defense={self.name}: {reason}")

    def parameters(self) -> dict:
        return {}

    def results(self) -> dict:
        return {"defense/name": self.name} | {
            f"defense/{key}": value for key, value in self.parameters().items()
        }


class GradientDefense(Defense, ABC):
    """A server-side filter on every ``gradient`` message it sends (``Wire.gradient_filters``)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        if pl_module.party_answers == "losses":
            self.refuse(
                f"algo={pl_module.name} sends its clients loss values, not gradients "
                "(zeroth-order clients): there is no gradient to protect"
            )
        if not pl_module.PER_PARTY_MESSAGES:
            self.refuse(
                f"algo={pl_module.name} broadcasts one gradient that every client applies; "
                "per-party gradient defenses need a protocol that answers each party with the "
                "gradient of its own embedding"
            )
        self.check(pl_module)
        if self.filter not in pl_module.wire.gradient_filters:
            pl_module.wire.gradient_filters.append(self.filter)

    def check(self, pl_module) -> None:
        """Refuse a protocol this filter cannot apply to (default: every gradient protocol)."""

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.wire.gradient_filters.remove(self.filter)

    @abstractmethod
    def filter(self, party: int, gradient: torch.Tensor) -> torch.Tensor:
        """The gradient the server sends party ``party`` instead of ``gradient``."""


class GradientNoise(GradientDefense):
    """Gaussian or Laplace noise of ``scale`` on every gradient the server sends."""

    name = "gradient_noise"

    def __init__(self, scale: float, distribution: str = "gaussian", seed: int = 0) -> None:
        super().__init__(seed)
        if not float(scale) > 0.0:
            raise ValueError(f"defense.scale must be > 0, got {scale}")
        if distribution not in NOISE_DISTRIBUTIONS:
            raise ValueError(
                f"defense.distribution must be one of {NOISE_DISTRIBUTIONS}, got {distribution!r}"
            )
        self.scale = float(scale)
        self.distribution = distribution
        self.generator = defense_generator(self.seed, self.name)

    def parameters(self) -> dict:
        return {"scale": self.scale, "distribution": self.distribution}

    def filter(self, party: int, gradient: torch.Tensor) -> torch.Tensor:
        noisy = add_gradient_noise(
            gradient.cpu(),
            scale=self.scale,
            distribution=self.distribution,
            generator=self.generator,
        )
        return noisy.to(gradient.device)


class GradientSparsification(GradientDefense):
    """Keep the ``keep_fraction`` largest-magnitude entries of every gradient message."""

    name = "gradient_sparsification"

    def __init__(self, keep_fraction: float, seed: int = 0) -> None:
        super().__init__(seed)
        if not 0.0 < float(keep_fraction) <= 1.0:
            raise ValueError(f"defense.keep_fraction must be in (0, 1], got {keep_fraction}")
        self.keep_fraction = float(keep_fraction)
        self._codec = None

    def parameters(self) -> dict:
        return {"keep_fraction": self.keep_fraction}

    def setup(self, trainer, pl_module, stage: str) -> None:
        """The gradients cross in top-k form (packed indices and values), which the ledger
        counts and the parties decode."""
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            codec = TopKCodec(self.keep_fraction)
            if pl_module.wire.downlink_codec != codec:
                self._codec = pl_module.wire.downlink_codec
            pl_module.wire.downlink_codec = codec

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if self._codec is not None:
            pl_module.wire.downlink_codec = self._codec

    def filter(self, party: int, gradient: torch.Tensor) -> torch.Tensor:
        return sparsify(gradient, keep_fraction=self.keep_fraction)


class DistanceCorrelation(GradientDefense):
    """Sun et al.'s dCor defense: the server adds weight · ∂dCor(h_m, y)/∂h_m (h_m: party m's
    message of this round, y: the batch's training labels) to the gradient it sends party m, as
    if its loss had the penalty weight · dCor(h_m, y) for every party."""

    name = "dcor"

    def __init__(self, weight: float, seed: int = 0) -> None:
        super().__init__(seed)
        if not float(weight) > 0.0:
            raise ValueError(f"defense.weight must be > 0, got {weight}")
        self.weight = float(weight)
        self.labels: torch.Tensor | None = None
        self._wire = None
        self._num_classes = 0

    def parameters(self) -> dict:
        return {"weight": self.weight}

    def check(self, pl_module) -> None:
        if pl_module.mechanism.uses_pair_masks:
            self.refuse(
                f"algo={pl_module.name} masks each party's message (secure aggregation): the "
                "server never holds a party's embedding to decorrelate"
            )
        self._wire = pl_module.wire
        self._num_classes = pl_module.num_classes

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.labels = batch[1]

    def filter(self, party: int, gradient: torch.Tensor) -> torch.Tensor:
        message = next(
            (
                m.payload
                for m in reversed(self._wire.exchanged[party])
                if m.direction == UPLINK and m.payload.shape == gradient.shape
            ),
            None,
        )
        if message is None or self.labels is None or len(self.labels) != gradient.shape[0]:
            return gradient
        penalty = dcor_gradient(message, self.labels, self._num_classes, weight=self.weight)
        return gradient + penalty.to(gradient.dtype)


class LabelDP(Defense):
    """Randomized response on the training labels (ε-label-DP), drawn once per sample by the
    label holder before training; validation and test labels stay true."""

    name = "label_dp"

    def __init__(self, epsilon: float, seed: int = 0) -> None:
        super().__init__(seed)
        if not float(epsilon) > 0.0:
            raise ValueError(f"defense.epsilon must be > 0, got {epsilon}")
        self.epsilon = float(epsilon)
        self.label_epsilon = self.epsilon
        self._true_labels: torch.Tensor | None = None
        self.flipped_fraction: float | None = None

    def parameters(self) -> dict:
        return {"epsilon": self.epsilon, "flipped_fraction": self.flipped_fraction}

    def on_fit_start(self, trainer, pl_module) -> None:
        split = trainer.datamodule.splits["train"]
        self._true_labels = split.y
        split.y = randomized_response(
            split.y.cpu(),
            epsilon=self.epsilon,
            num_classes=pl_module.num_classes,
            generator=defense_generator(self.seed, self.name),
        ).to(split.y.device)
        self.flipped_fraction = float((split.y != self._true_labels).double().mean())

    def on_fit_end(self, trainer, pl_module) -> None:
        if self._true_labels is not None:
            trainer.datamodule.splits["train"].y = self._true_labels
