"""FedVS codec: the clients' side of Algorithm 1 (data and model shares, coded embeddings) and the
server's decoding to the average embedding over all N clients. Plain torch over F_p.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vfl_lightning.mechanisms.field import DEFAULT_PRIME, quantize, random_field, to_field
from vfl_lightning.mechanisms.lcc import LagrangeCode, QuantizationBudget, check_no_wraparound

CODE_SETTINGS = ("K", "T", "l_x", "l_w", "prime", "weight_bound")
"""The public code parameters (``algo`` settings) every client builds its codec from."""


def segment_rows(idx: torch.Tensor, segment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, rows) of evaluation samples ``idx`` in K segments of ``segment`` rows: the
    sorted distinct positions i mod S to code, and where sample i sits in the decoded average,
    whose row k * len(positions) + j is sample k * S + positions[j] (segment-major)."""
    positions, where = torch.unique(idx % segment, return_inverse=True)
    return positions, (idx // segment) * len(positions) + where


def data_bound(features: torch.Tensor) -> float:
    """max |x| over a client's raw features (0 for none): its input to the overflow pre-check."""
    return float(features.abs().max()) if features.numel() else 0.0


class FedVSCodec:
    """Holds the public LCC points, the clients' data shares and the current model shares.

    Client n' keeps ``data_shares[n']`` (S x F_total): its shares of every client's quantized power
    features for the S = M // K positions, concatenated along features in client order. Each round
    :meth:`share_models` produces ``model_shares[n']`` (F_total x h) the same way; client n''s coded
    embedding (eq. 5) is then one product of the two restricted to the batch positions.
    """

    def __init__(
        self,
        num_clients: int,
        K: int,
        T: int = 1,
        *,
        l_x: int = 8,
        l_w: int = 8,
        prime: int = DEFAULT_PRIME,
        weight_bound: float = 4.0,
    ) -> None:
        if isinstance(T, bool) or not isinstance(T, int) or T < 1:
            raise ValueError(
                f"algo.T must be an integer >= 1, got {T!r}: with T = 0 the data shares carry no "
                "mask, so (at K = 1) every client receives the others' quantized data in the clear"
            )
        self.code = LagrangeCode(num_clients, K, T, prime)
        self.num_clients, self.K, self.T, self.prime = num_clients, K, T, prime
        self.l_x, self.l_w, self.weight_bound = l_x, l_w, float(weight_bound)
        self.element_bits = math.ceil(math.log2(prime))
        self.data_shares: torch.Tensor | None = None
        self.model_shares: torch.Tensor | None = None
        self.budget: QuantizationBudget | None = None

    @property
    def threshold(self) -> int:
        return self.code.threshold

    def check(self, features: Sequence[torch.Tensor], degrees: Sequence[int]) -> QuantizationBudget:
        """Overflow pre-check from the actual raw features (|x| bounds) and the PN degrees."""
        return self.check_bounds(
            feature_counts=[f[0].numel() for f in features],
            degrees=degrees,
            data_bounds=[data_bound(f) for f in features],
        )

    def check_bounds(
        self,
        *,
        feature_counts: Sequence[int],
        degrees: Sequence[int],
        data_bounds: Sequence[float],
    ) -> QuantizationBudget:
        """The same pre-check from what each client reports: its raw feature count, PN degree and
        max |x| (``runtime=ray``: the server never sees the features)."""
        self.budget = check_no_wraparound(
            feature_counts=list(feature_counts),
            degrees=list(degrees),
            data_bounds=list(data_bounds),
            weight_bound=self.weight_bound,
            l_x=self.l_x,
            l_w=self.l_w,
            prime=self.prime,
        )
        return self.budget

    def share_data(
        self, power_features: Sequence[torch.Tensor], *, generator: torch.Generator | None = None
    ) -> list[int]:
        """Algorithm 1 lines 2-10 for every client; returns each client's data-share size in bits.

        ``power_features[n]``: client n's (M, F_n) power features (X^1..X^D, 1) of the training set
        in sample order. The first K*S rows are split into K segments of S = M // K rows.
        """
        segment = power_features[0].shape[0] // self.K
        shares = [self.client_data_shares(f, generator=generator) for f in power_features]
        self.data_shares = torch.cat(shares, dim=2)
        return [segment * f.shape[1] * self.element_bits for f in power_features]

    @property
    def storage_dtype(self) -> torch.dtype:
        """Field elements below 2^31 are stored (and sent) as int32: the shares are the
        protocol's largest state."""
        return torch.int32 if self.prime < 2**31 else torch.long

    def client_data_shares(
        self, features: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Lines 3-7 for one client: (N, S, F_n) shares of its quantized (M, F_n) power
        features, share n' for client n'."""
        segment = features.shape[0] // self.K
        quantized = quantize(features[: self.K * segment], self.l_x, self.prime)
        share = self.code.encode_data(quantized.reshape(self.K, segment, -1), generator=generator)
        return share.to(self.storage_dtype)

    def client_model_shares(
        self, weight: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Lines 14-17 for one client: (N, F_n, h) shares of its stochastically quantized model
        (``runtime=ray``; :meth:`share_models` does every client in one call)."""
        quantized = quantize(
            weight.detach(), self.l_w, self.prime, stochastic=True, generator=generator
        )
        return self.code.encode_model(quantized, generator=generator).to(self.storage_dtype)

    def stacked_model_shares(
        self, weight: torch.Tensor, *, generator: torch.Generator, offset: int, rows: int
    ) -> torch.Tensor:
        """One client's (N, F_n, h) model shares exactly as :meth:`share_models` makes its rows
        of the all-client stack (``rows`` rows, this client's from ``offset``) from the same
        ``generator`` state: the draws of the whole stack are made and this client's taken.
        A party process reproduces the local simulation with it (``seeds: derived``)."""
        count, width = weight.shape
        scaled = weight.detach().double() * float(2**self.l_w)
        draw = torch.rand((rows, width), generator=generator, dtype=torch.float64)[
            offset : offset + count
        ]
        low = torch.floor(scaled)
        quantized = to_field(low + (draw < scaled - low).to(scaled.dtype), self.prime)
        masks = random_field((self.T, rows * width), self.prime, generator)
        own = masks[:, offset * width : (offset + count) * width]
        return self.code.encode_model(quantized, masks=own).to(self.storage_dtype)

    def skip_model_draws(self, rows: int, width: int, generator: torch.Generator) -> None:
        """Advance ``generator`` past one round of :meth:`share_models` of a (``rows``,
        ``width``) stack, drawing what it draws."""
        torch.rand((rows, width), generator=generator, dtype=torch.float64)
        random_field((self.T, rows * width), self.prime, generator)

    def share_models(
        self, weights: Sequence[torch.Tensor], *, generator: torch.Generator | None = None
    ) -> list[int]:
        """Lines 14-20: quantize (stochastic rounding, eq. 3) and share every client's model.

        Returns each client's model-share size in bits (one share; it sends N-1 of them). The
        clients' (F_n, h) models are stacked and encoded in one call; each gets its own masks.
        """
        stacked = torch.cat([w.detach() for w in weights])
        quantized = quantize(stacked, self.l_w, self.prime, stochastic=True, generator=generator)
        self.model_shares = self.code.encode_model(quantized, generator=generator)
        return [w.numel() * self.element_bits for w in weights]

    def coded_embeddings(
        self, positions: torch.Tensor, clients: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Eq. 5 for ``clients`` (default all N) at once: (len(clients), |B|, h) field elements
        for the batch ``positions``. Clients whose output the server will not use need not run."""
        if self.data_shares is None or self.model_shares is None:
            raise RuntimeError("share_data and share_models must run before coded_embeddings")
        if clients is None:
            return self.code.coded_embeddings(
                self.data_shares[:, positions].long(), self.model_shares
            )
        chosen = torch.as_tensor(list(clients), dtype=torch.long, device=self.data_shares.device)
        rows = self.data_shares[chosen[:, None], positions[None, :]].long()
        return self.code.coded_embeddings(rows, self.model_shares.index_select(0, chosen))

    def decode_average(self, coded: torch.Tensor, responders: Sequence[int]) -> torch.Tensor:
        """Lines 27-30: decode from the responders' coded embeddings (in the order of
        ``responders``) and dequantize (eq. 7) to the (K|B|, h) average embedding, segment-major."""
        decoded = self.code.decode(coded, responders)
        average = self.code.dequantize_average(decoded, self.l_x, self.l_w)
        return average.reshape(-1, average.shape[-1])
