"""FedVS finite-field core and Lagrange coded computing: exact decoding, privacy, no wrap-around."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
import torch
from scipy import stats

from vfl_lightning.mechanisms.field import (
    DEFAULT_PRIME,
    MAX_PRIME,
    check_prime,
    dequantize,
    field_inverse,
    field_matmul,
    from_field,
    lagrange_coefficients,
    products_fit,
    quantize,
    to_field,
)
from vfl_lightning.mechanisms.lcc import (
    DecodingError,
    LagrangeCode,
    check_code_parameters,
    check_no_wraparound,
    recovery_threshold,
)
from vfl_lightning.models.pn import PolynomialNetwork


def _protocol(N, K, T, D, *, l_x=8, l_w=8, prime=DEFAULT_PRIME, seed=0, samples_per_segment=6):
    """Random clients with PN parties; returns the code, quantized plain parts and coded outputs."""
    gen = torch.Generator().manual_seed(seed)
    code = LagrangeCode(N, K, T, prime)
    widths = [int(w) for w in torch.randint(1, 5, (N,), generator=gen)]
    models = [PolynomialNetwork((w,), embedding_dim=3, num_layers=D) for w in widths]
    for model in models:
        with torch.no_grad():
            model.weight.uniform_(-1.0, 1.0, generator=gen)
    rows = K * samples_per_segment
    xs = [torch.rand(rows, w, generator=gen) * 2 - 1 for w in widths]
    features = [m.power_features(x) for m, x in zip(models, xs, strict=True)]
    x_bar = [quantize(f, l_x, prime) for f in features]
    w_bar = [
        quantize(m.weight.detach(), l_w, prime, stochastic=True, generator=gen) for m in models
    ]
    # Data sharing (lines 2-10) and model sharing (lines 14-20) per client.
    data_shares = [
        code.encode_data(x.reshape(K, samples_per_segment, -1), generator=gen) for x in x_bar
    ]
    model_shares = [code.encode_model(w, generator=gen) for w in w_bar]
    coded = code.coded_embeddings(torch.cat(data_shares, dim=2), torch.cat(model_shares, dim=1))
    return code, features, models, x_bar, w_bar, coded


def _plain_signed_sum(x_bar, w_bar, prime):
    """sum_n Xbar_n Wbar_n over the signed integers (no modulus), in Python-exact int64."""
    total = 0
    for x, w in zip(x_bar, w_bar, strict=True):
        total = total + from_field(x, prime) @ from_field(w, prime)
    return total


@pytest.mark.parametrize(
    ("N", "K", "T", "D"),
    [
        (3, 1, 1, 1),
        (5, 2, 1, 1),
        (8, 2, 1, 2),
        (8, 3, 1, 3),
        (7, 1, 2, 2),
        (9, 2, 2, 1),
        (6, 3, 0, 2),
    ],
)
def test_decode_from_any_R_responders_is_the_exact_quantized_sum(N, K, T, D):
    code, _, _, x_bar, w_bar, coded = _protocol(N, K, T, D, seed=N * 100 + K * 10 + T + D)
    R = recovery_threshold(K, T)
    assert code.threshold == R == 2 * (K + T - 1) + 1
    expected = _plain_signed_sum(x_bar, w_bar, code.prime).reshape(K, -1, 3)
    assert expected.abs().max() < code.prime // 2
    subsets = list(itertools.combinations(range(N), R))
    rng = np.random.default_rng(N)
    for pick in rng.permutation(len(subsets))[:12]:
        responders = list(rng.permutation(list(subsets[pick])))
        decoded = code.decode(coded[responders], responders)
        assert torch.equal(from_field(decoded, code.prime), expected)


def test_decode_uses_the_first_R_of_more_responders():
    code, _, _, x_bar, w_bar, coded = _protocol(8, 2, 1, 1, seed=3)
    responders = [7, 2, 5, 0, 1, 6, 3]
    decoded = code.decode(coded[responders], responders)
    expected = _plain_signed_sum(x_bar, w_bar, code.prime).reshape(2, -1, 3)
    assert torch.equal(from_field(decoded, code.prime), expected)


@pytest.mark.parametrize(("N", "K", "T"), [(5, 2, 1), (8, 2, 1), (9, 2, 2)])
def test_R_minus_one_responders_cannot_decode(N, K, T):
    code, *_, coded = _protocol(N, K, T, 1)
    R = code.threshold
    with pytest.raises(
        DecodingError, match=rf"needs R = 2\(K\+T-1\)\+1 = {R} coded embeddings.*got {R - 1}"
    ):
        code.decode(coded[: R - 1], list(range(R - 1)))


def test_R_minus_one_points_do_not_determine_the_sum():
    # Interpolating through R-1 points gives a wrong sum: the threshold is tight, not conservative.
    code, _, _, x_bar, w_bar, coded = _protocol(5, 2, 1, 1, seed=11)
    R = code.threshold
    nodes = code.alphas[: R - 1]
    matrix = lagrange_coefficients(nodes, torch.arange(1, code.K + 1), code.prime)
    wrong = field_matmul(matrix, coded[: R - 1].reshape(R - 1, -1), code.prime)
    expected = to_field(_plain_signed_sum(x_bar, w_bar, code.prime), code.prime)
    assert not torch.equal(wrong.reshape(expected.shape), expected)


def test_dequantized_average_is_within_the_quantization_bound():
    l_x, l_w, N, K, T, D = 10, 9, 8, 2, 1, 2
    code, features, models, x_bar, w_bar, coded = _protocol(N, K, T, D, l_x=l_x, l_w=l_w, seed=5)
    responders = [6, 1, 3, 7, 0]
    average = code.dequantize_average(code.decode(coded[responders], responders), l_x, l_w)
    plain = sum(m.embed(f).double() for m, f in zip(models, features, strict=True)) / N
    # |xw - x'w'| <= |x - x'||w| + |x'||w - w'| with |x - x'| <= 2^-(l_x+1), |w - w'| < 2^-l_w.
    bound = 0.0
    for f, m in zip(features, models, strict=True):
        f_abs, w_abs = f.double().abs(), m.weight.detach().double().abs()
        bound = (
            bound
            + 2.0 ** -(l_x + 1) * w_abs.sum(0)
            + (f_abs + 2.0 ** -(l_x + 1)).sum(1, keepdim=True) * 2.0**-l_w
        )
    bound = bound / N
    error = (average.reshape(plain.shape) - plain).abs()
    assert (error <= bound).all()
    assert error.max() > 0  # quantization is really in the loop


def test_model_shares_are_unbiased_stochastic_rounding():
    gen = torch.Generator().manual_seed(0)
    w = torch.full((20000,), 0.3)
    q = from_field(quantize(w, 2, DEFAULT_PRIME, stochastic=True, generator=gen), DEFAULT_PRIME)
    assert set(q.unique().tolist()) == {1, 2}  # 0.3 * 4 = 1.2
    assert abs(q.double().mean().item() - 1.2) < 4 * math.sqrt(0.16 / 20000)
    assert torch.equal(
        quantize(torch.tensor([0.5, -0.5, 1.49, -1.5]), 0, 7), torch.tensor([1, 0, 1, 6])
    )


def _share_histogram(secret, T, draws, prime, K=2, N=5, client=3, seed=0):
    code = LagrangeCode(N, K, T, prime)
    gen = torch.Generator().manual_seed(seed)
    segments = torch.full((K, draws, 1), secret, dtype=torch.long)
    shares = code.encode_data(segments, generator=gen)[client, :, 0]
    return torch.bincount(shares, minlength=prime).numpy()


def test_T_privacy_one_share_does_not_depend_on_the_secret():
    prime, draws = 13, 26000
    counts = [_share_histogram(s, 1, draws, prime, seed=s) for s in (0, 5, 12)]
    for c in counts:
        assert stats.chisquare(c).pvalue > 1e-3  # uniform on F_p whatever the secret
    assert stats.chi2_contingency(np.stack(counts)).pvalue > 1e-3  # same law for all secrets
    # Without masks (T = 0) the same statistic detects the secret: the test has power.
    leaky = [_share_histogram(s, 0, draws, prime, K=2, N=3, client=2, seed=s) for s in (0, 5)]
    assert stats.chi2_contingency(np.stack(leaky)[:, np.stack(leaky).sum(0) > 0]).pvalue < 1e-6


def test_T_privacy_model_share_is_uniform():
    prime = 13
    code = LagrangeCode(5, 2, 1, prime)
    gen = torch.Generator().manual_seed(1)
    histograms = []
    for secret in (0, 7):
        shares = code.encode_model(torch.full((20000,), secret, dtype=torch.long), generator=gen)
        histograms.append(torch.bincount(shares[4], minlength=prime).numpy())
    assert stats.chi2_contingency(np.stack(histograms)).pvalue > 1e-3
    assert all(stats.chisquare(h).pvalue > 1e-3 for h in histograms)


def test_field_matmul_is_exact_near_p_on_long_inner_dimensions():
    prime = DEFAULT_PRIME
    gen = torch.Generator().manual_seed(2)
    a = prime - 1 - torch.randint(0, 1000, (3, 1500), generator=gen)
    b = prime - 1 - torch.randint(0, 1000, (1500, 2), generator=gen)
    got = field_matmul(a, b, prime)
    rows, cols = a.tolist(), b.tolist()
    want = [
        [sum(x * cols[k][j] for k, x in enumerate(row)) % prime for j in range(2)] for row in rows
    ]
    assert got.tolist() == want
    largest = MAX_PRIME
    while not _is_prime_slow(largest):
        largest -= 1
    big = torch.full((2, 4), largest - 1)
    assert (
        field_matmul(big, big.T, largest).tolist() == [[4 * (largest - 1) ** 2 % largest] * 2] * 2
    )


@pytest.mark.parametrize("large", [False, True], ids=["default-prime", "largest-prime"])
def test_short_inner_products_and_model_shares_are_exact_near_p(large):
    """The short inner dimensions (data shares: K + T terms) and the model shares' T + 1 terms
    are summed unreduced only where the sum fits in int64 (the default prime), reduced term by
    term otherwise (the largest prime): both give the exact residues of Python integers."""
    prime = DEFAULT_PRIME
    if large:
        prime = MAX_PRIME
        while not _is_prime_slow(prime):
            prime -= 1
    assert products_fit(2, prime) != large and not products_fit(3, prime)
    gen = torch.Generator().manual_seed(3)
    a = prime - 1 - torch.randint(0, 50, (4, 2), generator=gen)
    b = prime - 1 - torch.randint(0, 50, (2, 5), generator=gen)
    want = [
        [sum(x * b.tolist()[k][j] for k, x in enumerate(row)) % prime for j in range(5)]
        for row in a.tolist()
    ]
    assert field_matmul(a, b, prime).tolist() == want
    code = LagrangeCode(5, 2, 1, prime)
    weights = prime - 1 - torch.randint(0, 50, (3, 4), generator=gen)
    masks = prime - 1 - torch.randint(0, 50, (1, 12), generator=gen)
    shares = code.encode_model(weights, masks=masks)
    encoder, model = code.encoder.tolist(), code.model_weights.tolist()
    for n in range(5):
        expected = [
            (model[n] * w + encoder[n][2] * v) % prime
            for w, v in zip(weights.reshape(-1).tolist(), masks[0].tolist(), strict=True)
        ]
        assert shares[n].reshape(-1).tolist() == expected


def _is_prime_slow(n):
    return n > 1 and all(n % q for q in range(2, math.isqrt(n) + 1))


def test_field_inverse_and_lagrange_interpolation():
    prime = 101
    a = torch.arange(1, prime)
    assert torch.equal(torch.remainder(a * field_inverse(a, prime), prime), torch.ones_like(a))
    with pytest.raises(ZeroDivisionError, match="0 has no inverse"):
        field_inverse(torch.tensor([0]), prime)
    # A degree-2 polynomial through 3 nodes is reproduced at other points.
    nodes, points = torch.tensor([3, 8, 20]), torch.tensor([0, 1, 50, 100])
    poly = lambda x: (7 + 5 * x + 9 * x * x) % prime  # noqa: E731
    coefficients = lagrange_coefficients(nodes, points, prime)
    assert (
        field_matmul(coefficients, poly(nodes)[:, None], prime)[:, 0].tolist()
        == poly(points).tolist()
    )
    with pytest.raises(ValueError, match="nodes must be distinct"):
        lagrange_coefficients(torch.tensor([3, 3]), points, prime)


def test_sums_at_plus_minus_p_half_do_not_wrap():
    prime = DEFAULT_PRIME
    top, bottom = (prime - 3) // 2, -(prime + 1) // 2
    assert from_field(to_field(torch.tensor([top, bottom, -1, 0]), prime), prime).tolist() == [
        top,
        bottom,
        -1,
        0,
    ]
    # End to end with l_x = l_w = 0: one client's feature x = 1 and weight = top (resp. a sum of
    # negative terms reaching bottom) decode exactly to top (resp. bottom).
    code = LagrangeCode(3, 1, 1, prime)
    gen = torch.Generator().manual_seed(0)
    for target in (top, bottom, top - 1, bottom + 1):
        x_bar = torch.ones(1, 2, 2, dtype=torch.long)  # K=1 segment, 2 samples, 2 features
        w_bar = to_field(torch.tensor([[target - target // 2], [target // 2]]), prime)
        data = code.encode_data(x_bar, generator=gen)
        model = code.encode_model(w_bar, generator=gen)
        decoded = code.decode(code.coded_embeddings(data, model)[[2, 0, 1]], [2, 0, 1])
        assert from_field(decoded, prime).flatten().tolist() == [target, target]
        assert dequantize(decoded, 0, prime).flatten().tolist() == [float(target)] * 2


def test_overflow_precheck_allows_the_limit_and_refuses_one_more():
    prime = 2**13 - 1  # limit (p-3)/2 = 4094
    kwargs = dict(feature_counts=[2], degrees=[1], data_bounds=[1.0], l_x=0, l_w=0, prime=prime)
    # bound = (2 * 1 + 1) * ceil(w) = 3w: w = 1364 gives 4092 <= 4094, w = 1365 gives 4095.
    assert check_no_wraparound(weight_bound=1364.0, **kwargs).bound == 4092
    with pytest.raises(
        ValueError, match=r"can reach 4095 but must stay <= \(p-3\)/2 = 4094.*lower algo.l_w"
    ):
        check_no_wraparound(weight_bound=1365.0, **kwargs)


def test_overflow_precheck_names_the_parameter_to_lower():
    kwargs = dict(
        feature_counts=[784 // 28] * 28, degrees=[2] * 28, data_bounds=[1.0] * 28, weight_bound=4.0
    )
    check_no_wraparound(l_x=8, l_w=8, prime=DEFAULT_PRIME, **kwargs)
    with pytest.raises(ValueError, match=r"lower algo.l_w from 16 to 9"):
        check_no_wraparound(l_x=8, l_w=16, prime=DEFAULT_PRIME, **kwargs)
    with pytest.raises(ValueError, match=r"lower algo.l_x from 14 to 9"):
        check_no_wraparound(l_x=14, l_w=8, prime=DEFAULT_PRIME, **kwargs)
    with pytest.raises(ValueError, match=r"algo.l_x must be an integer in \[0, 40\], got -1"):
        check_no_wraparound(l_x=-1, l_w=8, prime=DEFAULT_PRIME, **kwargs)
    with pytest.raises(ValueError, match=r"algo.weight_bound must be > 0, got 0"):
        check_no_wraparound(l_x=8, l_w=8, prime=DEFAULT_PRIME, **{**kwargs, "weight_bound": 0})


def test_overflow_precheck_suggests_a_weight_bound_that_fits():
    kwargs = dict(
        feature_counts=[784 // 28] * 28,
        degrees=[2] * 28,
        data_bounds=[2.5] * 28,
        prime=DEFAULT_PRIME,
    )
    with pytest.raises(ValueError) as refused:
        check_no_wraparound(l_x=8, l_w=12, weight_bound=3.16, **kwargs)
    message = str(refused.value)
    found = re.search(r"lower algo.weight_bound from 3.16 to at most ([0-9.e-]+);", message)
    assert found, message
    suggested = float(found.group(1))
    assert 0 < suggested < 3.16
    # the suggested value fits, and the next value of its 3 significant digits does not
    check_no_wraparound(l_x=8, l_w=12, weight_bound=suggested, **kwargs)
    step = 10 ** (math.floor(math.log10(suggested)) - 2)
    with pytest.raises(ValueError, match="can reach"):
        check_no_wraparound(l_x=8, l_w=12, weight_bound=suggested + step, **kwargs)
    # where even the smallest quantized weight overflows, no bound is suggested
    with pytest.raises(ValueError, match=r"no algo.weight_bound > 0 fits at l_w=0"):
        check_no_wraparound(
            feature_counts=[10],
            degrees=[1],
            data_bounds=[1.0],
            weight_bound=1.0,
            l_x=10,
            l_w=0,
            prime=2**13 - 1,
        )


def test_bad_code_parameters_are_refused():
    with pytest.raises(
        ValueError,
        match=r"needs N >= 2\(K\+T-1\)\+1 = 7 clients for K=3, T=1, got N=6; lower K to at most 2",
    ):
        check_code_parameters(6, 3, 1, DEFAULT_PRIME)
    with pytest.raises(
        ValueError,
        match=r"= 9 clients for K=1, T=4, got N=4; algo.T must be at most 1 with N=4 and algo.K=1$",
    ):
        LagrangeCode(4, 1, 4)
    with pytest.raises(ValueError, match="K must be an integer >= 1, got 0"):
        LagrangeCode(5, 0, 1)
    with pytest.raises(ValueError, match="T must be an integer >= 0, got -1"):
        LagrangeCode(5, 1, -1)
    with pytest.raises(ValueError, match="prime must be an integer, got 2.5"):
        check_prime(2.5)
    with pytest.raises(ValueError, match=r"prime must be in \[3, 3037000499\].*got 4294967311"):
        LagrangeCode(5, 1, 1, prime=4294967311)
    with pytest.raises(ValueError, match="prime must be a prime number, got 2147483649"):
        LagrangeCode(5, 1, 1, prime=2**31 + 1)
    with pytest.raises(ValueError, match="prime must be an integer, got True"):
        check_prime(True)
    with pytest.raises(ValueError, match="prime must exceed K\\+T\\+N = 8"):
        LagrangeCode(5, 2, 1, prime=7)
    code = LagrangeCode(5, 2, 1)
    with pytest.raises(ValueError, match=r"responders must be in \[0, 4\], got \[5\]"):
        code.decoding_matrix([0, 1, 2, 3, 5])
    with pytest.raises(ValueError, match="responders must be distinct"):
        code.decoding_matrix([0, 1, 2, 2, 3])
    with pytest.raises(ValueError, match="encode_data needs K=2 segments, got 3"):
        code.encode_data(torch.zeros(3, 1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="party.num_layers must be an integer >= 1, got 0"):
        PolynomialNetwork((4,), num_layers=0)


def test_polynomial_network_is_eq1_with_absorbed_bias():
    gen = torch.Generator().manual_seed(0)
    model = PolynomialNetwork((2, 3), embedding_dim=4, num_layers=3)
    x = torch.randn(5, 2, 3, generator=gen)
    flat = x.reshape(5, 6)
    w = model.weight.detach()
    expected = flat @ w[:6] + (flat**2) @ w[6:12] + (flat**3) @ w[12:18] + w[18]
    assert torch.allclose(model(x), expected, atol=1e-5)
    assert model.num_power_features == 19
