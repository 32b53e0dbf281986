"""Poisson Binomial Mechanism with secure aggregation (PBM-VFL paper, Algorithm 1 inside Algorithm 2).

Parties quantize clipped embeddings to Binomial counts and mask them pairwise; the server unmasks
only the sum and dequantizes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vfl_lightning.mechanisms.base import Mechanism
from vfl_lightning.mechanisms.secure_agg import PairwiseMasking, ring_bits
from vfl_lightning.privacy.parameters import check_pbm_parameters

INVERSE_CDF_MAX_TRIALS = 20


def integer_power(x: torch.Tensor, exponent: int) -> torch.Tensor:
    """x^exponent (exponent >= 1) by binary exponentiation: only exactly rounded elementwise
    multiplications, so each element's result depends on that element alone (``torch.pow`` may
    take another code path for another tensor size)."""
    result, square = None, x
    while True:
        if exponent & 1:
            result = square if result is None else result * square
        exponent >>= 1
        if not exponent:
            return result.clone() if result is x else result
        square = square * square


class PBM(Mechanism):
    """PBM-VFL's embedding release: Algorithm 1 per element plus Protocol-0 secure aggregation.

    Party m clips h_m to [−C, C] (the clipped fraction goes to ``stats["pbm/clip_fraction"]``),
    sets p = 1/2 + (β/C) h and draws q ~ Binomial(b, p) element-wise from the generator passed in,
    then adds its pairwise masks of this ``round`` mod R = 2^⌈log2(M·b+1)⌉ (``bits_per_element`` =
    ⌈log2 R⌉). The server sums the masked integers mod R, which is exactly Σ_m q_m, and returns
    h̃ = (C/(β b)) (Σ q − b M/2), unbiased for Σ_m clip(h_m) with variance C² Σ p(1−p)/(β² b)
    per element (at most C² M/(4 β² b), the paper's Theorem 2.3). Gradients pass straight through.

    ``beta`` must be in (0, 1/4]: the paper's range [0, 1/4] includes 0, but β = 0 releases no
    information and the estimate divides by β, so it is rejected with an explanation.
    ``apply_at_eval`` (default true): validation and test also see the noisy sum, as a deployed
    model would; false evaluates on the exact sum. ``seed``: every pair's mask seed derived from
    it (the local runtime's simulation); None, or :meth:`set_pair_seeds` with a party's own
    authenticated seeds (a Ray party actor), holds no derived seed.
    """

    noisy = True
    uses_pair_masks = True

    def __init__(
        self,
        num_parties: int,
        b: int,
        beta: float,
        C: float = 1.0,
        apply_at_eval: bool = True,
        seed: int | None = 0,
    ) -> None:
        super().__init__(num_parties, fusion="sum", apply_at_eval=apply_at_eval)
        self.b, self.beta, self.C = check_pbm_parameters(b, beta, C)
        self.seed = None if seed is None else int(seed)
        self.bits_per_element = ring_bits(self.num_parties, self.b)
        self.masking = PairwiseMasking(self.num_parties, self.bits_per_element, self.seed)
        self._ratios: torch.Tensor | None = None

    @property
    def noise_multiplier(self) -> float:
        """The smallest standard deviation of one party's dequantized counts (C/(βb))(q − b/2)
        over C: √(p(1 − p)/b)/β at the clipped extremes p = 1/2 ± β, √(1/4 − β²)/(β√b)."""
        return math.sqrt(0.25 - self.beta**2) / (self.beta * math.sqrt(self.b))

    @property
    def modulus(self) -> int:
        return self.masking.modulus

    def quantize(
        self,
        embedding: torch.Tensor,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
    ) -> torch.Tensor:
        """Algorithm 1 on clipped values: q ~ Binomial(b, 1/2 + (β/C) h) element-wise, int64.

        For b ≤ ``INVERSE_CDF_MAX_TRIALS``: inverse-CDF sampling, one float64 uniform per element
        and the Binomial CDF built by the pmf recurrence (exact up to float64 rounding): a few
        whole-tensor operations over a (*shape, b) table (a running product for the pmf, a running
        sum for the CDF, a binary search for the count), not b passes of elementwise operations. Above it, ``torch.binomial``
        (its rejection sampler wins for large b). Both draw only from ``generator``; a sequence
        of generators gives row m of ``embedding`` (party m's) its own. Every step of the CDF is
        an exactly rounded elementwise operation or a running product/sum along the new axis, per
        element ((1 − p)^b by binary exponentiation, not ``pow``), so a party's counts do not
        depend on how many parties are stacked with it.
        """
        probability = 0.5 + (self.beta / self.C) * embedding.to(torch.float64)
        device = probability.device
        if self.b > INVERSE_CDF_MAX_TRIALS:
            counts = torch.full_like(probability, float(self.b))
            if generator is None or isinstance(generator, torch.Generator):
                return torch.binomial(counts, probability, generator=generator).to(torch.int64)
            draws = [
                torch.binomial(c, p, generator=g)
                for c, p, g in zip(counts, probability, generator, strict=True)
            ]
            return torch.stack(draws).to(torch.int64)
        uniform = self.uniforms(probability, generator)
        complement = 1.0 - probability
        # column k of the table: pmf_k / pmf_{k−1} = (p / (1 − p)) · (b − k + 1) / k, and column 0
        # pmf_0 = (1 − p)^b by binary exponentiation (exactly rounded multiplications); a running
        # product along the last axis gives pmf_k, a running sum cdf_k = Σ_{j≤k} pmf_j
        table = (probability / complement).unsqueeze(-1) * self._pmf_ratios(device)
        table[..., 0] = integer_power(complement, self.b)
        cdf = table.cumprod_(-1).cumsum_(-1)
        # the count is the number of k in [0, b) with cdf_k <= u (inverse-CDF sampling); cdf is
        # non-decreasing, so a binary search finds it
        return torch.searchsorted(cdf, uniform.unsqueeze(-1), right=True).squeeze(-1)

    def _pmf_ratios(self, device: torch.device) -> torch.Tensor:
        """(1, b/1, (b−1)/2, ..., 2/(b−1)) as float64 on ``device``: the Binomial pmf ratios."""
        if self._ratios is None or self._ratios.device != device:
            ratios = [1.0] + [(self.b - k + 1) / k for k in range(1, self.b)]
            self._ratios = torch.tensor(ratios, dtype=torch.float64, device=device)
        return self._ratios

    @staticmethod
    def uniforms(
        probability: torch.Tensor, generator: torch.Generator | Sequence[torch.Generator] | None
    ) -> torch.Tensor:
        """float64 uniforms of ``probability``'s shape, row m from the m-th generator if several."""
        device = probability.device
        if generator is None or isinstance(generator, torch.Generator):
            return torch.rand(
                probability.shape, generator=generator, dtype=torch.float64, device=device
            )
        shape = probability.shape[1:]
        return torch.stack(
            [torch.rand(shape, generator=g, dtype=torch.float64, device=device) for g in generator]
        )

    def dequantize(self, count_sum: torch.Tensor) -> torch.Tensor:
        """The server's estimate (C/(β b)) (Σq − b M/2) of the embedding sum, float32."""
        centered = count_sum.to(torch.float64) - self.b * self.num_parties / 2.0
        return (centered * (self.C / (self.beta * self.b))).to(torch.float32)

    def encode(
        self,
        embeddings: Sequence[torch.Tensor],
        *,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        round: int = 0,
    ) -> list[torch.Tensor]:
        if len(embeddings) != self.num_parties:
            raise ValueError(
                f"PBM was built for {self.num_parties} parties, got {len(embeddings)} embeddings"
            )
        stacked = torch.stack([h.detach() for h in embeddings])
        self.stats["pbm/clip_fraction"] = (stacked.abs() > self.C).float().mean()
        # every party draws its own counts; one vectorized call over the stacked parties
        counts = self.quantize(stacked.clamp(-self.C, self.C), generator)
        return list(self.masking.mask_stacked(counts, round).unbind(0))

    def encode_party(self, party, embedding, *, generator=None, round=0) -> torch.Tensor:
        clipped = embedding.detach().clamp(-self.C, self.C)
        counts = self.quantize(clipped[None], [generator])[0]
        return self.masking.mask_party(party, counts, round)

    def set_pair_seeds(self, pair_seeds: dict[tuple[int, int], int]) -> None:
        self.masking = PairwiseMasking(
            self.num_parties, self.bits_per_element, pair_seeds=pair_seeds
        )

    def fuse(self, messages: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.dequantize(self.masking.secure_sum(list(messages)))

    accounting = "pbm"

    @property
    def clip_bound(self) -> float:
        return self.C

    def parameters_state(self) -> dict:
        return {"b": self.b, "beta": self.beta, "C": self.C, "num_parties": self.num_parties}

    def state_dict(self) -> dict:
        return self.parameters_state() | super().state_dict()

    def load_state_dict(self, state: dict) -> None:
        mine = self.parameters_state()
        theirs = {key: state.get(key) for key in mine}
        if theirs != mine:
            raise ValueError(f"checkpoint was written by PBM {theirs}, this run uses PBM {mine}")
        super().load_state_dict(state)
