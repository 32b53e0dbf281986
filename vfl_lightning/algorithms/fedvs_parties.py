"""What FedVS (Algorithm 1) asks of its clients beyond :class:`Parties`, and the local
implementation: the module's own polynomial networks and the codec's vectorized all-client code."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from vfl_lightning.algorithms.local_parties import LocalParties
from vfl_lightning.algorithms.party_updates import PartyOptimization, cut_layer_update
from vfl_lightning.seeding import seeded_generator


class FedVSParties(ABC):
    """The FedVS calls (mixed into a :class:`Parties` implementation).

    The delays passed in are the round's draws from the run's delay model (simulated seconds,
    one per client); the local implementation only uses them on the simulated clock, the Ray one
    also sleeps them for real (``runtime.time_scale``). Client n's model stays at
    |w| <= ``weight_bound`` after every update (the weight projection).
    """

    @abstractmethod
    def power_feature_counts(self) -> list[int]:
        """F_n: the number of power features (X^1..X^D, 1) of each client (public sizes)."""

    @abstractmethod
    def share_data(self) -> list[int]:
        """Lines 1-10, once: the overflow pre-check (one clear error when a decoded sum could
        wrap), then every client sends every other client one share of its quantized power
        features. Returns each client's size of one share in bits."""

    @abstractmethod
    def share_models(self, share_delays: np.ndarray) -> list[int]:
        """Lines 13-20: every client quantizes its model (stochastic rounding, eq. 3) and sends
        every other client one masked share. Returns each client's size of one share in bits."""

    @abstractmethod
    def coded_embeddings(
        self, positions: torch.Tensor, upload_delays: np.ndarray, modelled: Sequence[int]
    ) -> tuple[list[int], torch.Tensor]:
        """Lines 21-27: (responders, their (R, |B|, h) coded embeddings, eq. 5, as int64 field
        elements in the order of ``responders``): the first R = 2(K+T-1)+1 to reach the server.
        ``modelled``: the first R on the simulated clock (what the local runtime uses)."""

    @abstractmethod
    def update(self, xs: Sequence[torch.Tensor], idx: torch.Tensor, gradient: torch.Tensor) -> None:
        """Lines 32-35: every client back-propagates (1/N) dL/dH (``gradient``, the broadcast
        dL/dH of the batch's K|B| rows) through its plaintext embedding of its rows ``idx``,
        steps, and projects its weights."""

    @abstractmethod
    def plain_round(
        self,
        xs: Sequence[torch.Tensor],
        idx: torch.Tensor,
        upload_delays: np.ndarray,
        modelled: Sequence[int],
        deadline_s: float | None,
    ) -> tuple[list[int], list[torch.Tensor]]:
        """Wait / Ignore / Wait-DP: (clients used, their plain embeddings of the batch, with
        Wait-DP's noise for Wait-DP) in client order; every client when ``deadline_s`` is None,
        else those that arrived by that simulated time (at least the first). ``modelled``: the
        clients the simulated clock says arrived."""

    @abstractmethod
    def update_plain(self, used: Sequence[int], gradient: torch.Tensor) -> None:
        """Wait / Ignore: each used client back-propagates dL/dH / |used| through the embedding
        it sent in :meth:`plain_round`, steps, and projects its weights."""

    @abstractmethod
    def eval_embeddings(
        self, xs: Sequence[torch.Tensor], idx: torch.Tensor | None, stage: str
    ) -> list[torch.Tensor]:
        """Every client's embedding of an evaluation batch as the server receives it: plain, or
        with Wait-DP's noise when ``algo.dp.at_eval`` (drawn from the ``stage`` stream)."""

    def eval_average(
        self, xs: Sequence[torch.Tensor], idx: torch.Tensor | None, stage: str
    ) -> torch.Tensor:
        """The average embedding the server evaluates an evaluation batch on: by default the mean
        of :meth:`eval_embeddings` (the Ray transport decodes FedVS's from coded embeddings)."""
        return torch.stack(self.eval_embeddings(xs, idx, stage)).mean(0)

    @abstractmethod
    def clean_embeddings(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The noise-free embeddings behind a noisy Wait-DP evaluation (the ``acc_clean``
        diagnostic), or None where no client would send them."""


class LocalFedVSParties(LocalParties, FedVSParties):
    """The clients in this process: the module's party models and Lightning optimizers, and the
    module's :class:`~vfl_lightning.mechanisms.fedvs.FedVSCodec`, which holds every client's
    shares and runs every client's step of a phase as one vectorized call."""

    def __init__(self, module) -> None:
        super().__init__(module)
        self._plain_outputs: list[torch.Tensor] = []

    def power_feature_counts(self):
        return [p.num_power_features for p in self.module.parties]

    def share_data(self):
        module = self.module
        train_xs = [x.to(module.device) for x in module.trainer.datamodule.splits["train"].xs]
        module.codec.check(train_xs, [p.degree for p in module.parties])
        generator = seeded_generator(module.seed, "simulation", "fedvs_data", device=module.device)
        with torch.no_grad():
            features = [p.power_features(x) for p, x in zip(module.parties, train_xs, strict=True)]
        return module.codec.share_data(features, generator=generator)

    def share_models(self, share_delays):
        module = self.module
        return module.codec.share_models(
            [p.weight for p in module.parties], generator=module.generator("train")
        )

    def coded_embeddings(self, positions, upload_delays, modelled):
        responders = list(modelled)
        return responders, self.module.codec.coded_embeddings(positions, clients=responders)

    def update(self, xs, idx, gradient):
        module = self.module
        party_opts, _ = module.split_optimizers()
        N = module.num_parties
        embeddings = module.embed(xs)
        cut_layer_update(
            module.party_optimization(party_opts),
            embeddings,
            [gradient / N] * N,
            models=module.parties,
        )
        self.project_weights()

    def plain_round(self, xs, idx, upload_delays, modelled, deadline_s):
        module = self.module
        used = sorted(modelled)
        outputs = [module.parties[n](xs[n]) for n in used]
        if module.dp is not None:
            gen = module.generator("train")
            outputs = [module.dp(h, gen) for h in outputs]
        self._plain_outputs = outputs
        return used, [h.detach() for h in outputs]

    def update_plain(self, used, gradient):
        module = self.module
        party_opts, _ = module.split_optimizers()
        for n, h in zip(used, self._plain_outputs, strict=True):
            optimization = PartyOptimization(
                zero=party_opts[n].zero_grad,
                backward=lambda hs, gs: module.manual_backward(hs[0], gradient=gs[0]),
                step=lambda opt=party_opts[n]: module.step_party(opt),
            )
            cut_layer_update(optimization, [h], [gradient / len(used)], models=[module.parties[n]])
        self._plain_outputs = []
        self.project_weights()

    def eval_embeddings(self, xs, idx, stage):
        module = self.module
        embeddings = self.send(xs, idx, stage=stage, round=None)
        if module.dp is not None and module.dp.at_eval:
            gen = module.generator(stage)
            embeddings = [module.dp(h, gen) for h in embeddings]
        return embeddings

    def clean_embeddings(self, xs):
        """The simulation holds every client's model: the clean embeddings are at hand."""
        return self.module.embed(xs)

    def project_weights(self) -> None:
        """|w| <= ``weight_bound`` for every client model (Assumption 4)."""
        bound = self.module.weight_bound
        with torch.no_grad():
            for party in self.module.parties:
                party.weight.clamp_(-bound, bound)
