"""PBM mechanism, pairwise-mask secure aggregation and the Gaussian LDP baseline: exact and
statistical properties, and every bad input."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from vfl_lightning.mechanisms.ldp import GaussianLDP, matched_sigma
from vfl_lightning.mechanisms.pbm import PBM
from vfl_lightning.mechanisms.secure_agg import PairwiseMasking, ring_bits
from vfl_lightning.seeding import splitmix64, splitmix64_int


def reference_splitmix64(x: int) -> int:
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_splitmix64_matches_unsigned_reference():
    inputs = [0, 1, 2, 12345, 2**62 + 7, 2**63 - 1, -1, -(2**63), -987654321]
    got = splitmix64(torch.tensor(inputs, dtype=torch.int64)).tolist()
    for x, value in zip(inputs, got, strict=True):
        assert value % 2**64 == reference_splitmix64(x % 2**64)


@pytest.mark.parametrize("num_parties", [1, 2, 13])
@pytest.mark.parametrize("b", [1, 3, 16])
@pytest.mark.parametrize("shape", [(5,), (7, 3), (2, 3, 4)])
def test_masked_integers_sum_to_plain_sum(num_parties, b, shape):
    masking = PairwiseMasking(num_parties, ring_bits(num_parties, b), seed=11)
    gen = torch.Generator().manual_seed(num_parties * 100 + b)
    for round in (0, 1, 57):
        secrets = [torch.randint(0, b + 1, shape, generator=gen) for _ in range(num_parties)]
        masked = masking.mask(secrets, round)
        assert all(y.dtype == torch.int64 and y.shape == shape for y in masked)
        assert all(int(y.min()) >= 0 and int(y.max()) < masking.modulus for y in masked)
        assert torch.equal(masking.secure_sum(masked), torch.stack(secrets).sum(0))


def test_masked_sum_exact_in_the_largest_ring():
    num_parties, bits = 13, 62
    masking = PairwiseMasking(num_parties, bits, seed=3)
    gen = torch.Generator().manual_seed(0)
    largest = (2**bits - 1) // num_parties
    secrets = [torch.randint(largest - 1000, largest + 1, (64,), generator=gen) for _ in range(13)]
    masked = masking.mask(secrets, round=9)
    assert torch.equal(masking.secure_sum(masked), torch.stack(secrets).sum(0))


def test_pbm_fuse_equals_dequantized_plain_count_sum():
    pbm = PBM(num_parties=5, b=6, beta=0.2, C=1.5, seed=4)
    gen = torch.Generator().manual_seed(1)
    embeddings = [2 * torch.rand(8, 16, generator=gen) - 1 for _ in range(5)]
    messages = pbm.encode(embeddings, generator=torch.Generator().manual_seed(7), round=3)
    replay = torch.Generator().manual_seed(7)
    counts = list(pbm.quantize(torch.stack(embeddings).clamp(-1.5, 1.5), replay).unbind(0))
    assert torch.equal(pbm.masking.secure_sum(messages), torch.stack(counts).sum(0))
    expected = (torch.stack(counts).sum(0).double() - 6 * 5 / 2) * (1.5 / (0.2 * 6))
    assert torch.equal(pbm.fuse(messages), expected.float())
    assert pbm.fuse(messages).dtype == torch.float32
    # the server only ever holds masked values: no message equals its party's counts
    assert all(not torch.equal(y, q) for y, q in zip(messages, counts, strict=True))


@pytest.mark.parametrize("b", [1, 5, 20, 21, 100])
def test_quantize_is_binomial(b):
    """Chi-square goodness of fit to Binomial(b, p) for both samplers (inverse CDF, b <= 20)."""
    pbm = PBM(num_parties=1, b=b, beta=0.2)
    h = torch.full((20000,), 0.5)
    counts = pbm.quantize(h, torch.Generator().manual_seed(b)).numpy()
    p = 0.5 + 0.2 * 0.5
    support = np.arange(b + 1)
    expected = stats.binom.pmf(support, b, p) * counts.size
    keep = expected >= 5
    observed = np.bincount(counts, minlength=b + 1)
    pooled_observed, pooled_expected = observed[keep], expected[keep]
    if not keep.all():
        pooled_observed = np.append(pooled_observed, observed[~keep].sum())
        pooled_expected = np.append(pooled_expected, expected[~keep].sum())
    assert stats.chisquare(pooled_observed, pooled_expected).pvalue > 1e-3


def test_splitmix_python_and_tensor_versions_agree():
    inputs = [0, 5, 2**63 + 11, 2**64 - 1]
    tensor = splitmix64(torch.tensor([v - 2**64 if v >= 2**63 else v for v in inputs]))
    assert [v % 2**64 for v in tensor.tolist()] == [splitmix64_int(v) for v in inputs]


def test_one_party_message_is_independent_of_its_input():
    """Chi-square: party 0's masked value is uniform on Z_R whatever its count q_0 is."""
    num_parties, b, rounds = 3, 4, 1600
    masking = PairwiseMasking(num_parties, ring_bits(num_parties, b), seed=6)
    modulus = masking.modulus
    table = np.zeros((2, modulus), dtype=np.int64)
    for row, q0 in enumerate((0, b)):
        for r in range(rounds):
            secrets = [torch.tensor([q0]), torch.tensor([1]), torch.tensor([2])]
            value = int(masking.mask(secrets, round=row * rounds + r)[0][0])
            table[row, value] += 1
        assert stats.chisquare(table[row]).pvalue > 1e-3
    assert stats.chi2_contingency(table).pvalue > 1e-3


