"""Arithmetic in the prime field F_p on int64 tensors (CPU and CUDA), exact and vectorized.

Quantization onto F_p and back (FedVS §4.2, eqs. 3 and 7), modular inverses, Lagrange
coefficient matrices, and a matrix product that never overflows (float64 limbs, exact).
"""

from __future__ import annotations

import math

import torch

DEFAULT_PRIME = 2**31 - 1
# Two reduced elements multiply exactly in int64 only if (p - 1)^2 < 2^63.
MAX_PRIME = math.isqrt(2**63 - 1)
# Operands of the float64 matrix product are split into 16-bit limbs (Karatsuba): a limb product is
# below 2^34, so a sum of up to 2^19 of them stays below 2^53, where float64 is exact.
_LIMB_BITS = 16
_LIMB_MASK = (1 << _LIMB_BITS) - 1
_MAX_INNER = 1 << 19
# Up to this inner dimension, field_matmul sums elementwise products instead of using limbs.
_ELEMENTWISE_INNER = 2


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (covers every prime this module accepts)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for q in small:
        if n % q == 0:
            return n == q
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def check_prime(prime: int) -> int:
    """Validate the field size: a prime in [3, 3037000499] (so products fit in int64)."""
    if isinstance(prime, bool) or not isinstance(prime, int):
        raise ValueError(f"prime must be an integer, got {prime!r}")
    if not 3 <= prime <= MAX_PRIME:
        raise ValueError(
            f"prime must be in [3, {MAX_PRIME}] so that products of two field elements fit in "
            f"int64, got {prime}"
        )
    if not is_prime(prime):
        raise ValueError(f"prime must be a prime number, got {prime}")
    return prime


def field_mul(a: torch.Tensor, b: torch.Tensor, prime: int) -> torch.Tensor:
    """Elementwise a*b mod p of reduced int64 tensors (broadcasting)."""
    return (a * b).remainder_(prime)


def field_add(a: torch.Tensor, b: torch.Tensor, prime: int) -> torch.Tensor:
    return torch.remainder(a + b, prime)


def field_sum(a: torch.Tensor, dim: int, prime: int) -> torch.Tensor:
    """Sum of reduced elements along ``dim`` mod p, in chunks of 2^31 terms (no overflow)."""
    chunk = 1 << 31
    if a.shape[dim] <= chunk:
        return torch.remainder(a.sum(dim), prime)
    parts = [torch.remainder(piece.sum(dim), prime) for piece in a.split(chunk, dim)]
    return field_sum(torch.stack(parts, dim), dim, prime)


def field_pow(a: torch.Tensor, exponent: int, prime: int) -> torch.Tensor:
    """a^exponent mod p elementwise, by repeated squaring (exponent >= 0)."""
    result = torch.ones_like(a)
    base = torch.remainder(a, prime)
    while exponent:
        if exponent & 1:
            result = field_mul(result, base, prime)
        base = field_mul(base, base, prime)
        exponent >>= 1
    return result


def field_inverse(a: torch.Tensor, prime: int) -> torch.Tensor:
    """Multiplicative inverse mod p (Fermat: a^(p-2)); raises on a zero element."""
    a = torch.remainder(a, prime)
    if bool((a == 0).any()):
        raise ZeroDivisionError("0 has no inverse in F_p")
    return field_pow(a, prime - 2, prime)


