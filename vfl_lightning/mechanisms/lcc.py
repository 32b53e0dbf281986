"""Lagrange coded computing for FedVS: data and model shares, coded embeddings, decoding.

Plain torch over F_p (see field.py). Implements FedVS eqs. 2, 4, 5, 6 and the overflow pre-check
that guarantees the decoded, dequantized sums never wrap around p (§4.2, eq. 7).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import torch

from vfl_lightning.errors import RunFailure
from vfl_lightning.mechanisms.field import (
    check_prime,
    dequantize,
    field_matmul,
    field_sum,
    lagrange_coefficients,
    products_fit,
    random_field,
)


class DecodingError(RunFailure):
    """Too few coded embeddings reached the server to interpolate psi(x) (FedVS Theorem 5.1)."""


def recovery_threshold(K: int, T: int) -> int:
    """R = 2(K+T-1)+1 coded embeddings decode the sum (FedVS Theorem 5.1), for every PN degree D.

    psi(x) = sum_n sum_i F_n^i(x) G_n^i(x) (eq. 6). Each F_n^i encodes the *plaintext* power X_n^i
    (Algorithm 1 line 3 raises the data before sharing) with K data and T mask points, so it has
    degree K+T-1 whatever i is; likewise every G_n^i. Hence deg psi = 2(K+T-1) and R = deg + 1
    independently of D. (Raising *shares* to the i-th power instead would give degree
    (i+1)(K+T-1) and R = (D+1)(K+T-1)+1; FedVS does not do that.)
    """
    return 2 * (K + T - 1) + 1


def check_code_parameters(num_clients: int, K: int, T: int, prime: int) -> None:
    """Validate N, K, T, p: one clear error naming the bad value and the allowed range."""
    for label, value, low in (("num_clients (N)", num_clients, 1), ("K", K, 1), ("T", T, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    check_prime(prime)
    needed = recovery_threshold(K, T)
    if num_clients < needed:
        largest_k = (num_clients - 1) // 2 - T + 1
        largest_t = (num_clients - 1) // 2 - K + 1
        if largest_k >= 1:
            advice = f"lower K to at most {largest_k}"
        elif largest_t >= 1:
            advice = f"algo.T must be at most {largest_t} with N={num_clients} and algo.K={K}"
        else:
            advice = f"use at least {recovery_threshold(K, 1)} clients for K={K}, T=1"
        raise ValueError(
            f"FedVS needs N >= 2(K+T-1)+1 = {needed} clients for K={K}, T={T}, got N={num_clients}; "
            f"{advice}"
        )
    if prime <= K + T + num_clients:
        raise ValueError(
            f"prime must exceed K+T+N = {K + T + num_clients} to hold distinct evaluation points, "
            f"got {prime}"
        )


@dataclass(frozen=True)
class QuantizationBudget:
    """Worst-case magnitude of one decoded embedding sum, against the room p leaves (eq. 7)."""

    bound: int
    limit: int
    # the bound per unit of quantized weight (bound = weight_scale * ceil(2^l_w * weight_bound))
    weight_scale: int = 0

    @property
    def fits(self) -> bool:
        return self.bound <= self.limit

    def largest_weight_bound(self, l_w: int) -> Fraction | None:
        """The largest weight bound that fits at these bits, rounded down to 3 significant
        digits (a value written with them fits too); None when no positive bound fits."""
        steps = self.limit // self.weight_scale if self.weight_scale else 0
        if steps < 1:
            return None
        exact = Fraction(steps, 2**l_w)
        shift = 2 - math.floor(math.log10(exact))
        unit = Fraction(10) ** shift
        return Fraction(math.floor(exact * unit)) / unit


def decoded_sum_bound(
    *,
    feature_counts: Sequence[int],
    degrees: Sequence[int],
    data_bounds: Sequence[float],
    weight_bound: float,
    l_x: int,
    l_w: int,
    prime: int,
) -> QuantizationBudget:
    """Largest |sum_n sum_i Xbar_n^i Wbar_n^i| any entry of the decoded sum can reach.

    Client n has ``feature_counts[n]`` raw features with |x| <= ``data_bounds[n]``, a PN of degree
    ``degrees[n]`` and a bias row (a constant-1 feature), weights |w| <= ``weight_bound``. Its
    quantized power-i features are at most Round(2^l_x * bound^i), its quantized weights at most
    ceil(2^l_w * weight_bound) (stochastic rounding rounds up at worst). Decoding returns the exact
    integer sum only while it stays in [-(p+1)/2, (p-1)/2), i.e. |sum| <= (p-3)/2.
    """
    weight_q = math.ceil(2**l_w * weight_bound)
    scale = 0
    for count, degree, data_bound in zip(feature_counts, degrees, data_bounds, strict=True):
        row = sum(math.floor(2**l_x * data_bound**i + 0.5) for i in range(1, degree + 1))
        scale += count * row + 2**l_x
    return QuantizationBudget(bound=scale * weight_q, limit=(prime - 3) // 2, weight_scale=scale)


def check_no_wraparound(
    *,
    feature_counts: Sequence[int],
    degrees: Sequence[int],
    data_bounds: Sequence[float],
    weight_bound: float,
    l_x: int,
    l_w: int,
    prime: int,
) -> QuantizationBudget:
    """The overflow pre-check of FedVS §4.2: raise one clear error if a decoded sum could wrap."""
    for label, bits in (("l_x", l_x), ("l_w", l_w)):
        if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 40:
            raise ValueError(f"algo.{label} must be an integer in [0, 40], got {bits!r}")
    if not weight_bound > 0:
        raise ValueError(f"algo.weight_bound must be > 0, got {weight_bound}")
    budget = decoded_sum_bound(
        feature_counts=feature_counts,
        degrees=degrees,
        data_bounds=data_bounds,
        weight_bound=weight_bound,
        l_x=l_x,
        l_w=l_w,
        prime=prime,
    )
    if not budget.fits:
        excess = math.ceil(math.log2(budget.bound / budget.limit))
        name, bits = ("l_w", l_w) if l_w >= l_x else ("l_x", l_x)
        largest = budget.largest_weight_bound(l_w)
        bound_advice = (
            f"no algo.weight_bound > 0 fits at l_w={l_w}"
            if largest is None
            else f"lower algo.weight_bound from {weight_bound:g} to at most {float(largest):g}"
        )
        raise ValueError(
            f"FedVS decoded sums can reach {budget.bound} but must stay <= (p-3)/2 = {budget.limit} "
            f"for p={prime} (no wrap-around): lower algo.{name} from {bits} to {bits - excess} "
            f"(or lower l_x + l_w = {l_x + l_w} by {excess} bits; or {bound_advice}; or lower the "
            f"PN degree {max(degrees)})"
        )
    return budget


@lru_cache(maxsize=4096)
def _decoding_matrix_cached(
    responders: tuple[int, ...], K: int, T: int, prime: int
) -> torch.Tensor:
    alphas = torch.tensor([K + T + 1 + n for n in responders], dtype=torch.long)
    betas = torch.arange(1, K + 1, dtype=torch.long)
    return lagrange_coefficients(alphas, betas, prime)


class LagrangeCode:
    """LCC with partition parameter K and privacy parameter T among N clients (FedVS §4).

    Public points: beta_k = k for k = 1..K+T and alpha_n = K+T+1+n for client n = 0..N-1 (distinct,
    disjoint). ``encoder`` is the N x (K+T) matrix of Lagrange basis values a[n, k] at the alphas.
    Field tensors are int64 in [0, p); every method is vectorized over samples and features.
    """

    def __init__(self, num_clients: int, K: int, T: int = 1, prime: int = 2**31 - 1) -> None:
        check_code_parameters(num_clients, K, T, prime)
        self.num_clients, self.K, self.T, self.prime = num_clients, K, T, prime
        self.threshold = recovery_threshold(K, T)
        self.betas = torch.arange(1, K + T + 1, dtype=torch.long)
        self.alphas = torch.arange(K + T + 1, K + T + 1 + num_clients, dtype=torch.long)
        self.encoder = lagrange_coefficients(self.betas, self.alphas, prime)
        # G_n(alpha) puts the same model at beta_1..beta_K: its data part is W * sum_k a[n, k].
        self.model_weights = field_sum(self.encoder[:, :K], 1, prime)

    def encode_data(
        self, segments: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Shares F_n(alpha_1..alpha_N) of one client's data (eq. 2; Algorithm 1 lines 5-7).

        ``segments``: (K, S, F) quantized data split horizontally into K segments of S samples.
        Returns (N, S, F): share n' = sum_k a[n', k] Xbar_k + sum_t a[n', K+t] Z_t, with T fresh
        uniform masks Z_t from ``generator``.
        """
        if segments.shape[0] != self.K:
            raise ValueError(f"encode_data needs K={self.K} segments, got {segments.shape[0]}")
        masks = random_field(
            (self.T, *segments.shape[1:]), self.prime, generator, device=segments.device
        )
        stacked = torch.cat([segments, masks]).reshape(self.K + self.T, segments[0].numel())
        shares = field_matmul(self.encoder.to(segments.device), stacked, self.prime)
        return shares.reshape(self.num_clients, *segments.shape[1:])

    def encode_model(
        self,
        weights: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        masks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Shares G_n(alpha_1..alpha_N) of one client's quantized model (eq. 4; lines 15-17).

        ``weights``: quantized model (any shape). Returns (N, *shape): share n' = Wbar sum_{k<=K}
        a[n', k] + sum_t a[n', K+t] V_t with T fresh uniform masks V_t (drawn from ``generator``,
        or ``masks``, (T, numel) field elements, when given).
        """
        device = weights.device
        if masks is None:
            masks = random_field((self.T, weights.numel()), self.prime, generator, device=device)
        coefficients = self.encoder.to(device)
        # One fused pass per term, reduced in place: (N, numel) is the largest tensor of a round.
        # Terms are summed unreduced when their sum fits in int64 (the same residue at the end).
        unreduced = products_fit(self.T + 1, self.prime)
        shares = self.model_weights.to(device)[:, None] * weights.reshape(1, -1)
        if not unreduced:
            shares.remainder_(self.prime)
        for t in range(self.T):
            term = coefficients[:, self.K + t, None] * masks[t]
            shares += term if unreduced else term.remainder_(self.prime)
        shares.remainder_(self.prime)
        return shares.reshape(self.num_clients, *weights.shape)

    def coded_embeddings(
        self, data_shares: torch.Tensor, model_shares: torch.Tensor
    ) -> torch.Tensor:
        """Coded embedding of every client at once (eq. 5).

        ``data_shares``: (N, B, F) where client n' holds, concatenated along features, the shares
        of all clients' power features for its batch rows; ``model_shares``: (N, F, h) the
        matching concatenated model shares. Returns (N, B, h): H~_{n'} = sum_n X~_{n,n'} W~_{n,n'}.
        """
        return field_matmul(data_shares, model_shares, self.prime)

    def decoding_matrix(self, responders: Sequence[int]) -> torch.Tensor:
        """K x R Lagrange matrix from the responders' alphas to beta_1..beta_K (line 28-29)."""
        responders = tuple(int(n) for n in responders)
        if len(set(responders)) != len(responders):
            raise ValueError(f"responders must be distinct clients, got {list(responders)}")
        bad = [n for n in responders if not 0 <= n < self.num_clients]
        if bad:
            raise ValueError(f"responders must be in [0, {self.num_clients - 1}], got {bad}")
        if len(responders) < self.threshold:
            raise DecodingError(
                f"FedVS cannot decode: it needs R = 2(K+T-1)+1 = {self.threshold} coded embeddings "
                f"(K={self.K}, T={self.T}), got {len(responders)} from clients {list(responders)}"
            )
        return _decoding_matrix_cached(responders[: self.threshold], self.K, self.T, self.prime)

    def decode(self, coded: torch.Tensor, responders: Sequence[int]) -> torch.Tensor:
        """Interpolate psi from the first R responders and evaluate at beta_1..beta_K (eq. 6).

        ``coded``: (len(responders), B, h) coded embeddings in the order of ``responders``.
        Returns (K, B, h): segment k's sum over all N clients of Xbar_{n,k}^i Wbar_n^i, exact.
        """
        matrix = self.decoding_matrix(responders).to(coded.device)
        used = coded[: self.threshold]
        decoded = field_matmul(matrix, used.reshape(self.threshold, -1), self.prime)
        return decoded.reshape(self.K, *coded.shape[1:])

    def dequantize_average(self, decoded: torch.Tensor, l_x: int, l_w: int) -> torch.Tensor:
        """Eq. 7: the average embedding over all N clients, 2^-(l_x+l_w)/N * phi^-1(sum)."""
        return dequantize(decoded, l_x + l_w, self.prime, scale=1.0 / self.num_clients)