def test_masks_are_fresh_every_round():
    masking = PairwiseMasking(4, 10, seed=2)
    first = masking.party_masks(0, (1000,))
    second = masking.party_masks(1, (1000,))
    # independent uniform masks on Z_1024 agree on about 1/1024 of the elements
    assert (first == second).float().mean() < 0.01
    assert torch.equal(first, masking.party_masks(0, (1000,)))
    other_setup = PairwiseMasking(4, 10, seed=3).party_masks(0, (1000,))
    assert (first == other_setup).float().mean() < 0.01


@pytest.mark.parametrize(
    ("num_parties", "b", "bits"), [(1, 1, 1), (4, 16, 7), (4, 2, 4), (13, 5, 7)]
)
def test_bits_per_element_is_ring_width(num_parties, b, bits):
    pbm = PBM(num_parties=num_parties, b=b, beta=0.1)
    assert pbm.bits_per_element == bits == math.ceil(math.log2(num_parties * b + 1))
    assert pbm.modulus == 2**bits


def test_pbm_estimate_unbiased_with_theorem_variance():
    """Mean = Σ clip(h_m); variance = C² Σ p(1−p) / (β² b) per element (Theorem 2.3, part 2)."""
    num_parties, b, beta, C, rows = 3, 8, 0.2, 2.0, 40000
    pbm = PBM(num_parties=num_parties, b=b, beta=beta, C=C, seed=1)
    values = torch.tensor(
        [
            [-2.0, -1.0, 0.0, 0.5, 1.9, 3.0],
            [0.3, -2.5, 1.0, -0.5, 2.0, 0.0],
            [1.0, 1.0, -1.0, 0.0, 0.7, -2.0],
        ]
    )
    embeddings = [v.expand(rows, -1) for v in values]
    fused = pbm.release(embeddings, generator=torch.Generator().manual_seed(3), round=0).double()
    clipped = values.clamp(-C, C).double()
    p = 0.5 + beta / C * clipped
    variance = C**2 * (p * (1 - p)).sum(0) / (beta**2 * b)
    mean_error = (fused.mean(0) - clipped.sum(0)) / (variance / rows).sqrt()
    assert mean_error.abs().max() < 5.0
    relative = fused.var(0) / variance - 1.0
    assert relative.abs().max() < 6.0 * math.sqrt(2.0 / rows)
    assert pbm.stats["pbm/clip_fraction"].item() == pytest.approx(
        2 / 18
    )  # 3.0 and -2.5 lie outside [-2, 2]


def test_pbm_straight_through_gradients():
    pbm = PBM(num_parties=3, b=4, beta=0.1)
    grad = torch.randn(5, 16)
    assert all(torch.equal(g, grad) for g in pbm.party_gradients(grad, [16, 16, 16]))


def test_pbm_apply_at_eval_false_gives_exact_sum():
    pbm = PBM(num_parties=2, b=4, beta=0.1, apply_at_eval=False)
    embeddings = [torch.full((2, 3), 0.25), torch.full((2, 3), -0.5)]
    assert torch.equal(pbm.evaluate(embeddings), torch.full((2, 3), -0.25))


def test_pbm_state_dict_refuses_other_parameters():
    pbm = PBM(num_parties=4, b=16, beta=0.15)
    PBM(num_parties=4, b=16, beta=0.15).load_state_dict(pbm.state_dict())
    with pytest.raises(ValueError, match="checkpoint was written by PBM"):
        PBM(num_parties=4, b=2, beta=0.15).load_state_dict(pbm.state_dict())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(beta=0.3), r"beta must be in \(0, 0.25\] for PBM, got 0.3"),
        (dict(beta=-0.01), r"beta must be in \(0, 0.25\] for PBM, got -0.01"),
        (dict(beta=0.0), r"beta must be in \(0, 0.25\] for PBM, got 0"),
        (dict(b=0), r"b must be an integer >= 1, got 0"),
        (dict(b=-3), r"b must be an integer >= 1, got -3"),
        (dict(b=2.5), r"b must be an integer >= 1, got 2.5"),
        (dict(b=True), r"b must be an integer >= 1, got True"),
        (dict(C=0.0), r"C must be > 0, got 0.0"),
        (dict(C=-1.0), r"C must be > 0, got -1.0"),
        (dict(b=2**61), r"num_parties \* b = \d+ needs a ring of 2\^63, which does not fit int64"),
        (dict(num_parties=0), r"num_parties must be >= 1, got 0"),
    ],
)
def test_pbm_bad_inputs(kwargs, message):
    arguments = dict(num_parties=2, b=4, beta=0.1, C=1.0) | kwargs
    with pytest.raises(ValueError, match=message):
        PBM(**arguments)


