"""What FedVS (Algorithm 1) asks of its clients beyond :class:`Parties`, and the local
implementation: the clients' polynomial networks in this process and the codec's vectorized
all-client code."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from vfl_lightning.algorithms.local_parties import LocalParties
from vfl_lightning.algorithms.party import update_parties
from vfl_lightning.algorithms.party_rules import ReleaseNoise, release_rows
from vfl_lightning.mechanisms.fedvs import FedVSCodec
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
    def share_data(self, train_xs: Sequence[torch.Tensor] = ()) -> list[int]:
        """Lines 1-10, once: the overflow pre-check (one clear error when a decoded sum could
        wrap), then every client sends every other client one share of its quantized power
        features. ``train_xs``: the training split's columns the server's process holds (every
        client's in the local simulation, none where the clients hold their own). Returns each
        client's size of one share in bits."""

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
    """The clients in this process: their polynomial networks (the protocol's submodules) and
    optimizers, and the public :class:`~vfl_lightning.mechanisms.fedvs.FedVSCodec`, which holds
    every client's shares and runs every client's step of a phase as one vectorized call.
    ``dp``: Wait-DP's noise, which each client adds to what it sends; ``weight_bound``: the
    projection after every update. ``coded`` (FedVS itself): the clients release only coded
    shares of the sum, in training and evaluation (:meth:`eval_average`); their guards refuse
    every plain embedding."""

    def __init__(
        self,
        models,
        mechanism,
        seed: int,
        streams,
        *,
        codec,
        dp=None,
        weight_bound: float,
        batch_parties: bool = True,
        coded: bool = False,
    ) -> None:
        noise = ReleaseNoise(mechanism, dp=dp, coded=coded)
        super().__init__(models, mechanism, seed, streams, batch_parties=batch_parties, noise=noise)
        self.seed = int(seed)
        self.codec, self.dp, self.weight_bound = codec, dp, float(weight_bound)
        self.coded = bool(coded)
        self._eval_codec: FedVSCodec | None = None

    def power_feature_counts(self):
        return [p.num_power_features for p in self.models]

    def share_data(self, train_xs=()):
        device = self.device
        xs = [x.to(device) for x in list(train_xs)[: len(self.models)]]
        self.codec.check(xs, [p.degree for p in self.models])
        generator = seeded_generator(self.seed, "simulation", "fedvs_data", device=device)
        with torch.no_grad():
            features = [p.power_features(x) for p, x in zip(self.models, xs, strict=True)]
        return self.codec.share_data(features, generator=generator)

    def share_models(self, share_delays):
        weights = [p.weight for p in self.models]
        generator = self.streams.get("train", weights[0].device)
        return self.codec.share_models(weights, generator=generator)

    def coded_embeddings(self, positions, upload_delays, modelled):
        responders = list(modelled)
        segment = self.codec.data_shares.shape[1]
        rows = torch.arange(self.codec.K, device=positions.device)[:, None] * segment + positions
        released = release_rows(rows)
        for party in self.members:
            party.guard.coded_release("coded_embedding", "train", released)
        return responders, self.codec.coded_embeddings(positions, clients=responders)

    def update(self, xs, idx, gradient):
        N = len(self.members)
        for party, x, h in zip(self.members, xs, self.embed(xs), strict=False):
            party.keep(x, h)
        update_parties(self.members, [gradient / N] * N, self.optimization)
        self.project_weights()

    def plain_round(self, xs, idx, upload_delays, modelled, deadline_s):
        used = sorted(modelled)
        noise = None if self.dp is None else self.dp.noise_multiplier
        self.admit("plain_embedding", "train", None, idx, noise, [self.members[n] for n in used])()
        outputs = [self.members[n].forward(xs[n]) for n in used]
        if self.dp is not None:
            gen = self.streams.get("train", outputs[0].device)
            outputs = [self.dp(h, gen) for h in outputs]
        for n, h in zip(used, outputs, strict=True):
            self.members[n].keep(xs[n], h)
        return used, [h.detach() for h in outputs]

    def update_plain(self, used, gradient):
        """Each used client's own update
        (:meth:`~vfl_lightning.algorithms.party.Party.apply_gradient`), then the projection."""
        for n in used:
            self.members[n].apply_gradient(gradient / len(used))
        self.project_weights()

    def eval_embeddings(self, xs, idx, stage):
        noisy = self.dp is not None and self.dp.at_eval
        self.admit("send", stage, None, idx, self.dp.noise_multiplier if noisy else None)()
        embeddings = [h.detach() for h in self.embed(xs)]
        if noisy:
            gen = self.streams.get(stage, self.device)
            embeddings = [self.dp(h, gen) for h in embeddings]
        return embeddings

    def eval_average(self, xs, idx, stage):
        """The plain baselines: the mean of :meth:`eval_embeddings`. FedVS: decoded from every
        client's coded embedding of the batch (the batch split into K segments, its data shared
        and the models shared with masks from the stage's stream, the average decoded from the
        first R clients), as the Ray clients evaluate: no plain embedding is released."""
        if not self.coded:
            return super().eval_average(xs, idx, stage)
        released = release_rows(idx)
        for party in self.members:
            party.guard.coded_release("coded_eval_embedding", stage, released)
        device = self.device
        xs = [x.to(device) for x in list(xs)[: len(self.models)]]
        K, count = self.codec.K, int(xs[0].shape[0])
        segment = -(-count // K)
        padded = []
        for x in xs:
            rows = x.new_zeros((K * segment, *x.shape[1:]))
            rows[:count] = x
            padded.append(rows)
        codec = self.evaluation_codec()
        codec.check(padded, [p.degree for p in self.models])
        generator = self.streams.get(stage, device)
        with torch.no_grad():
            features = [p.power_features(x) for p, x in zip(self.models, padded, strict=True)]
        codec.share_data(features, generator=generator)
        codec.share_models([p.weight for p in self.models], generator=generator)
        responders = list(range(codec.threshold))
        positions = torch.arange(segment, device=device)
        coded = codec.coded_embeddings(positions, clients=responders)
        average = codec.decode_average(coded.to(torch.int64), responders)
        return average[:count].to(torch.float32)

    def evaluation_codec(self) -> FedVSCodec:
        """A codec of the training code's public parameters for the evaluation batches (its
        shares are the batch's, never the training data's)."""
        if self._eval_codec is None:
            codec = self.codec
            self._eval_codec = FedVSCodec(
                codec.num_clients,
                codec.K,
                codec.T,
                l_x=codec.l_x,
                l_w=codec.l_w,
                prime=codec.prime,
                weight_bound=codec.weight_bound,
            )
        return self._eval_codec

    def clean_embeddings(self, xs):
        """The simulation holds every client's model: the clean embeddings are at hand."""
        return self.embed(xs)

    def project_weights(self) -> None:
        """|w| <= ``weight_bound`` for every client model (Assumption 4), as one foreach clamp
        (the values of each party's own :meth:`~vfl_lightning.algorithms.party.Party.project_weights`)."""
        bound = self.weight_bound
        weights = [party.model.weight for party in self.members]
        if not weights:  # no client model held here
            return
        with torch.no_grad():
            torch._foreach_clamp_min_(weights, -bound)
            torch._foreach_clamp_max_(weights, bound)
