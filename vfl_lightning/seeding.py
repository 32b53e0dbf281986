"""Every derived generator seed of a run, from one function of (seed, role, party, stream), and the
splitmix64 finalizer it and the secure-aggregation masks are built on (stdlib and torch only)."""

from __future__ import annotations

import torch

GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB
UINT64 = (1 << 64) - 1

ROLES = ("server", "party", "simulation", "adversary")
"""Who draws: the server (the module's streams, the activation model of the asynchronous
family, the data split and shuffle, its defenses), one party (its own noise, ZOO directions, work
delays, FedVS data shares under Ray), the local simulation drawing for every party at once (FedVS
data shares under runtime=local, the network's stragglers, a privacy audit's canary rows and
coins), or an attack's adversary (its auxiliary rows and known samples)."""

STREAM_OFFSETS = {
    "train": 0,
    "val": 1,
    "test": 2,
    "fedvs_data": 4,
    "delays": 5,
    "fedvs_eval_data": 6,
}
"""Stream numbers of the server's and the parties' streams; any other stream (``predict``,
``sanity``) is number 3. ``fedvs_data``: FedVS data-share masks, re-drawn from the seed on resume;
``delays``: an asynchronous client's real work delays under ``runtime=ray`` (checkpointed);
``fedvs_eval_data``: a FedVS client's evaluation data-share masks under ``runtime=ray``."""

SPECIAL_STREAMS = {
    ("server", "activation"): (7_919, 104_729),
    ("server", "split"): (1, 0),
    ("server", "shuffle"): (100_003, 0),
    ("server", "defense"): (6_700_417, 31),
    ("simulation", "fedvs_data"): (7_919, 1),
    ("simulation", "stragglers"): (1, 7_177),
    ("simulation", "canaries"): (1_000_033, 9_973),
    ("simulation", "overlap"): (1_000_037, 65_537),
    ("adversary", "attack"): (7_919, 23),
    ("adversary", "eavesdropper"): (1, 2_147),
    ("adversary", "collusion"): (1, 0),
}
"""Streams whose seed is ``seed * a + b + index`` for the (a, b) given: the recipes these streams
had before seeds were derived in one place, kept so every earlier run reproduces bit for bit.
``index`` numbers the generators of one stream (the shuffle's epoch, the data split's two draws,
a defense's or an attack's name code, the simulated overlap's draw (0) and party m's row order
(m + 1))."""


def as_int64(value: int) -> int:
    """The signed int64 with the same 64 bits as the unsigned ``value``."""
    value &= UINT64
    return value - (1 << 64) if value >= 1 << 63 else value


def _logical_shift_right(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Unsigned right shift on int64 (torch's ``>>`` is arithmetic: it copies the sign bit)."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finalizer on int64 tensors (arithmetic wraps mod 2^64, as in C's uint64)."""
    z = x + as_int64(GOLDEN_GAMMA)
    z.bitwise_xor_(_logical_shift_right(z, 30)).mul_(as_int64(MIX_1))
    z.bitwise_xor_(_logical_shift_right(z, 27)).mul_(as_int64(MIX_2))
    return z.bitwise_xor_(_logical_shift_right(z, 31))


def splitmix64_int(x: int) -> int:
    """The same finalizer on one Python integer (unsigned 64-bit result), for per-pair keys."""
    z = (x + GOLDEN_GAMMA) & UINT64
    z = ((z ^ (z >> 30)) * MIX_1) & UINT64
    z = ((z ^ (z >> 27)) * MIX_2) & UINT64
    return z ^ (z >> 31)


def derive_seed(
    seed: int,
    role: str,
    stream: str,
    party: int | None = None,
    index: int = 0,
    *,
    release: int | None = None,
) -> int:
    """The seed of ``role``'s generator of ``stream`` in the run seeded by ``seed`` (``party``:
    the party's index, for ``role='party'`` only; ``index``: which generator of a numbered
    stream of :data:`SPECIAL_STREAMS`, 0 for the others; ``release``: an evaluation's first
    release round, see ``mechanisms.base.begin_evaluation``, so every evaluation draws fresh
    noise).

    Server: ``seed * 1_000_003 + 7919 * offset + 17`` with the stream's offset
    (:data:`STREAM_OFFSETS`); party m: that number mixed with m + 1 through splitmix64, so no two
    parties share a stream; the streams of :data:`SPECIAL_STREAMS` keep their own recipe. With
    ``release``, that seed is mixed with release + 1 the same way (release rounds are unique
    across epochs, stages and resumes, hence so are evaluation seeds). Derived randomness only:
    a party's private randomness (what no other party may reproduce) must never pass through
    this function.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if (role == "party") != (party is not None):
        raise ValueError(f"party must be given for role='party' only, got {party!r} for {role!r}")
    if party is not None and (isinstance(party, bool) or not isinstance(party, int) or party < 0):
        raise ValueError(f"party must be an integer >= 0, got {party!r}")
    if release is not None:
        if isinstance(release, bool) or not isinstance(release, int) or release < 0:
            raise ValueError(f"release must be an integer >= 0, got {release!r}")
        stream_seed = derive_seed(seed, role, stream, party, index)
        return splitmix64_int(splitmix64_int(stream_seed) ^ splitmix64_int(release + 1)) & (
            2**63 - 1
        )
    special = SPECIAL_STREAMS.get((role, stream))
    if special is not None:
        return int(seed) * special[0] + special[1] + int(index)
    if index:
        raise ValueError(f"index is for the numbered streams only, got {index!r} for {stream!r}")
    if role in ("simulation", "adversary"):
        allowed = sorted(s for r, s in SPECIAL_STREAMS if r == role)
        raise ValueError(f"role={role!r} draws only the streams {allowed}, got {stream!r}")
    base = int(seed) * 1_000_003 + 7919 * STREAM_OFFSETS.get(stream, 3) + 17
    if role == "server":
        return base
    mixed = splitmix64_int(splitmix64_int(base) ^ splitmix64_int(party + 1))
    return mixed & (2**63 - 1)


def seeded_generator(
    seed: int,
    role: str,
    stream: str,
    party: int | None = None,
    device: torch.device | str = "cpu",
    release: int | None = None,
) -> torch.Generator:
    """A torch generator on ``device`` seeded with :func:`derive_seed`."""
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(seed, role, stream, party, release=release))
    return generator