def test_pbm_rejects_wrong_party_count():
    with pytest.raises(ValueError, match="PBM was built for 3 parties, got 2 embeddings"):
        PBM(num_parties=3, b=4, beta=0.1).encode([torch.zeros(2, 4)] * 2)


def test_ldp_matched_sigma_and_noise_level():
    ldp = GaussianLDP(num_parties=4, b=16, beta=0.15)
    assert ldp.sigma == pytest.approx(math.sqrt(2 * 4 / (16 * 0.15**2)))
    assert matched_sigma(b=16, beta=0.15, num_parties=4) == ldp.sigma
    rows = 20000
    embeddings = [torch.full((rows, 2), 0.5), torch.full((rows, 2), 3.0)] + [
        torch.zeros(rows, 2)
    ] * 2
    fused = ldp.release(embeddings, generator=torch.Generator().manual_seed(0)).double()
    standard_error = ldp.sigma * 2 / math.sqrt(rows)
    assert (fused.mean(0) - 1.5).abs().max() < 5 * standard_error
    assert (fused.var(0) / (4 * ldp.sigma**2) - 1).abs().max() < 6 * math.sqrt(2 / rows)
    assert ldp.stats["ldp/clip_fraction"].item() == pytest.approx(0.25)
    assert GaussianLDP(num_parties=2, sigma=0.7).sigma == 0.7
    assert GaussianLDP(num_parties=2, b=4, beta=0.1, sigma=0.7).sigma == 0.7


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(sigma=0.0), r"sigma must be > 0, got 0.0"),
        (dict(sigma=-1.0), r"sigma must be > 0, got -1.0"),
        (dict(), r"GaussianLDP needs sigma, or both b and beta"),
        (dict(b=4), r"GaussianLDP needs sigma, or both b and beta"),
        (dict(b=4, beta=0.3), r"beta must be in \(0, 0.25\] for PBM, got 0.3"),
        (dict(b=0, beta=0.1), r"b must be an integer >= 1, got 0"),
        (dict(sigma=1.0, C=0.0), r"C must be > 0, got 0.0"),
    ],
)
def test_ldp_bad_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GaussianLDP(num_parties=2, **kwargs)


@pytest.mark.parametrize("b", [1, 2, 7, 16, 20])
def test_inverse_cdf_counts_equal_a_scalar_reference(b):
    """Each count is the number of k < b with CDF_k(p) <= u, for the element's own uniform u (the
    generator's first draws) and the Binomial CDF summed term by term in Python floats."""
    pbm = PBM(num_parties=1, b=b, beta=0.25)
    h = torch.linspace(-1.0, 1.0, 3001)
    counts = pbm.quantize(h, torch.Generator().manual_seed(b)).tolist()
    uniforms = torch.rand(h.shape, generator=torch.Generator().manual_seed(b), dtype=torch.float64)
    for value, u, count in zip(h.double().tolist(), uniforms.tolist(), counts, strict=True):
        p = 0.5 + 0.25 * value
        cdf, expected = 0.0, 0
        for k in range(b):
            cdf += math.comb(b, k) * p**k * (1 - p) ** (b - k)
            if abs(u - cdf) < 1e-12:  # a tie within rounding: either side is a valid draw
                expected = count
                break
            expected += u >= cdf
        assert count == expected


def test_masks_expanded_ahead_in_blocks_equal_each_rounds_own_expansion():
    """Net masks served from blocks of consecutive rounds (training), from single-round blocks
    (evaluation streams far away), for shorter and longer messages, and after masking in place
    elsewhere, equal the net of that round's own pair streams: Σ_{j>m} u_mj − Σ_{i<m} u_im mod R."""
    masking = PairwiseMasking(4, 7, seed=5)
    reference = PairwiseMasking(4, 7, seed=5)

    def expected(round, numel):
        pair = reference.pair_masks(round, numel)
        net = torch.zeros(4, numel, dtype=torch.int64)
        for k, (i, j) in enumerate(reference.pairs):
            net[i] += pair[k]
            net[j] -= pair[k]
        return net % reference.modulus

    def check(requests):
        for round, numel in requests:
            secrets = torch.randint(0, 16, (4, numel))
            masked = masking.mask_stacked(secrets, round)
            assert torch.equal(masked, (secrets + expected(round, numel)) % masking.modulus)
            assert torch.equal(masking.party_masks(round, (numel,)), expected(round, numel))

    check([(r, 50) for r in range(40)])  # consecutive rounds: the blocks grow
    assert max(block.shape[0] for _, block in masking._blocks) == masking.BLOCK_ROUNDS
    check([(2**60 + 7, 50), (40, 50), (2**60 + 8, 120), (41, 30), (42, 120), (3, 50)])
    check([(2**64 - 1, 10)])  # the last round there is
    # the cached masks are read-only to callers: masking twice gives the same values
    secrets = torch.ones(4, 50, dtype=torch.int64)
    first = masking.mask_stacked(secrets, 10).clone()
    masking.party_masks(10, (50,)).add_(1)
    assert torch.equal(masking.mask_stacked(secrets, 10), first)
