"""derive_seed: every derived generator seed, each stream's recipe pinned (so digests hold),
distinct streams per party, bad arguments refused."""

from __future__ import annotations

import pytest

from vfl_lightning.seeding import derive_seed, seeded_generator, splitmix64_int


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1])
def test_server_streams_keep_their_recipe(seed):
    base = seed * 1_000_003 + 17
    assert derive_seed(seed, "server", "train") == base
    assert derive_seed(seed, "server", "val") == base + 7919
    assert derive_seed(seed, "server", "test") == base + 2 * 7919
    assert derive_seed(seed, "server", "predict") == base + 3 * 7919
    assert derive_seed(seed, "server", "sanity") == base + 3 * 7919
    assert derive_seed(seed, "server", "activation") == seed * 7919 + 104_729


@pytest.mark.parametrize("seed,party", [(0, 0), (3, 2), (2**32 - 1, 27)])
def test_party_streams_mix_the_party_index(seed, party):
    for stream, offset in (("train", 0), ("test", 2), ("fedvs_data", 4), ("delays", 5)):
        base = seed * 1_000_003 + 7919 * offset + 17
        mixed = splitmix64_int(splitmix64_int(base) ^ splitmix64_int(party + 1))
        assert derive_seed(seed, "party", stream, party) == mixed & (2**63 - 1)


def test_the_local_simulation_keeps_its_fedvs_data_recipe():
    assert derive_seed(11, "simulation", "fedvs_data") == 11 * 7919 + 1


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1])
def test_numbered_streams_keep_the_recipes_they_had_before_one_function(seed):
    """The data split, shuffle, stragglers, defenses and attacks drew from these seeds when each
    file wrote its own recipe: the values are kept (digests and attack results reproduce)."""
    name = "gradient_noise"
    assert derive_seed(seed, "server", "shuffle", index=5) == seed * 100_003 + 5
    assert derive_seed(seed, "server", "split") == seed
    assert derive_seed(seed, "server", "split", index=1) == seed + 1
    assert derive_seed(seed, "simulation", "stragglers") == seed + 7177
    code = sum(map(ord, name))
    assert derive_seed(seed, "server", "defense", index=code) == seed * 6_700_417 + code + 31
    code = len(name) * 104_729
    assert derive_seed(seed, "adversary", "attack", index=code) == seed * 7_919 + code + 23
    assert derive_seed(seed, "adversary", "eavesdropper") == seed + 2_147
    assert derive_seed(seed, "adversary", "collusion") == seed


def test_index_is_refused_outside_the_numbered_streams():
    with pytest.raises(
        ValueError, match=r"index is for the numbered streams only, got 3 for 'val'"
    ):
        derive_seed(0, "server", "val", index=3)


def test_no_two_parties_or_streams_share_a_seed():
    streams = ("train", "val", "test", "predict", "fedvs_data", "delays")
    seeds = [derive_seed(5, "party", s, m) for s in streams for m in range(64)]
    seeds += [derive_seed(5, "server", s) for s in streams]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**63 for s in seeds)


def test_seeded_generator_draws_from_the_derived_seed():
    import torch

    a = torch.rand(4, generator=seeded_generator(3, "party", "train", 1))
    b = torch.rand(4, generator=torch.Generator().manual_seed(derive_seed(3, "party", "train", 1)))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            (0, "client", "train"),
            r"role must be one of \('server', 'party', 'simulation', 'adversary'\), got 'client'",
        ),
        (
            (0, "server", "train", 1),
            r"party must be given for role='party' only, got 1 for 'server'",
        ),
        ((0, "party", "train"), r"party must be given for role='party' only, got None for 'party'"),
        ((0, "party", "train", -1), r"party must be an integer >= 0, got -1"),
        ((0, "party", "train", True), r"party must be an integer >= 0, got True"),
        (
            (0, "simulation", "train"),
            r"role='simulation' draws only the streams \['canaries', 'fedvs_data', 'overlap', 'stragglers'\], got 'train'",
        ),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        derive_seed(*args)