def _limb_matmul(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Exact int64 (hi*hi, hi*lo + lo*hi, lo*lo) limb products of a @ b by three float64 matrix
    products (Karatsuba); every partial sum is an integer below 2^53 for inner <= 2^19."""
    a_hi, a_lo = (a >> _LIMB_BITS).double(), (a & _LIMB_MASK).double()
    b_hi, b_lo = (b >> _LIMB_BITS).double(), (b & _LIMB_MASK).double()
    high = torch.matmul(a_hi, b_hi).long()
    low = torch.matmul(a_lo, b_lo).long()
    both = torch.matmul(a_hi + a_lo, b_hi + b_lo).long()
    return high, both - high - low, low


def products_fit(count: int, prime: int) -> bool:
    """Whether a sum of ``count`` products of two reduced elements of F_p stays below 2^63, so it
    can be reduced once at the end (the same residue as reducing every product)."""
    return count * (prime - 1) ** 2 < 2**63


def _small_inner_matmul(a: torch.Tensor, b: torch.Tensor, prime: int) -> torch.Tensor:
    """a @ b mod p as a sum of outer products (cheaper than limbs for a short inner dimension):
    unreduced when their sum fits in int64 (:func:`products_fit`), else each reduced first (the
    sum of k < 2^31 reduced terms fits); reduced once at the end. Exact either way."""
    shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    total = torch.zeros(shape, dtype=torch.long, device=a.device)
    unreduced = products_fit(a.shape[-1], prime)
    for k in range(a.shape[-1]):
        term = a[..., :, k : k + 1] * b[..., k : k + 1, :]
        total += term if unreduced else term.remainder_(prime)
    return total.remainder_(prime)


def field_matmul(a: torch.Tensor, b: torch.Tensor, prime: int) -> torch.Tensor:
    """a @ b over F_p for reduced int64 tensors (torch.matmul broadcasting rules).

    Exact on CPU and CUDA: each operand is split into 16-bit limbs, the limb products are summed
    by float64 matrix products whose every partial sum is an integer below 2^53 (so exact in any
    summation order), then recombined mod p in int64. The inner dimension is chunked at 2^19.
    """
    if a.shape[-1] <= _ELEMENTWISE_INNER:
        return _small_inner_matmul(a, b, prime)
    shift32 = (1 << 32) % prime
    total = None
    for start in range(0, a.shape[-1], _MAX_INNER):
        high, middle, low = _limb_matmul(
            a[..., start : start + _MAX_INNER], b[..., start : start + _MAX_INNER, :]
        )
        part = field_mul(high.remainder_(prime), shift32, prime)
        part += middle.remainder_(prime) * (1 << _LIMB_BITS)
        part = (part + low).remainder_(prime)
        total = part if total is None else (total + part).remainder_(prime)
    if total is None:
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        return torch.zeros(shape, dtype=torch.long, device=a.device)
    return total


def lagrange_coefficients(nodes: torch.Tensor, points: torch.Tensor, prime: int) -> torch.Tensor:
    """Matrix C (len(points) x len(nodes)) with C[j, i] = prod_{l != i} (points_j - nodes_l) /
    (nodes_i - nodes_l) mod p: the Lagrange basis of ``nodes`` evaluated at ``points``.

    A polynomial of degree < len(nodes) with values v at the nodes takes the values C @ v at the
    points. This gives the encoding matrix (nodes beta_1..beta_{K+T}, points alpha_1..alpha_N;
    FedVS eq. 2 and 4) and the decoding matrix (nodes: the responders' alphas, points beta_1..K).
    """
    nodes = torch.remainder(nodes.long(), prime)
    points = torch.remainder(points.long(), prime)
    if torch.unique(nodes).numel() != nodes.numel():
        raise ValueError(f"Lagrange nodes must be distinct, got {nodes.tolist()}")
    count = nodes.numel()
    numerators = torch.ones(points.numel(), count, dtype=torch.long, device=nodes.device)
    denominators = torch.ones(count, dtype=torch.long, device=nodes.device)
    for other in range(count):
        mask = torch.arange(count, device=nodes.device) != other
        factor = torch.remainder(points[:, None] - nodes[other], prime)
        numerators = torch.where(mask, field_mul(numerators, factor, prime), numerators)
        gap = torch.remainder(nodes - nodes[other], prime)
        denominators = torch.where(mask, field_mul(denominators, gap, prime), denominators)
    return field_mul(numerators, field_inverse(denominators, prime)[None, :], prime)


def to_field(values: torch.Tensor, prime: int) -> torch.Tensor:
    """phi of FedVS §4.2: a signed integer tensor mapped to [0, p) (negatives become p + x)."""
    return torch.remainder(values.long(), prime)


def from_field(values: torch.Tensor, prime: int) -> torch.Tensor:
    """Inverse of phi on the representable range: [0, (p-1)/2) -> itself, [(p-1)/2, p) -> x - p."""
    return torch.where(values < (prime - 1) // 2, values, values - prime)


def round_half_up(x: torch.Tensor) -> torch.Tensor:
    """Round of FedVS §4.2: floor(x) if x - floor(x) < 0.5, else floor(x) + 1."""
    return torch.floor(x + 0.5)


def round_stochastic(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Round_stoc of FedVS eq. 3: floor(x) + 1 with probability x - floor(x) (unbiased)."""
    low = torch.floor(x)
    draw = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return low + (draw < x - low).to(x.dtype)


def quantize(
    x: torch.Tensor,
    bits: int,
    prime: int,
    *,
    stochastic: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """phi(Round(2^bits * x)) (data, §4.2) or phi(Round_stoc(2^bits * x)) (models, eq. 3).

    Scaling happens in float64, where 2^bits * x is exact for float32 inputs.
    """
    scaled = x.double() * float(2**bits)
    rounded = round_stochastic(scaled, generator) if stochastic else round_half_up(scaled)
    return to_field(rounded, prime)


def dequantize(values: torch.Tensor, bits: int, prime: int, scale: float = 1.0) -> torch.Tensor:
    """FedVS eq. 7 with ``bits`` = l_x + l_w and ``scale`` = 1/N: scale * 2^-bits * phi^-1(x)."""
    return from_field(values, prime).double() * (scale * 2.0**-bits)


def random_field(
    shape: tuple[int, ...],
    prime: int,
    generator: torch.Generator | None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniform elements of F_p (the masks Z and V of eqs. 2 and 4)."""
    return torch.randint(0, prime, shape, generator=generator, dtype=torch.long, device=device)
